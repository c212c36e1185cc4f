// UTF-8 helpers for the tokenizer: decoding with the Unicode "maximal subpart" replacement rule
// (what Rust's String::from_utf8_lossy and Python's bytes.decode("utf-8", "replace") do), a
// streaming form of it for the detokenizer, and the few Unicode character predicates that HF
// tokenizers takes from Rust's char methods and regex classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace m3::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

inline constexpr char32_t kInvalidCp = 0xFFFFFFFF;

// Decodes the sequence starting at s[0] (n > 0 bytes available). Returns the bytes consumed.
// Valid: *cp is the code point. Invalid: *cp = kInvalidCp and the return value is the length of
// the maximal subpart (>= 1) to replace by one U+FFFD. If the input ends inside a sequence that
// is valid so far, *incomplete is set (the return value is then n and *cp is kInvalidCp).
size_t utf8_decode(const unsigned char* s, size_t n, char32_t* cp, bool* incomplete);

// Fast decode of one code point from valid UTF-8 (no checks). Returns its length.
inline size_t utf8_decode_valid(const char* p, char32_t* cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(p);
  if (s[0] < 0x80) { *cp = s[0]; return 1; }
  if (s[0] < 0xE0) { *cp = ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu); return 2; }
  if (s[0] < 0xF0) {
    *cp = ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return 3;
  }
  *cp = ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
  return 4;
}

// Length of the UTF-8 sequence that starts with lead byte b (valid input only).
inline size_t utf8_len_from_lead(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void utf8_append(std::string& out, char32_t cp);

bool utf8_is_valid(std::string_view s);

// Replaces every maximal invalid subpart by U+FFFD (returns s unchanged when valid).
std::string utf8_sanitize(std::string_view s);

// Streaming lossy decoder: pieces pushed in any split produce, concatenated, exactly
// utf8_sanitize(all bytes). Holds back at most 3 bytes of an incomplete sequence.
class Utf8LossyStream {
 public:
  void push(std::string_view bytes, std::string& out);
  void finish(std::string& out);  // an incomplete tail becomes one U+FFFD
  bool has_pending() const { return n_pending_ != 0; }

 private:
  unsigned char pending_[4] = {0, 0, 0, 0};
  size_t n_pending_ = 0;
};

// Character predicates, as used by HF tokenizers (Rust semantics).
bool is_white_space(char32_t c);   // Unicode White_Space (Rust char::is_whitespace, regex \s)
bool is_numeric(char32_t c);       // Rust char::is_numeric: Nd, Nl, No
bool is_punctuation(char32_t c);   // ASCII punctuation or Unicode P*
bool is_word_char(char32_t c);     // Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control
bool is_mark(char32_t c);          // M*

// Appends the full lowercase mapping of c (Rust char::to_lowercase, no context).
void append_lowercase(std::string& out, char32_t c);

}  // namespace m3::tok

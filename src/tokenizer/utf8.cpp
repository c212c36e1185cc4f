#include <algorithm>
#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace m3::tok {

size_t utf8_decode(const unsigned char* s, size_t n, char32_t* cp, bool* incomplete) {
  *incomplete = false;
  const unsigned char b0 = s[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  char32_t value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    value = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    value = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *cp = kInvalidCp;
    return 1;
  }
  size_t i = 1;
  for (; i <= need; ++i) {
    if (i >= n) {
      *incomplete = true;
      *cp = kInvalidCp;
      return n;
    }
    const unsigned char b = s[i];
    const unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *cp = kInvalidCp;
      return i;  // the maximal subpart ends before the offending byte
    }
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return need + 1;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    bool incomplete;
    size_t len = utf8_decode(p + i, n - i, &cp, &incomplete);
    if (cp == kInvalidCp) return false;
    i += len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  Utf8LossyStream stream;
  stream.push(s, out);
  stream.finish(out);
  return out;
}

void Utf8LossyStream::push(std::string_view bytes, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  // First complete (or resolve) a sequence left over from the previous push.
  while (n_pending_ != 0 && i < n) {
    pending_[n_pending_++] = p[i++];
    char32_t cp;
    bool incomplete;
    size_t len = utf8_decode(pending_, n_pending_, &cp, &incomplete);
    if (incomplete) continue;
    if (cp == kInvalidCp) {
      out.append(kReplacementUtf8);
    } else {
      utf8_append(out, cp);
    }
    // Bytes of pending_ after the consumed subpart are re-read as fresh input; they all came
    // from this push except possibly none, so step i back over them.
    size_t unread = n_pending_ - len;
    i -= unread;
    n_pending_ = 0;
  }
  size_t run_start = i;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    bool incomplete;
    size_t len = utf8_decode(p + i, n - i, &cp, &incomplete);
    if (incomplete) {
      out.append(bytes.data() + run_start, i - run_start);
      for (size_t k = i; k < n; ++k) pending_[n_pending_++] = p[k];
      return;
    }
    if (cp == kInvalidCp) {
      out.append(bytes.data() + run_start, i - run_start);
      out.append(kReplacementUtf8);
      i += len;
      run_start = i;
      continue;
    }
    i += len;
  }
  out.append(bytes.data() + run_start, i - run_start);
}

void Utf8LossyStream::finish(std::string& out) {
  if (n_pending_ != 0) out.append(kReplacementUtf8);
  n_pending_ = 0;
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

// Punctuation as HF tokenizers' Punctuation pre-tokenizer sees it: ASCII punctuation, or Unicode
// category P* as of Unicode 9.0 (its Rust crate's tables are that old; U+061D, Po since Unicode 14,
// is not punctuation there, see tests/fixtures/tokenizer/golden). utf8proc knows Unicode 15, so
// the later additions are excluded explicitly.
bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  if (cat < UTF8PROC_CATEGORY_PC || cat > UTF8PROC_CATEGORY_PO) return false;
  static constexpr char32_t kAfterUnicode9[] = {
#include "tokenizer/punctuation_after_unicode9.inc"
  };
  return !std::binary_search(std::begin(kAfterUnicode9), std::end(kAfterUnicode9), c);
}

bool is_mark(char32_t c) {
  if (c < 0x300) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic code points that are symbols, not marks (circled and squared Latin letters).
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
      (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189)) {
    return true;
  }
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  if (c == 0x130) {  // the only unconditional multi-character lowercase mapping
    out.append("i\xCC\x87");
    return;
  }
  utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace m3::tok

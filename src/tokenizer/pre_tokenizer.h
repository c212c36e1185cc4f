// Pre-tokenizers from tokenizer.json ("pre_tokenizer"): Split (regex or string, every behaviour,
// invert), ByteLevel (add_prefix_space, use_regex), Digits, Metaspace (prepend_scheme, split),
// Punctuation, Whitespace, WhitespaceSplit, CharDelimiterSplit, Sequence. Semantics follow HF
// tokenizers' NormalizedString::split and PreTokenizedString::split: pieces that come out empty
// are dropped.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace m3::tok {

// A piece of normalized text on its way to the model. `at_origin`: the piece starts at offset 0
// of the original input (Metaspace's prepend_scheme "first" needs it).
struct Piece {
  std::string_view text;
  bool at_origin = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One segment of a split: [start, end) and whether it is a match of the pattern.
struct Segment {
  size_t start, end;
  bool is_match;
};

// Applies `behavior` to a full cover of `in.text` by segments (HF's NormalizedString::split).
void split_segments(Piece in, const std::vector<Segment>& segments, SplitBehavior behavior,
                    std::vector<Piece>& out);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits a non-empty piece. Transformed text (Metaspace, ByteLevel) lives in `arena`, whose
  // elements keep their address.
  virtual void split(Piece in, std::vector<Piece>& out, std::deque<std::string>& arena) const = 0;
};

// The pre-tokenizer pipeline. When the last step is ByteLevel, its byte-to-character mapping is
// left to the model (`byte_level_tail`): the pieces stay raw bytes, which saves a copy per piece.
struct PreTokenizerChain {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  bool byte_level_tail = false;

  void run(std::vector<Piece>& pieces, std::deque<std::string>& arena) const;
};

Result<PreTokenizerChain> make_pre_tokenizer_chain(const nlohmann::json& j);

// GPT-2 byte-to-unicode table: byte b is written as the code point byte_char(b).
char32_t byte_char(unsigned char b);
// Inverse; -1 when c is not in the table.
int char_byte(char32_t c);

}  // namespace m3::tok

// Decoders from tokenizer.json ("decoder"): ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
// Replace, Sequence; no decoder joins tokens with " " (as HF).
//
// decode() is implemented as a stream (DecodeStream): tokens go in one at a time and text comes
// out as soon as it is final, so the pieces of a stream concatenate to exactly the full decode
// and every piece is valid UTF-8. Steps before the first "fusing" step (Fuse or ByteLevel) work
// per token (ByteFallback groups runs of <0xHH> tokens, Metaspace knows the first token); after
// it, the steps see one growing string, which Strip, Metaspace, Fuse and literal Replace handle
// incrementally; any other step there makes the stream hold everything until finish().
// apply_batch() is a direct transcription of HF's decode_chain, used as the reference in tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace m3::tok {

struct DecoderStep {
  enum class Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace };
  Kind kind;
  std::string rep;             // Metaspace replacement (UTF-8)
  char32_t rep_cp = 0;         // Metaspace replacement code point
  bool prepend = true;         // Metaspace: prepend_scheme != never
  char32_t strip_content = ' ';
  size_t strip_start = 0, strip_stop = 0;
  std::shared_ptr<Regex> re;   // Replace
  std::string literal;         // Replace with a {"String": ...} pattern
  bool is_literal = false;
  std::string content;         // Replace
};

class DecoderSpec {
 public:
  static Result<DecoderSpec> from_json(const nlohmann::json& j);  // null: no decoder

  bool none() const { return none_; }
  const std::vector<DecoderStep>& steps() const { return steps_; }
  size_t fuse_index() const { return fuse_; }  // steps_.size() when no step fuses
  bool streamable() const { return streamable_; }

  // HF's decoder.decode(tokens), step by step on whole lists (reference implementation).
  std::string apply_batch(std::vector<std::string> tokens) const;

 private:
  std::vector<DecoderStep> steps_;
  size_t fuse_ = 0;
  bool none_ = true;
  bool streamable_ = true;
};

class DecodeStream {
 public:
  explicit DecodeStream(const DecoderSpec* spec);
  // Feeds one token string; appends the text that became final.
  void push(std::string_view token, std::string& out);
  // Ends the stream; appends everything still held back.
  void finish(std::string& out);

 private:
  void feed_token(size_t k, std::string_view tok, std::string& out);
  void flush_token_step(size_t k, std::string& out);
  void feed_text(size_t k, std::string_view text, std::string& out);
  void finish_text(size_t k, std::string& out);

  const DecoderSpec* spec_;
  bool first_token_ = true;                 // no decoder: " " between tokens
  std::vector<uint64_t> count_;             // per step: tokens received (token phase)
  std::vector<std::string> bytes_;          // per ByteFallback step: pending bytes
  Utf8LossyStream lossy_;                   // ByteLevel fusing step
  std::vector<size_t> strip_seen_;          // per Strip step (text phase): leading chars done
  std::vector<bool> strip_started_;
  std::vector<std::string> held_;           // per text step: held-back text
  std::vector<std::string> buffered_;       // non-streamable spec: all tokens until finish
};

}  // namespace m3::tok

// Tokenizer: loads a Hugging Face tokenizer.json (+ tokenizer_config.json) and encodes/decodes
// exactly like HF tokenizers (Rust) does for BPE models (byte-level and sentencepiece-style with
// byte_fallback). See docs in src/tokenizer/README.md for the supported components.
//
// Invalid UTF-8 input: encode() first replaces every maximal invalid subpart by U+FFFD (the
// Unicode-recommended practice, same as Python's bytes.decode("utf-8", "replace")), then encodes
// the result. It never fails and never crashes.
//
// All const methods are thread-safe (per-thread caches). Copies share the immutable state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace m3 {

namespace tok {
struct TokenizerImpl;
class DecodeStream;
}  // namespace tok

// The parts of tokenizer_config.json that the server uses. Ids are -1 when the token is unset or
// unknown to the tokenizer.
struct TokenizerConfig {
  std::string bos_token, eos_token, pad_token, unk_token;
  int32_t bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
  std::optional<bool> add_bos_token, add_eos_token;  // informational: encode follows the
                                                     // post_processor of tokenizer.json
  std::string chat_template;                         // "" when absent (or a named list)
};

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json (required) and model_dir/tokenizer_config.json (optional).
  static Result<Tokenizer> load(const std::string& model_dir);
  // From the file contents; config_json may be empty. `source` names the input in errors.
  static Result<Tokenizer> from_strings(std::string_view tokenizer_json,
                                        std::string_view config_json = {},
                                        const std::string& source = "tokenizer.json");

  // Ids of `text`; with add_special_tokens the post_processor's tokens (BOS/EOS) are added.
  // Added tokens (special or not) in the text are always matched.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Text of `ids`; unknown ids are skipped (as HF). skip_special_tokens drops special tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's string (vocab spelling), "" for an unknown id.
  std::string id_to_token(int32_t id) const;
  // Largest id + 1, over the model vocab and the added tokens (rows of the embedding).
  size_t vocab_size() const;
  bool is_special(int32_t id) const;
  const TokenizerConfig& config() const;

  // Internal: decode the reference way (HF's decode_chain on the whole list); tests use it.
  std::string decode_reference(std::span<const int32_t> ids, bool skip_special_tokens) const;

 private:
  friend class IncrementalDetokenizer;
  std::shared_ptr<const tok::TokenizerImpl> impl_;
};

// Streaming detokenizer: feed generated ids one by one; each call returns the text that became
// final (possibly ""). Every returned piece is valid UTF-8, and the pieces followed by flush()
// concatenate to exactly tokenizer.decode(all ids, skip_special_tokens).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  ~IncrementalDetokenizer();
  IncrementalDetokenizer(IncrementalDetokenizer&&) noexcept;
  IncrementalDetokenizer& operator=(IncrementalDetokenizer&&) noexcept;

  std::string feed(int32_t id);
  std::string feed(std::span<const int32_t> ids);
  // Ends the stream: returns what was held back (an incomplete UTF-8 tail becomes U+FFFD, as in
  // the full decode). The detokenizer can be fed again afterwards as a new stream.
  std::string flush();

 private:
  std::shared_ptr<const tok::TokenizerImpl> impl_;
  bool skip_special_;
  std::unique_ptr<tok::DecodeStream> stream_;
};

}  // namespace m3

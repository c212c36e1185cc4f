// OpenAI logprobs objects from the backend's per-token logprobs.
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
//                "bytes"}]}]}
//   completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
// A token's string is the decoded text of that single token (special tokens kept, an incomplete
// UTF-8 piece becomes U+FFFD), `bytes` its UTF-8 bytes. The numbers are the backend's raw
// logprobs (see SamplingOptions::logprobs), -inf clamped to -9999 as vLLM does so the JSON stays
// numeric.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/backend.h"
#include "server/model_frontend.h"

namespace m3::server {

class LogprobsBuilder {
 public:
  // `text_offset` is where the completion's text starts in the returned text (the echoed
  // prompt's length), in characters as Python counts them (vLLM).
  LogprobsBuilder(const TextCodec* codec, bool chat, int64_t text_offset = 0);

  // Adds one entry per token; `logprobs` is parallel to `tokens` (missing entries: logprob 0).
  void add(const std::vector<int32_t>& tokens, const std::vector<TokenLogprobs>& logprobs);
  bool has_pending() const { return pending_ > 0; }
  // The entries added since the last take() as a "logprobs" value; null when there are none,
  // unless `even_if_empty` (a whole response's logprobs object, with empty lists).
  nlohmann::ordered_json take(bool even_if_empty = false);

 private:
  const std::string& token_text(int32_t token);
  nlohmann::ordered_json bytes_of(const std::string& s) const;

  const TextCodec* codec_;
  bool chat_;
  int64_t offset_;
  size_t pending_ = 0;
  nlohmann::ordered_json content_;                                               // chat entries
  nlohmann::ordered_json tokens_, token_logprobs_, top_logprobs_, text_offset_;  // completions
  std::unordered_map<int32_t, std::string> cache_;
};

// Length of a UTF-8 string in code points (Python's len()).
int64_t utf8_length(const std::string& s);

}  // namespace m3::server

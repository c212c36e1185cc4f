// A byte-level tokenizer with MiniMax-M3's special tokens, for tests and --fake-backend: ids
// 0..255 are bytes, 256.. are the special strings below (each one token, as in the real vocab).
// Byte-level ids split UTF-8 characters across tokens, which exercises UTF-8-safe streaming.
#pragma once

#include "server/model_frontend.h"

namespace m3::server {

class FakeCodec : public TextCodec {
 public:
  static constexpr int32_t kBos = 256;  // ]~!b[
  static constexpr int32_t kEos = 258;  // [e~[
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  Result<std::string> decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> token_id(std::string_view token) const override;
  // The text of one token (its bytes).
  static std::string piece(int32_t id);
};

}  // namespace m3::server

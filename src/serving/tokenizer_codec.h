// TextCodec (server/model_frontend.h) over the model's Tokenizer.
#pragma once

#include <memory>

#include "server/model_frontend.h"

namespace m3 {
class Tokenizer;
}

namespace m3::serving {

class TokenizerCodec final : public server::TextCodec {
 public:
  explicit TokenizerCodec(std::shared_ptr<const Tokenizer> tokenizer);

  // The rendered chat template writes BOS itself, so the post-processor's special tokens are NOT
  // added; special-token strings in the text still become their ids.
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  Result<std::string> decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> token_id(std::string_view token) const override;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace m3::serving

#include "serving/tokenizer_codec.h"

#include "tokenizer/tokenizer.h"

namespace m3::serving {

TokenizerCodec::TokenizerCodec(std::shared_ptr<const Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)) {}

Result<std::vector<int32_t>> TokenizerCodec::encode(std::string_view text) const {
  return tokenizer_->encode(text, /*add_special_tokens=*/false);
}

Result<std::string> TokenizerCodec::decode(const std::vector<int32_t>& ids,
                                           bool skip_special_tokens) const {
  return tokenizer_->decode(ids, skip_special_tokens);
}

int32_t TokenizerCodec::vocab_size() const {
  return static_cast<int32_t>(tokenizer_->vocab_size());
}

std::optional<int32_t> TokenizerCodec::token_id(std::string_view token) const {
  return tokenizer_->token_to_id(token);
}

}  // namespace m3::serving

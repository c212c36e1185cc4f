#include "serving/engine_detokenizer.h"

#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace m3::serving {

namespace {

// The engine's TextDetokenizer over the tokenizer's streaming detokenizer.
class StreamDetokenizer final : public m3::TextDetokenizer {
 public:
  StreamDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
      : tokenizer_(std::move(tokenizer)), detok_(*tokenizer_, skip_special_tokens) {}
  std::string push(int32_t token) override { return detok_.feed(token); }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;  // keeps the tokenizer alive for detok_
  IncrementalDetokenizer detok_;
};

}  // namespace

DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](
             const GenerateRequest& request) -> std::unique_ptr<m3::TextDetokenizer> {
    return std::make_unique<StreamDetokenizer>(tokenizer, request.skip_special_tokens);
  };
}

Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir) {
  M3_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(model_dir));
  return std::shared_ptr<const Tokenizer>(std::make_shared<const Tokenizer>(std::move(tok)));
}

}  // namespace m3::serving

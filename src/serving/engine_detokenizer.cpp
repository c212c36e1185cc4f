#include "serving/engine_detokenizer.h"

#include "engine/request.h"
#include "tokenizer/tokenizer.h"

namespace m3::serving {

namespace {

// The engine's TextDetokenizer over the tokenizer's streaming detokenizer (shared with
// DetokenizerTails, which flushes it at the end of the request).
class StreamDetokenizer final : public m3::TextDetokenizer {
 public:
  StreamDetokenizer(std::shared_ptr<const Tokenizer> tokenizer,
                    std::shared_ptr<IncrementalDetokenizer> detok)
      : tokenizer_(std::move(tokenizer)), detok_(std::move(detok)) {}
  std::string push(int32_t token) override { return detok_->feed(token); }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;  // keeps the tokenizer alive for detok_
  std::shared_ptr<IncrementalDetokenizer> detok_;
};

}  // namespace

void DetokenizerTails::add(const std::string& tag, std::shared_ptr<IncrementalDetokenizer> detok) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[tag] = std::move(detok);
}

std::string DetokenizerTails::flush(const std::string& tag) {
  std::shared_ptr<IncrementalDetokenizer> detok;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(tag);
    if (it == live_.end()) return {};
    detok = std::move(it->second);
    live_.erase(it);
  }
  return detok->flush();
}

void DetokenizerTails::drop(const std::string& tag) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(tag);
}

size_t DetokenizerTails::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer,
                                            std::shared_ptr<DetokenizerTails> tails) {
  return [tokenizer = std::move(tokenizer), tails = std::move(tails)](
             const GenerateRequest& request) -> std::unique_ptr<m3::TextDetokenizer> {
    auto detok = std::make_shared<IncrementalDetokenizer>(*tokenizer, request.skip_special_tokens);
    if (tails) tails->add(request.tag, detok);
    return std::make_unique<StreamDetokenizer>(tokenizer, std::move(detok));
  };
}

Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir) {
  M3_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(model_dir));
  return std::shared_ptr<const Tokenizer>(std::make_shared<const Tokenizer>(std::move(tok)));
}

}  // namespace m3::serving

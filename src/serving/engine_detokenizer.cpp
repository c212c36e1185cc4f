#include "serving/engine_detokenizer.h"

#include "engine/request.h"
#include "serving/text_stream.h"

namespace m3::serving {

namespace {

// The engine's IncrementalDetokenizer interface (this file must not include tokenizer.h).
class StreamDetokenizer final : public m3::IncrementalDetokenizer {
 public:
  StreamDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
      : tokenizer_(std::move(tokenizer)), stream_(*tokenizer_, skip_special_tokens) {}
  std::string push(int32_t token) override { return stream_.feed(token); }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;  // keeps the tokenizer alive for the stream
  TextStream stream_;
};

}  // namespace

DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer) {
  return [tokenizer = std::move(tokenizer)](
             const GenerateRequest& request) -> std::unique_ptr<m3::IncrementalDetokenizer> {
    return std::make_unique<StreamDetokenizer>(tokenizer, request.skip_special_tokens);
  };
}

}  // namespace m3::serving

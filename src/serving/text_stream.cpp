#include "serving/text_stream.h"

#include "tokenizer/tokenizer.h"

namespace m3::serving {

struct TextStream::Impl {
  m3::IncrementalDetokenizer detok;  // the tokenizer's class (see the header)
};

TextStream::TextStream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : impl_(std::make_unique<Impl>(
          Impl{m3::IncrementalDetokenizer(tokenizer, skip_special_tokens)})) {}

TextStream::~TextStream() = default;

std::string TextStream::feed(int32_t id) {
  return impl_->detok.feed(id);
}

Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir) {
  M3_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(model_dir));
  return std::shared_ptr<const Tokenizer>(std::make_shared<const Tokenizer>(std::move(tok)));
}

}  // namespace m3::serving

// A tokenizer's streaming detokenizer behind a name of our own. Two different classes are called
// m3::IncrementalDetokenizer (the engine's interface in engine/detokenizer.h and the tokenizer's
// implementation in tokenizer/tokenizer.h), so no translation unit may include both headers; this
// wrapper is the only place that sees the tokenizer's class.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace m3 {
class Tokenizer;
}

namespace m3::serving {

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer& tokenizer, bool skip_special_tokens);
  ~TextStream();
  TextStream(const TextStream&) = delete;
  TextStream& operator=(const TextStream&) = delete;

  // Text that became final with `id` (valid UTF-8; may be empty).
  std::string feed(int32_t id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Tokenizer::load behind a forward declaration (for files that include engine headers).
Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir);

}  // namespace m3::serving

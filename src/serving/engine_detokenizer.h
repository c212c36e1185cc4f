// The engine's DetokenizerFactory over the model's tokenizer: one streaming detokenizer per
// sequence, with skip_special_tokens as the server asked (false when the reasoning / tool-call
// parsers need the special markers in the text).
//
// End of a request: the tokenizer's streaming detokenizer holds back an incomplete UTF-8 tail
// (byte-level BPE pieces of one character split over tokens) until the next token completes it.
// The engine's TextDetokenizer has no end-of-stream call, so when generation ends mid-character
// that tail would be dropped. DetokenizerTails keeps each request's detokenizer (under the
// request's tag) so EngineBackend can flush it on the request's last event: the tail becomes
// U+FFFD, as HF's decode(errors="replace") and the full Tokenizer::decode render it. (The
// flushed tail is not matched against stop strings; it only ever is a U+FFFD.)
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/status.h"
#include "engine/detokenizer.h"

namespace m3 {
class Tokenizer;
class IncrementalDetokenizer;
}  // namespace m3

namespace m3::serving {

class DetokenizerTails {
 public:
  // Thread-safe. A tag registered twice keeps the later detokenizer.
  void add(const std::string& tag, std::shared_ptr<IncrementalDetokenizer> detok);
  // Unregisters the tag and returns what its detokenizer still held, as text ("" if nothing or
  // an unknown tag). Call after the request's last token was pushed.
  std::string flush(const std::string& tag);
  // Unregisters the tag without flushing (the request was refused).
  void drop(const std::string& tag);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<IncrementalDetokenizer>> live_;
};

// With `tails`, each detokenizer is registered there under the request's tag (which must then
// be unique among live requests: EngineBackend makes it so).
DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer,
                                            std::shared_ptr<DetokenizerTails> tails = nullptr);

// Tokenizer::load into a shared pointer (the factory and the codec share one tokenizer).
Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir);

}  // namespace m3::serving

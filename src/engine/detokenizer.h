// Incremental detokenization as the engine needs it: stop strings are matched by the engine, on
// the generated text, so generation stops within the step that completes a stop string and the
// stop string never reaches the client (the alternative, matching on the server, lets the engine
// run on after the match and leaves completion_tokens wrong). The server supplies the tokenizer
// through this interface; the engine then also emits the text (UTF-8 complete, stop-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace m3 {

struct GenerateRequest;

class TextDetokenizer {
 public:
  virtual ~TextDetokenizer() = default;
  // The bytes that `token` appends to the output text, given every token pushed before. May be
  // empty (a skipped special token) and may end inside a UTF-8 character (byte-level BPE); the
  // engine holds incomplete characters back until they complete.
  virtual std::string push(int32_t token) = 0;
};

// Makes one detokenizer per sequence (it sees the request for the prompt and
// skip_special_tokens). Called on the thread that calls Engine::submit().
using DetokenizerFactory =
    std::function<std::unique_ptr<TextDetokenizer>(const GenerateRequest& request)>;

}  // namespace m3

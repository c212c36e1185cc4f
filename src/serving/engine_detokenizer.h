// The engine's DetokenizerFactory over the model's tokenizer: one streaming detokenizer per
// sequence, with skip_special_tokens as the server asked (false when the reasoning / tool-call
// parsers need the special markers in the text).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "engine/detokenizer.h"

namespace m3 {
class Tokenizer;
}

namespace m3::serving {

DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer);

// Tokenizer::load into a shared pointer (the factory and the codec share one tokenizer).
Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& model_dir);

}  // namespace m3::serving

// The engine's DetokenizerFactory over the model's tokenizer: one TextStream per sequence, with
// skip_special_tokens as the server asked (false when the reasoning / tool-call parsers need the
// special markers in the text).
#pragma once

#include <memory>

#include "engine/detokenizer.h"

namespace m3 {
class Tokenizer;
}

namespace m3::serving {

DetokenizerFactory make_detokenizer_factory(std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace m3::serving

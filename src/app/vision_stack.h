// Image input for a served model: when config.json has a vision_config and the checkpoint holds
// the vision tower's weights, loads the tower (on GPU 0 beside a model on --device cuda, else on
// the CPU in float32) and lets the backend take images.
// Otherwise images keep getting 400 vision_not_available, and the startup report says why.
#pragma once

#include <string>
#include <vector>

#include "app/engine_stack.h"
#include "core/status.h"

namespace m3::app {

// Errors only for a broken checkpoint (a vision_config that does not parse, vision weights of
// the wrong shape, a merge MLP that does not end in the text model's hidden size).
Status attach_vision(const std::string& model_path, const EngineStackOptions& options,
                     serving::EngineBackend& backend, const serving::TokenizerCodec& codec,
                     std::vector<std::string>& report);

}  // namespace m3::app

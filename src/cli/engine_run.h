// What the model commands (generate, score) share to drive the engine `serve` runs: the engine
// options from their flags, and one request stepped to its end on the calling thread.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/model_command.h"
#include "core/status.h"
#include "engine/engine.h"
#include "app/engine_stack.h"

namespace m3::cli {

// --device, --threads, --prefill-chunk, --load-format and --num-layers as engine options; the
// device factories of this binary (CUDA when built in).
app::EngineStackOptions engine_options(const ModelCommandFlags& flags);

struct EngineRun {
  std::vector<int32_t> tokens;       // generated, an EOS or stop token included
  std::vector<float> prompt_logits;  // with GenerateRequest::prompt_logits
};

// Submits `request` to an engine whose thread was not started and steps it (Engine::step) until
// the request is done: its tokens, or the request's error.
Result<EngineRun> run_request(Engine& engine, GenerateRequest request);

}  // namespace m3::cli

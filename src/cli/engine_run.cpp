#include "cli/engine_run.h"

#include "app/devices.h"

namespace m3::cli {

app::EngineStackOptions engine_options(const ModelCommandFlags& flags) {
  app::EngineStackOptions o;
  o.device = flags.device;
  o.make_backend = app::make_backend;
  o.make_cuda_runner = app::make_cuda_model_runner;
  o.dummy_weights = flags.load_format == "dummy";
  o.num_layers = flags.num_layers;
  o.num_threads = static_cast<int32_t>(flags.threads);
  o.tensor_parallel = static_cast<int32_t>(flags.tp);
  o.expert_parallel = static_cast<int32_t>(flags.ep);
  o.enable_expert_parallel = flags.enable_expert_parallel;
  o.chunked_prefill_size = static_cast<int32_t>(flags.prefill_chunk);  // 0: the whole prompt
  o.enable_prefix_cache = false;  // one request: nothing to share
  o.default_kv_cache_bytes = 0;   // exactly one request of the context length
  o.max_running_requests = 1;
  return o;
}

Result<EngineRun> run_request(Engine& engine, GenerateRequest request) {
  M3_ASSIGN_OR_RETURN(RequestHandle handle, engine.submit(std::move(request)));
  EngineRun run;
  Status error;
  bool done = false;
  while (!done) {
    const bool stepped = engine.step();
    while (auto ev = handle.stream().try_next()) {
      for (const SeqDelta& d : ev->seqs) {
        for (const GeneratedToken& g : d.tokens) run.tokens.push_back(g.token);
      }
      if (!ev->prompt_logits.empty()) run.prompt_logits = std::move(ev->prompt_logits);
      if (!ev->error.is_ok()) error = ev->error;
      done = done || ev->done;
    }
    if (!done && !stepped) return internal_error("[cli] the engine went idle before the request ended");
  }
  if (!error.is_ok()) return error;
  return run;
}

}  // namespace m3::cli

// `m3serve serve`: SGLang's flag names where they exist; unknown flags are an error naming the
// closest known flag.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/backend.h"
#include "server/deferred_model.h"
#include "server/model_frontend.h"
#include "server/server_options.h"

namespace m3::server {

struct ServeFlags {
  ServerOptions server;
  // Engine flags (passed to the engine when it is wired in; validated here).
  std::string model_path;  // empty: the bundled models/m3-tiny
  std::string load_format = "auto";
  int32_t chunked_prefill_size = 8192;
  int32_t max_running_requests = 0;
  int32_t max_queued_requests = 4096;
  int64_t kv_cache_bytes = 0;  // CPU KV pool; 0: the serving default (512 MiB)
  double mem_fraction_static = 0.0;
  int32_t tp = 1;
  std::string speculative_algorithm;
  bool enable_hierarchical_cache = false;
  double hicache_size_gb = 0;
  std::string device = "auto";
  // Hidden: serve a scripted fake backend (tests, demos).
  bool fake_backend = false;
  int32_t fake_tokens_per_step = 1;
  int32_t fake_step_ms = 2;
  int32_t fake_ready_after_ms = 0;
  int32_t fake_load_ms = 0;  // the fake "checkpoint load" time (the deferred-model path)
  int32_t fake_max_running = 256;
  bool help = false;
};

Result<ServeFlags> parse_serve_flags(const std::vector<std::string>& args);
std::string serve_help();
// Edit distance, for "did you mean" hints.
size_t edit_distance(const std::string& a, const std::string& b);

// The real model behind `serve` (ModelStack: backend, tokenizer, chat template; defined in
// deferred_model.h). src/serving builds it and src/cli passes the factory in, so the server layer
// stays free of engine headers. The factory runs on a background thread while the server already
// listens and answers /health with 503.
using ModelStackFactory = std::function<Result<ModelStack>(const ServeFlags& flags)>;

// The whole command: parse, listen, load the model (`make_model`, or the scripted fake backend
// with --fake-backend), serve until SIGTERM, drain. A load failure exits with status 1.
int run_serve_command(const std::vector<std::string>& args,
                      const ModelStackFactory& make_model = {});

}  // namespace m3::server

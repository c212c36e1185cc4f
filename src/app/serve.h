// `m3serve serve`, composed: the HTTP server (src/server) in front of the model the config names
// (the engine over a checkpoint, app/engine_stack.h, or the scripted fake backend), listening
// before the model has loaded, serving until SIGTERM, then draining.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/fake/fake_flags.h"
#include "server/server_options.h"

namespace m3::app {

// Everything `serve` is configured with (from the flags, serve_flags.h).
struct ServeConfig {
  server::ServerOptions server;
  std::string model_path;  // empty: the bundled models/m3-tiny; a directory or ORG/NAME
  std::string revision;    // with a repo id: commit, prefix or ref (hf_cache.h)
  std::string load_format = "auto";
  int32_t chunked_prefill_size = 8192;
  int32_t chunked_prefill_size_while_decoding = 0;  // 0: as chunked_prefill_size
  int32_t max_running_requests = 0;
  int32_t max_queued_requests = 4096;
  int64_t kv_cache_bytes = 0;  // KV pool; 0: the default (512 MiB)
  double mem_fraction_static = 0.0;
  int32_t tp = 1;
  int32_t dp = 1;
  int32_t ep = 1;
  bool enable_dp_attention = false;
  std::string load_balance_method = "round_robin";  // --load-balance-method (validated)
  bool enable_expert_parallel = false;
  bool disable_custom_all_reduce = false;  // GPU ranks: NCCL for every all-reduce
  // --cuda-graph-max-bs (-decode): rows of a decode step on the real-shape kernels' decode path
  // (captured as CUDA graphs); 0: the default.
  int32_t cuda_graph_max_bs = 0;
  std::string cuda_graph_max_bs_flag;  // the spelling given, for the startup note
  // --nnodes, --node-rank, --dist-init-addr, --dist-timeout (app/multi_node.h).
  int32_t nnodes = 1;
  int32_t node_rank = 0;
  std::string dist_init_addr;
  int32_t dist_timeout_s = 300;
  std::string kv_cache_dtype = "auto";
  // Speculative decoding (docs/dspark.md): --speculative-algorithm (DSPARK), the draft's
  // directory (empty: <model>/dspark), tokens per verify (0: the draft's block size + 1), block
  // verification, and the benchmark-only forced acceptance length (0: off).
  std::string speculative_algorithm;
  std::string speculative_draft_model_path;
  std::string speculative_draft_load_format = "auto";  // auto | dummy
  int32_t speculative_num_draft_tokens = 0;
  bool speculative_block_verification = false;
  int32_t speculative_simulate_accept_length = 0;
  // HiCache (docs/kv-cache.md): the host tier's size in GB (0: --hicache-ratio times the device
  // pool), its write policy, and the optional disk tier (backend "file" with a directory).
  bool enable_hierarchical_cache = false;
  double hicache_size_gb = 0;
  double hicache_ratio = 2.0;
  bool hicache_ratio_set = false;
  std::string hicache_write_policy = "write_through";
  bool hicache_write_policy_set = false;
  std::string hicache_storage_backend;
  std::string hicache_storage_dir;
  std::string device = "auto";
  server::FakeServeOptions fake;  // --fake-backend and its flags (tests, demos)
  // Accepted flags that change nothing here, each with why: printed at startup.
  std::vector<std::string> notices;
};

// The bundled model: in the source tree this binary was built from, else next to the binary
// (build/bin/m3serve -> ../../models/m3-tiny).
std::string default_model_path();

// Listens, loads the model in the background (/health answers 503 until then), serves until
// SIGTERM or SIGINT, drains. Returns the process's exit status: 1 when the port cannot be bound
// or the model fails to load, else the drain's (0 when every request finished in time).
int run_serve(const ServeConfig& config);

}  // namespace m3::app

// The composition of the model commands: make_engine() loads a MiniMax-M3 model directory
// (config.json, safetensors checkpoint or dummy weights, generation_config.json) into an Engine
// over the right ModelRunner; make_engine_stack() adds the tokenizer and the chat template and
// builds what `m3serve serve` needs. `generate` and `score` drive the same Engine, so every
// command samples with one sampler and one RNG.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/kv_pool_request.h"
#include "app/multi_node.h"
#include "backend/backend.h"
#include "core/status.h"
#include "engine/engine.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "app/serve.h"
#include "serving/engine_backend.h"
#include "serving/template_renderer.h"
#include "serving/tokenizer_codec.h"

namespace m3::app {

// --mem-fraction-static on the GPU when the flag is not given (SGLang picks 0.85-0.88 on
// 80-141 GB devices), and the scheduler's default --max-running-requests.
constexpr double kDefaultGpuMemFraction = 0.85;
constexpr int32_t kDefaultMaxRunning = 256;
// The largest profile step the GPU's memory plan runs (tokens); see make_engine.
constexpr int64_t kMaxProfileTokens = 32768;
// What the measured KV pool leaves free on the device: the pool's arrays are cudaMalloc'd per
// layer (rounded up to 2 MiB each), decode graphs are captured on first use, and other
// processes' contexts may grow. 1 GiB plus 1% of the device.
constexpr int64_t kv_headroom_bytes(int64_t device_total_bytes) {
  return (int64_t{1} << 30) + device_total_bytes / 100;
}

struct EngineStackOptions {
  std::string device = "auto";          // auto (= cpu), cpu or cuda (needs make_backend)
  // Builds the model's backend for `device` ("cpu" or "cuda") with `threads` CPU threads; set
  // by the CLI, which links the CUDA backend. Null: the CPU backend.
  std::function<Result<std::unique_ptr<Backend>>(const std::string& device, int threads)>
      make_backend;
  // --device cuda, real-shape kernels (src/model/minimax_m3/cuda): builds the runner from the
  // config, the weights and the KV budget; set by the CLI when CUDA is built in. Used when the
  // config fits those kernels (check_real_shape_fit), else make_backend's float32 path (one line
  // on stderr says why).
  std::function<Result<std::unique_ptr<ModelRunner>>(const MiniMaxM3Config& cfg,
                                                     const WeightSource& weights,
                                                     const CudaKvPoolRequest& pool)>
      make_cuda_runner;
  bool dummy_weights = false;  // --load-format dummy: random weights for the directory's config
                               // (the built-in MiniMax-M3.1-Flash config when the path is empty)
  int64_t num_layers = 0;      // with dummy_weights: keep the first num_layers layers (0: all)
  int32_t context_length = 0;           // 0: max_position_embeddings
  int32_t max_running_requests = 0;     // 0: the scheduler's default (256)
  int32_t chunked_prefill_size = 8192;  // -1 or 0: no chunking (the whole prompt at once)
  // Prefill tokens per step while a sequence decodes (SchedulerConfig); 0: chunked_prefill_size.
  int32_t chunked_prefill_size_while_decoding = 0;
  int32_t max_queued_requests = 4096;
  // KV pool (app/memory_plan.h): kv_cache_bytes > 0 is taken as given; else mem_fraction_static
  // > 0 plans it from the device's memory (on the GPU also without the flag, at
  // kDefaultGpuMemFraction); else the CPU pool is default_kv_cache_bytes, or exactly one request
  // of the context length where that is 0.
  int64_t kv_cache_bytes = 0;
  int64_t default_kv_cache_bytes = int64_t{512} << 20;
  double mem_fraction_static = 0;
  // The GPU's total memory (bytes), from the CUDA runtime; set where CUDA is built in.
  std::function<Result<int64_t>()> cuda_memory_bytes;
  int32_t num_threads = 0;                      // CPU threads for the model; 0: all cores
  // --tp: tensor-parallel ranks. On the CPU, ranks of this process over Gloo, sharing
  // num_threads; on the GPU (real-shape kernels only), GPUs 0 .. tp-1 of this process over NCCL,
  // or with nodes (`nodes`) GPUs 0 .. tp/nnodes - 1 of each node's process (app/gpu_nodes.h).
  int32_t tensor_parallel = 1;
  // --ep: expert-parallel ranks among them (resolve_rank_layout); --enable-expert-parallel: all.
  int32_t expert_parallel = 1;
  bool enable_expert_parallel = false;
  // GPU ranks: the decode step's small all-reduces through the one-shot all-reduce over peer
  // memory (false: --disable-custom-all-reduce, NCCL for all).
  bool custom_all_reduce = true;
  // --cuda-graph-max-bs: the real-shape kernels' decode-path rows per step (0: their default).
  int32_t decode_max_rows = 0;
  std::string decode_max_rows_flag;  // its spelling on the command line
  // --enable-dp-attention --dp D: attention data-parallel groups over the --tp ranks (D divides
  // tp; check_dp_attention). 1: none.
  int32_t dp_attention = 1;
  LoadBalanceMethod load_balance = LoadBalanceMethod::kRoundRobin;  // --load-balance-method
  bool enable_prefix_cache = true;
  // --kv-cache-dtype (resolve_kv_cache_dtype): the KV cache's storage on the single-rank CPU path;
  // float32 is also the GPU's own default (bf16 on the real-shape kernels).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFloat32;
  // EngineConfig::on_failure: the model cannot run any more steps (serve exits non-zero).
  std::function<void(const Status&)> on_failure;
  // --nnodes and the rest: this process is node 0 of several (the others run
  // run_follower_node).
  NodeLayout nodes;
  // --speculative-algorithm DSPARK (docs/dspark.md; --tp 1 only, CPU or GPU): the
  // draft's directory (empty: <model>/dspark) and the engine's options (num_draft_tokens 0: the
  // draft's block size + 1).
  bool speculative = false;
  std::string draft_model_path;
  // --speculative-draft-load-format dummy: random draft weights (at the shape of the draft
  // directory's config.json, else the default for the target) next to real target weights.
  bool draft_dummy_weights = false;
  SpeculativeOptions speculative_options;
  // --enable-hierarchical-cache (docs/kv-cache.md; the float32 CPU path, one process): the host
  // tier holds hicache_host_bytes (--hicache-size, > 0) or hicache_ratio x the device pool's
  // pages; hicache_disk_dir non-empty adds the disk tier.
  bool hicache = false;
  int64_t hicache_host_bytes = 0;
  double hicache_ratio = 2.0;
  HiCacheWritePolicy hicache_policy = HiCacheWritePolicy::kWriteThrough;
  std::string hicache_disk_dir;
};

// The world and the expert-parallel size the flags ask for, with SGLang's meaning: the expert-
// parallel ranks are among the --tp ranks (ep divides tp). --ep N without --tp runs N ranks
// (--tp N --ep N); --enable-expert-parallel (vLLM) sets ep to tp. invalid_argument names the
// flags that do not fit together.
struct RankLayout {
  int tp = 1;
  int ep = 1;
};
Result<RankLayout> resolve_rank_layout(int tp, int ep, bool enable_expert_parallel);

// --dp D against the resolved layout, with SGLang's meaning: D > 1 needs --enable-dp-attention
// (whole data-parallel replicas of the model are not built: unimplemented, naming the flags), and
// D attention groups of tp / D ranks each must divide --tp (invalid argument naming both).
Status check_dp_attention(const RankLayout& layout, int dp, bool enable_dp_attention);

// GPU ranks (--device cuda with --tp > 1): whether the real-shape kernels take `cfg` and every
// rank's share of it under --tp / --ep / --dp (rank_config), the error naming those flags.
Status check_gpu_ranks_fit(const MiniMaxM3Config& cfg, int tp, int ep, int dp);
// The real-shape CUDA runner's request for GPU ranks, from the flags every node shares: the layout,
// --dist-timeout, --disable-custom-all-reduce, --cuda-graph-max-bs and --kv-cache-dtype, with
// `nodes` when the ranks span several nodes. The pool's sizing is the caller's.
CudaKvPoolRequest gpu_pool_request(const EngineStackOptions& options, int tp, int ep, int dp,
                                   std::shared_ptr<JoinedGpuNodes> nodes);

// A node other than node 0 (--node-rank K > 0): loads its ranks' part of the model, joins the
// group and runs the steps node 0 sends until node 0 shuts down (0) or the group breaks (1, with
// a line naming the cause). Errors before the group is joined are returned. CPU ranks here; GPU
// ranks (--device cuda, through options.make_cuda_runner) in app/gpu_nodes.h.
Result<int> run_follower_node(const std::string& model_path, const EngineStackOptions& options);

// The engine options of `m3serve serve`'s config. Unsupported values (tp > 1, speculative
// decoding) are errors naming the flag.
Result<EngineStackOptions> options_from_config(const ServeConfig& config);
// The real-shape CUDA kernels' KV storage for a resolved --kv-cache-dtype: bf16 for auto (float32,
// the float32 paths' own), else the dtype itself.
inline KvCacheDtype real_shape_kv_cache_dtype(KvCacheDtype resolved) {
  return resolved == KvCacheDtype::kFloat32 ? KvCacheDtype::kBF16 : resolved;
}
// --kv-cache-dtype and --device / the rank flags to the KV cache's storage: auto (and bf16 on the
// GPU) keep the device's own; bf16, fp8_e4m3 and fp4_e2m1 run on the single-rank CPU path and are
// refused (unimplemented, naming the flag) with --device cuda or ranks.
Result<KvCacheDtype> resolve_kv_cache_dtype(const ServeConfig& config);

// An Engine over the model of `model_path` (may be empty with dummy_weights), with no text output
// unless `detokenizer` is given. Every error names the directory and the file at fault.
struct LoadedEngine {
  std::shared_ptr<void> keepalive;  // the checkpoint the model's weights may map: declared first,
                                    // destroyed after the engine
  std::unique_ptr<Engine> engine;
  int32_t context_length = 0;
  // The startup report's lines about the model (weights, device, KV cache), without prefix.
  std::vector<std::string> report;
};
Result<LoadedEngine> make_engine(const std::string& model_path, const EngineStackOptions& options,
                                 DetokenizerFactory detokenizer = {});

struct EngineStack {
  std::unique_ptr<serving::EngineBackend> backend;
  std::unique_ptr<serving::TokenizerCodec> codec;
  std::unique_ptr<serving::TemplateRenderer> renderer;
  std::vector<std::string> report;  // LoadedEngine::report
};

// Every error names the directory and the file at fault.
Result<EngineStack> make_engine_stack(const std::string& model_path,
                                      const EngineStackOptions& options);

}  // namespace m3::app

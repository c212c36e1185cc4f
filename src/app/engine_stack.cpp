#include "app/engine_stack.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "app/devices.h"
#include "app/gpu_nodes.h"
#include "app/memory_plan.h"
#include "app/startup_report.h"
#include "app/vision_stack.h"
#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/tensor_parallel_runner.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/cuda/dspark_cuda_plan.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/vision_tower.h"
#include "sample/sampling_params.h"
#include "serving/engine_detokenizer.h"

namespace m3::app {

namespace fs = std::filesystem;

Result<RankLayout> resolve_rank_layout(int tp, int ep, bool enable_expert_parallel) {
  RankLayout l{std::max(1, tp), std::max(1, ep)};
  if (enable_expert_parallel) {
    if (l.ep != 1 && l.ep != l.tp)
      return invalid_argument("--enable-expert-parallel places the experts over all --tp " +
                              std::to_string(l.tp) + " ranks; --ep " + std::to_string(l.ep) +
                              " asks for another number (give one of the two)");
    l.ep = l.tp;
  }
  if (l.ep > 1 && l.tp == 1) l.tp = l.ep;  // --ep N alone: N ranks, attention split over them too
  if (l.tp % l.ep != 0)
    return invalid_argument("--ep " + std::to_string(l.ep) + " must divide --tp " +
                            std::to_string(l.tp) +
                            ": the expert-parallel ranks are among the tensor-parallel ranks");
  return l;
}

Status check_dp_attention(const RankLayout& layout, int dp, bool enable_dp_attention) {
  if (dp <= 1) return Status::ok();
  if (!enable_dp_attention) {
    return Status(StatusCode::kUnimplemented,
                  "--dp " + std::to_string(dp) +
                      " without --enable-dp-attention asks for whole data-parallel replicas of "
                      "the model, which are not supported; --enable-dp-attention --dp " +
                      std::to_string(dp) + " splits attention into " + std::to_string(dp) +
                      " groups of the --tp ranks");
  }
  if (layout.tp % dp != 0) {
    return invalid_argument("--dp " + std::to_string(dp) + " must divide --tp " +
                            std::to_string(layout.tp) +
                            ": each attention data-parallel group is --tp / --dp of the ranks");
  }
  return Status::ok();
}

Result<KvCacheDtype> resolve_kv_cache_dtype(const ServeConfig& f) {
  const bool cuda = f.device == "cuda";
  // auto: the device's own KV dtype, float32 on the CPU reference (its activations' dtype) and bf16
  // on the GPU kernels (the checkpoint's torch_dtype); bf16 is what the GPU stores anyway.
  if (f.kv_cache_dtype == "auto" || (cuda && f.kv_cache_dtype == "bf16")) {
    return KvCacheDtype::kFloat32;
  }
  // bf16 on the CPU, fp8_e4m3 / fp4_e2m1 anywhere: every path stores them (the real-shape
  // kernels, the float32 backends).
  return parse_kv_cache_dtype(f.kv_cache_dtype);
}

namespace {

std::string fmt_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

// The HiCache flags into options; every flag of the family without --enable-hierarchical-cache,
// and every layout the tiers cannot serve yet, is refused by name.
Status hicache_options(const ServeConfig& f, EngineStackOptions* o) {
  if (!f.enable_hierarchical_cache) {
    const char* stray = f.hicache_size_gb > 0           ? "--hicache-size"
                        : f.hicache_ratio_set           ? "--hicache-ratio"
                        : f.hicache_write_policy_set    ? "--hicache-write-policy"
                        : !f.hicache_storage_backend.empty() ? "--hicache-storage-backend"
                        : !f.hicache_storage_dir.empty()     ? "--hicache-storage-dir"
                                                             : nullptr;
    if (stray) return invalid_argument(std::string(stray) + " needs --enable-hierarchical-cache");
    return Status::ok();
  }
  auto unsupported = [](const std::string& what, const std::string& why) {
    return Status(StatusCode::kUnimplemented,
                  "--enable-hierarchical-cache with " + what + " is not supported yet: " + why);
  };
  // The GPU copier moves every rank's shard too, but it has run on one GPU only.
  if (f.device == "cuda" && (f.tp > 1 || f.ep > 1)) {
    return unsupported("--device cuda --tp/--ep",
                       "the GPU page copier over several GPUs' shards has not run on several GPUs "
                       "yet (tools/device/serve-hicache.sh with SERVE_ARGS=\"--tp 2\")");
  }
  // Over CPU ranks of this process a page is every rank's shard (PagedKvCacheCopier); attention
  // groups have a pool each and other nodes' ranks are out of reach.
  if (f.dp > 1 || f.enable_dp_attention || f.nnodes > 1) {
    return unsupported("--dp/--enable-dp-attention/--nnodes",
                       "each attention group's pool (or another node's ranks) would need its own "
                       "host tier");
  }
  if (!f.speculative_algorithm.empty()) {
    return unsupported("--speculative-algorithm " + f.speculative_algorithm,
                       "the draft's target features kept per KV page do not follow pages into "
                       "the host and disk tiers yet");
  }
  if (!f.hicache_storage_backend.empty() && f.hicache_storage_dir.empty()) {
    return invalid_argument("--hicache-storage-backend file needs --hicache-storage-dir DIR");
  }
  if (f.hicache_storage_backend.empty() && !f.hicache_storage_dir.empty()) {
    return invalid_argument("--hicache-storage-dir needs --hicache-storage-backend file");
  }
  if (f.hicache_size_gb <= 0 && f.hicache_ratio <= 0) {
    return invalid_argument("--hicache-ratio 0 without --hicache-size leaves the host tier empty");
  }
  o->hicache = true;
  o->hicache_host_bytes = static_cast<int64_t>(f.hicache_size_gb * 1e9);
  o->hicache_ratio = f.hicache_ratio;
  M3_ASSIGN_OR_RETURN(o->hicache_policy, parse_hicache_write_policy(f.hicache_write_policy));
  o->hicache_disk_dir = f.hicache_storage_dir;
  return Status::ok();
}

// What a disk-tier page must have been computed by to be reused: the model directory, its
// config and weight files (size and modification time), the KV layout and page shape. Another
// model, a changed checkpoint or another KV format gives another key chain.
std::string kv_identity(const std::string& model_path, bool dummy_weights,
                        const MiniMaxM3Config& cfg, int32_t page_size, int64_t page_bytes) {
  std::string id = "m3serve-kv-1|float32|page_size=" + std::to_string(page_size) +
                   "|page_bytes=" + std::to_string(page_bytes) + "|layers=" +
                   std::to_string(cfg.num_hidden_layers) + "|kv_heads=" +
                   std::to_string(cfg.num_key_value_heads) + "|head_dim=" +
                   std::to_string(cfg.head_dim) + "|vocab=" + std::to_string(cfg.vocab_size) +
                   (dummy_weights ? "|dummy" : "");
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(model_path, ec);
  id += "|dir=" + (ec ? model_path : dir.string());
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(model_path, ec)) {
    const std::string name = e.path().filename().string();
    if (name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".index.json")) {
      std::error_code fe;
      const auto size = fs::file_size(e.path(), fe);
      const auto mtime = fs::last_write_time(e.path(), fe).time_since_epoch().count();
      files.push_back(name + ":" + std::to_string(size) + ":" + std::to_string(mtime));
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) id += "|" + f;
  return id;
}

}  // namespace

Result<EngineStackOptions> options_from_config(const ServeConfig& f) {
  EngineStackOptions o;
  {
    M3_ASSIGN_OR_RETURN(const RankLayout layout,
                        resolve_rank_layout(f.tp, f.ep, f.enable_expert_parallel));
    M3_RETURN_IF_ERROR(check_dp_attention(layout, f.dp, f.enable_dp_attention));
  }
  if (!f.speculative_algorithm.empty()) {
    // The draft runs unsplit next to the target: on the float32 CPU path (on rank 0 when the
    // target is split over CPU ranks with --tp / --ep / --dp, here or over --nnodes: the engine's
    // node holds rank 0, which returns every attention group's captured hidden states), the
    // float32 CUDA backend, or on the real-shape kernels beside the target's (first) GPU
    // (cuda_dspark_draft.h).
    o.speculative = true;
    o.draft_model_path = f.speculative_draft_model_path;
    o.draft_dummy_weights = f.speculative_draft_load_format == "dummy";
    o.speculative_options.num_draft_tokens = f.speculative_num_draft_tokens;
    o.speculative_options.method = f.speculative_block_verification ? VerifyMethod::kBlock
                                                                     : VerifyMethod::kTokenWise;
    o.speculative_options.simulate_accept_length = f.speculative_simulate_accept_length;
  }
  if (f.speculative_simulate_accept_length > 0 && f.load_format != "dummy") {
    return invalid_argument(
        "--speculative-simulate-accept-length: forced acceptance changes the output; it is for "
        "benchmarks with --load-format dummy only");
  }
  M3_ASSIGN_OR_RETURN(o.kv_cache_dtype, resolve_kv_cache_dtype(f));
  M3_RETURN_IF_ERROR(hicache_options(f, &o));
  o.nodes.nnodes = f.nnodes;
  o.nodes.node_rank = f.node_rank;
  o.nodes.dist_init_addr = f.dist_init_addr;
  o.nodes.dist_timeout = std::chrono::seconds(f.dist_timeout_s);
  o.tensor_parallel = f.tp;
  o.expert_parallel = f.ep;
  o.enable_expert_parallel = f.enable_expert_parallel;
  o.custom_all_reduce = !f.disable_custom_all_reduce;
  o.decode_max_rows = f.cuda_graph_max_bs;
  o.decode_max_rows_flag = f.cuda_graph_max_bs_flag;
  o.dp_attention = f.enable_dp_attention ? f.dp : 1;
  M3_ASSIGN_OR_RETURN(o.load_balance, parse_load_balance_method(f.load_balance_method));
  o.dummy_weights = f.load_format == "dummy";
  o.device = f.device;
  o.context_length = f.server.context_length;
  o.max_running_requests = f.max_running_requests;
  o.chunked_prefill_size = f.chunked_prefill_size;
  o.chunked_prefill_size_while_decoding = f.chunked_prefill_size_while_decoding;
  o.max_queued_requests = f.max_queued_requests;
  o.kv_cache_bytes = f.kv_cache_bytes;
  o.mem_fraction_static = f.mem_fraction_static;
  return o;
}

namespace {

// What each GPU of --tp (--ep, --dp) holds, for the startup report's layout line.
std::string gpu_layout_summary(const MiniMaxM3Config& c, int tp, int ep, int dp) {
  const int attn = tp / dp;
  std::string heads = "each GPU holds 1/" + std::to_string(attn) + " of " +
                      (dp > 1 ? "its group's" : "the") + " attention heads";
  std::string ffn =
      ep > 1 ? std::to_string(c.num_local_experts / ep) + " of the " +
                   std::to_string(c.num_local_experts) + " routed experts" +
                   (tp > ep ? " at 1/" + std::to_string(tp / ep) + " of their width" : "")
             : "1/" + std::to_string(tp) + " of every expert";
  if (dp == 1) return heads + " and " + ffn;
  return std::to_string(dp) + " attention groups of " + std::to_string(attn) +
         " GPUs, each with its own requests and KV pool; " + heads + ", and " + ffn +
         " (the feed-forward blocks run on every group's tokens over all " + std::to_string(tp) +
         " GPUs)";
}

// --speculative-algorithm DSPARK: the draft for the float32 runner's target (<model>/dspark
// unless --speculative-draft-model-path names another directory).
minimax_m3::dspark::DSparkLoadOptions draft_load_options(const std::string& model_path,
                                                        const EngineStackOptions& options) {
  minimax_m3::dspark::DSparkLoadOptions o;
  o.draft_dir = options.draft_model_path;
  if (o.draft_dir.empty() && !model_path.empty()) o.draft_dir = (fs::path(model_path) / "dspark").string();
  o.dummy_weights = options.dummy_weights || options.draft_dummy_weights;
  return o;
}

// The real-shape GPU draft's device memory (dspark_cuda_plan.h): its weights, a context per
// running request and a propose's scratch; 0 for a draft it does not take.
int64_t gpu_draft_bytes(minimax_m3::dspark::DSparkConfig draft, const MiniMaxM3Config& target,
                        int32_t max_running) {
  if (!draft.resolve_with_target(target).is_ok()) return 0;
  auto plan = minimax_m3::plan_dspark_cuda(draft);
  if (!plan.is_ok()) return 0;
  return plan->weight_bytes + int64_t{max_running} * plan->kv_bytes_per_sequence +
         plan->propose_scratch_bytes;
}

// `target`: the whole model's config; `first_rank`: the model whose embedding, lm_head and
// final norm the draft reads (the only one at --tp 1, rank 0's over ranks), on `backend` (the CPU
// backend, or the float32 CUDA backend with its block-attention kernel).
Result<std::unique_ptr<DraftModel>> load_draft(const std::string& model_path,
                                               const EngineStackOptions& options,
                                               const MiniMaxM3Config& target,
                                               const minimax_m3::Model& first_rank,
                                               Backend* backend) {
  minimax_m3::dspark::DSparkLoadOptions o = draft_load_options(model_path, options);
  o.attention = dspark_block_attention_for(backend);
  M3_ASSIGN_OR_RETURN(auto d, minimax_m3::dspark::load_dspark_engine_draft(o, target, first_rank,
                                                                           backend));
  return std::unique_ptr<DraftModel>(std::move(d));
}

DraftMemoryShape draft_memory_shape(const minimax_m3::dspark::DSparkConfig& c) {
  DraftMemoryShape d;
  d.hidden = c.hidden_size;
  d.layers = c.num_hidden_layers;
  d.heads = c.num_attention_heads;
  d.kv_heads = c.num_key_value_heads;
  d.head_dim = c.head_dim;
  d.intermediate = c.intermediate_size;
  d.vocab = c.vocab_size;
  d.markov_rank = c.markov_rank;
  d.sliding_window = c.sliding_window;
  d.num_target_layers = static_cast<int64_t>(c.target_layer_ids.size());
  d.confidence_head = c.enable_confidence_head;
  d.confidence_with_markov = c.confidence_head_with_markov;
  d.context_page_size = minimax_m3::dspark::DSparkContextCache::kDefaultPageSize;
  return d;
}

// The config of `model_path`, or the built-in M3.1-Flash config for dummy weights without a
// directory; dummy weights keep the first num_layers layers when asked.
Result<MiniMaxM3Config> model_config(const std::string& model_path,
                                     const EngineStackOptions& options) {
  if (options.dummy_weights && model_path.empty()) {
    return minimax_m3::builtin_m3_flash_config(options.num_layers > 0 ? options.num_layers : 60);
  }
  M3_ASSIGN_OR_RETURN(MiniMaxM3Config c, load_minimax_m3_config(model_path));
  if (options.num_layers > 0) {
    if (!options.dummy_weights) return invalid_argument("--num-layers needs --load-format dummy");
    if (options.num_layers < c.num_hidden_layers) {
      c.num_hidden_layers = options.num_layers;
      c.layer_types.resize(static_cast<size_t>(options.num_layers));
      c.mlp_layer_types.resize(static_cast<size_t>(options.num_layers));
    }
  }
  return c;
}

}  // namespace

Result<LoadedEngine> make_engine(const std::string& model_path, const EngineStackOptions& options,
                                 DetokenizerFactory detokenizer) {
  if (options.device != "auto" && options.device != "cpu" && options.device != "cuda") {
    return invalid_argument("--device '" + options.device + "': allowed: auto, cpu, cuda");
  }
  if (options.device == "cuda" && !options.make_backend) {
    return Status(StatusCode::kUnimplemented, "--device cuda: no CUDA backend factory given");
  }
  if (!(options.dummy_weights && model_path.empty()) && !fs::is_directory(model_path)) {
    return Status(StatusCode::kNotFound, "model directory '" + model_path + "' does not exist");
  }

  M3_ASSIGN_OR_RETURN(const RankLayout layout,
                      resolve_rank_layout(options.tensor_parallel, options.expert_parallel,
                                          options.enable_expert_parallel));
  const int tp = layout.tp, ep = layout.ep;
  const int dp = std::max(1, options.dp_attention);
  M3_RETURN_IF_ERROR(check_dp_attention(layout, dp, true));
  const NodeLayout& nodes = options.nodes;
  M3_RETURN_IF_ERROR(check_node_layout(nodes, tp));
  const bool multi_node = nodes.nnodes > 1;
  if (multi_node && tp == 1) {
    return Status(StatusCode::kUnimplemented,
                  "--nnodes " + std::to_string(nodes.nnodes) +
                      ": give --tp (the ranks spread over the nodes)");
  }
  const int local_ranks = tp / nodes.nnodes;  // this process's ranks
  const bool gpu_ranks = tp > 1 && options.device == "cuda";
  if (!options.custom_all_reduce && !gpu_ranks)
    std::fprintf(stderr, "m3serve: note: --disable-custom-all-reduce: no GPU ranks here (--tp %d "
                 "--device %s); it changes nothing\n", tp, options.device.c_str());
  if (gpu_ranks && !options.make_cuda_runner) {
    return Status(StatusCode::kUnimplemented,
                  "--tp " + std::to_string(tp) + " --device cuda: this m3serve has no GPU ranks");
  }
  // --device cuda: the real-shape kernels when the config fits them, else the float32 backend.
  // GPU ranks run only on the real-shape kernels, each at its share of the shapes.
  bool real_shape = false;
  if (options.device == "cuda" && options.make_cuda_runner) {
    M3_ASSIGN_OR_RETURN(MiniMaxM3Config c, model_config(model_path, options));
    if (gpu_ranks) {
      M3_RETURN_IF_ERROR(check_gpu_ranks_fit(c, tp, ep, dp));
      real_shape = true;
    } else {
      const Status fit = minimax_m3::check_real_shape_fit(c);
      real_shape = fit.is_ok();
      if (!real_shape)
        std::fprintf(stderr, "m3serve: --device cuda: %s; using the float32 CUDA backend\n",
                     fit.message().c_str());
    }
  }
  // The real-shape kernels' own storage: bf16 for auto (float32 is the float32 paths' auto).
  const KvCacheDtype real_shape_kv_dtype = real_shape_kv_cache_dtype(options.kv_cache_dtype);
  if (options.decode_max_rows > 0 && !real_shape)
    std::fprintf(stderr, "m3serve: note: %s %d: it sizes the real-shape CUDA kernels' decode "
                 "path, which this model does not run on; it changes nothing\n",
                 options.decode_max_rows_flag.c_str(), options.decode_max_rows);
  std::unique_ptr<Backend> backend;
  minimax_m3::LoadedModel loaded;
  ReadCounter whole_model_reads;  // one CPU rank: the checkpoint bytes its load read
  if (real_shape || tp > 1) {  // config and weights only: the runner(s) load their own parts
    M3_ASSIGN_OR_RETURN(loaded.config, model_config(model_path, options));
    if (options.dummy_weights) {
      loaded.weights = std::make_unique<minimax_m3::DummyWeightSource>(loaded.config);
    } else {
      M3_ASSIGN_OR_RETURN(loaded.weights, Checkpoint::open(model_path));
    }
    if (!model_path.empty()) {
      M3_ASSIGN_OR_RETURN(loaded.eos_token_ids, minimax_m3::read_generation_eos(model_path));
    }
    if (loaded.eos_token_ids.empty()) loaded.eos_token_ids = loaded.config.eos_token_ids;
    if (tp > 1) {
      M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(loaded.config, tp, ep, dp));
    }
  } else {
    if (options.make_backend) {
      M3_ASSIGN_OR_RETURN(backend, options.make_backend(options.device == "cuda" ? "cuda" : "cpu",
                                                        options.num_threads));
    } else {
      backend = std::make_unique<CpuBackend>(options.num_threads);
    }
    if (options.dummy_weights) {
      M3_ASSIGN_OR_RETURN(loaded, minimax_m3::load_dummy_model(model_path, options.num_layers,
                                                               backend.get()));
    } else {
      if (options.num_layers > 0) return invalid_argument("--num-layers needs --load-format dummy");
      ReadCounter::Scope counting(&whole_model_reads);
      M3_ASSIGN_OR_RETURN(loaded, minimax_m3::load_model_dir(model_path, backend.get()));
    }
  }

  GenerationDefaults defaults;
  const fs::path gen = fs::path(model_path) / "generation_config.json";
  if (!model_path.empty() && fs::exists(gen)) {
    M3_ASSIGN_OR_RETURN(defaults, load_generation_config(gen.string()));
  }
  if (defaults.eos_token_ids.empty()) {
    for (int64_t id : loaded.eos_token_ids) defaults.eos_token_ids.push_back(int32_t(id));
  }

  const int32_t max_positions =
      static_cast<int32_t>(std::min<int64_t>(loaded.config.max_position_embeddings, INT32_MAX));
  const int32_t page_size = static_cast<int32_t>(loaded.config.index_block_size);

  // Memory (app/memory_plan.h): the pool must hold one request of the context length (the engine
  // refuses a request whose prompt + max_tokens - 1 tokens exceed the pool).
  const WeightStorage storage =
      real_shape ? WeightStorage::kCheckpointFormats : WeightStorage::kFloat32;
  const bool on_gpu = options.device == "cuda";
  MemoryPlanInput mem;
  mem.device_name = on_gpu ? "GPU" : "CPU";
  if (options.kv_cache_bytes <= 0 && (options.mem_fraction_static > 0 || on_gpu)) {
    if (on_gpu && options.cuda_memory_bytes) {
      M3_ASSIGN_OR_RETURN(mem.device_memory_bytes, options.cuda_memory_bytes());
    } else if (!on_gpu) {
      M3_ASSIGN_OR_RETURN(mem.device_memory_bytes, available_host_memory());
    }
  }
  mem.mem_fraction_static = options.mem_fraction_static;
  // A serving pool on the GPU is planned by fraction even without the flag; generate and score
  // (default_kv_cache_bytes 0) size theirs for their one request.
  mem.default_mem_fraction =
      on_gpu && options.default_kv_cache_bytes > 0 ? kDefaultGpuMemFraction : 0;
  mem.default_kv_cache_bytes = options.default_kv_cache_bytes;
  mem.kv_cache_bytes = options.kv_cache_bytes;
  // This process's CPU ranks share this machine's memory: the plan counts them as one device.
  // GPU ranks have a device each: the plan is per GPU.
  const int64_t weight_bytes_per_rank =
      weight_bytes_per_device(loaded.config, storage, tp, ep, dp);
  mem.weight_bytes = weight_bytes_per_rank * (gpu_ranks ? 1 : local_ranks);
  const int32_t max_running =
      options.max_running_requests > 0 ? options.max_running_requests : kDefaultMaxRunning;
  const int32_t chunk = options.chunked_prefill_size > 0
                            ? options.chunked_prefill_size
                            : (options.context_length > 0 ? options.context_length : max_positions);
  mem.activation_bytes = activation_bytes_per_device(
      loaded.config, storage, 1, std::max(chunk, max_running), max_running);
  mem.kv_bytes_per_page =
      // With dp a rank holds its attention group's pool: the KV heads split over tp / dp ranks.
      real_shape ? minimax_m3::real_shape_kv_pool_bytes_per_page(
                       tp > 1 ? minimax_m3::rank_config(loaded.config, 0, tp, 1, dp)
                              : loaded.config,
                       real_shape_kv_dtype)
      : tp > 1   ? TensorParallelCpuRunner::bytes_per_page(loaded.config, tp, dp,
                                                           options.kv_cache_dtype) /
                       tp * local_ranks
                 : MiniMaxM3ModelRunner::bytes_per_page(backend.get(), loaded.config,
                                                        options.kv_cache_dtype);
  mem.page_size = page_size;
  mem.max_context_length = max_positions;
  mem.context_length = options.context_length;
  mem.cap_to_running_requests = on_gpu ? 0 : max_running;
  // On the GPU's real-shape path without --kv-cache-bytes the working memory is measured, not
  // estimated: the runner loads its weights, runs a profile step of the largest step (a prefill
  // chunk with a decode token of every running request riding along, at most kMaxProfileTokens;
  // beyond it the estimate's growth per token is added) and the pool is planned from the
  // device's memory as the step left it.
  const bool measure = real_shape && options.kv_cache_bytes <= 0;
  // The draft on the float32 path (--speculative-algorithm): its weights and a context cache per
  // running sequence are static memory; the target features kept with every KV page (for
  // prefix-cache hits) grow the page. (The real-shape GPU draft: gpu_side_bytes below.)
  const int64_t target_bytes_per_page = mem.kv_bytes_per_page;
  std::optional<DraftMemoryShape> draft_memory;
  int64_t draft_static_bytes = 0, draft_feature_page_bytes = 0;
  if (options.speculative && !real_shape) {
    M3_ASSIGN_OR_RETURN(const minimax_m3::dspark::DSparkConfig dcfg,
                        minimax_m3::dspark::resolve_dspark_config(
                            draft_load_options(model_path, options), loaded.config));
    draft_memory = draft_memory_shape(dcfg);
    draft_static_bytes = draft_weight_bytes(*draft_memory) +
                         int64_t{max_running} * draft_context_bytes_per_sequence(*draft_memory);
    if (options.enable_prefix_cache) {
      draft_feature_page_bytes = draft_feature_bytes_per_kv_page(*draft_memory, page_size);
    }
    mem.weight_bytes += draft_static_bytes;
    mem.kv_bytes_per_page += draft_feature_page_bytes;
  }
  // On the real-shape path, static memory beside the pool on the first GPU, counted like the
  // weights on every GPU (the plan is per device): the GPU draft (its weights, a context per
  // running request and a propose's scratch, dspark_cuda_plan.h) and the vision tower, which
  // serving puts on the GPU next to --device cuda. Shapes a GPU draft does not take count
  // nothing here; loading it fails later, naming the field.
  int64_t gpu_side_bytes = 0;
  std::string gpu_side_what;
  if (real_shape && options.speculative) {
    M3_ASSIGN_OR_RETURN(minimax_m3::dspark::DSparkConfig dcfg,
                        minimax_m3::dspark::resolve_dspark_config(
                            draft_load_options(model_path, options), loaded.config));
    if (const int64_t b = gpu_draft_bytes(dcfg, loaded.config, max_running); b > 0) {
      gpu_side_bytes += b;
      gpu_side_what += "the DSpark draft " + format_bytes(b);
    }
  }
  if (real_shape && !options.dummy_weights && !model_path.empty()) {
    M3_ASSIGN_OR_RETURN(std::optional<VisionConfig> vision, load_vision_config(model_path));
    if (vision && find_vision_prefix(*loaded.weights).is_ok()) {
      const int64_t b = vision_tower_gpu_bytes(*vision);
      gpu_side_bytes += b;
      gpu_side_what += std::string(gpu_side_what.empty() ? "" : ", ") + "the vision tower " +
                       format_bytes(b);
    }
  }
  mem.weight_bytes += gpu_side_bytes;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<DraftModel> draft;  // --speculative-algorithm
  std::function<std::string()> nodes_gone;  // multi-node: who left, after a failure
  // GPU ranks over several nodes: this node's GPUs join the others through the rendezvous before
  // they load (the NCCL group forms as they do; the factory shares the pool's sizing).
  std::shared_ptr<JoinedGpuNodes> gpu_nodes;
  if (multi_node && gpu_ranks) {
    M3_ASSIGN_OR_RETURN(gpu_nodes, join_gpu_nodes(nodes, tp, dp));
    nodes_gone = gpu_nodes->nodes_gone;
  }
  MemoryPlan plan;
  if (measure) {
    // The largest step: a whole chunk with every running request's decode token riding along.
    const int64_t step_tokens = int64_t{chunk} + max_running;
    const int64_t profile_tokens = std::min(step_tokens, kMaxProfileTokens);
    const int64_t beyond =
        activation_bytes_per_device(loaded.config, storage, 1, step_tokens, max_running) -
        activation_bytes_per_device(loaded.config, storage, 1, profile_tokens, max_running);
    CudaKvPoolRequest pool = gpu_pool_request(options, tp, ep, dp, gpu_nodes);
    pool.profile_tokens = profile_tokens;
    pool.plan_pool_bytes = [&](const MeasuredMemory& m) -> Result<int64_t> {
      std::fprintf(stderr,
                   "m3serve: memory profile: %lld bytes in all, %lld of weights, %lld working, "
                   "%lld free after a step of %lld tokens\n",
                   static_cast<long long>(m.total_bytes), static_cast<long long>(m.weight_bytes),
                   static_cast<long long>(m.working_bytes), static_cast<long long>(m.free_bytes),
                   static_cast<long long>(profile_tokens));
      MemoryPlanInput measured = mem;
      measured.device_memory_bytes = m.total_bytes;
      measured.weight_bytes = m.weight_bytes + gpu_side_bytes;
      measured.activation_bytes = m.working_bytes + std::max<int64_t>(0, beyond);
      measured.free_bytes_limit =
          std::max<int64_t>(1, m.free_bytes - std::max<int64_t>(0, beyond) - gpu_side_bytes -
                                   kv_headroom_bytes(m.total_bytes));
      M3_ASSIGN_OR_RETURN(plan, plan_memory(measured));
      plan.sized_by += "; working memory " + format_bytes(m.working_bytes) +
                       " measured by a profile step of " + std::to_string(profile_tokens) +
                       " tokens";
      if (beyond > 0) plan.sized_by += " + " + format_bytes(beyond) + " estimated beyond it";
      if (gpu_side_bytes > 0) plan.sized_by += "; kept for " + gpu_side_what;
      return plan.kv_cache_bytes;
    };
    M3_ASSIGN_OR_RETURN(runner, options.make_cuda_runner(loaded.config, *loaded.weights, pool));
  } else {
    M3_ASSIGN_OR_RETURN(plan, plan_memory(mem));
    if (gpu_side_bytes > 0) plan.sized_by += "; kept for " + gpu_side_what;
  }
  for (const std::string& w : plan.warnings) std::fprintf(stderr, "m3serve: warning: %s\n", w.c_str());
  const int32_t context_length = plan.context_length;
  const int64_t kv_cache_bytes = plan.kv_cache_bytes;
  std::fprintf(stderr,
               "m3serve: KV cache %lld bytes (%s): %lld pages of %d tokens, "
               "%lld bytes per page, %lld tokens\n",
               static_cast<long long>(kv_cache_bytes), plan.sized_by.c_str(),
               static_cast<long long>(plan.pages), page_size,
               static_cast<long long>(mem.kv_bytes_per_page),
               static_cast<long long>(plan.max_tokens));

  // CPU threads per rank of this process.
  const int cores = options.num_threads > 0 ? options.num_threads
                                            : static_cast<int>(std::thread::hardware_concurrency());
  const int threads_per_rank = std::max(1, cores / local_ranks);
  std::vector<uint64_t> bytes_read;  // per rank of this process, from the runner's loads
  if (runner) {
    // made by the profile step above
  } else if (real_shape) {
    CudaKvPoolRequest pool = gpu_pool_request(options, tp, ep, dp, gpu_nodes);
    pool.kv_cache_bytes = kv_cache_bytes;
    M3_ASSIGN_OR_RETURN(runner, options.make_cuda_runner(loaded.config, *loaded.weights, pool));
  } else if (multi_node) {
    M3_ASSIGN_OR_RETURN(JoinedRanks joined, join_nodes(nodes, tp, dp));
    M3_RETURN_IF_ERROR(joined.share_kv_pages(static_cast<int32_t>(plan.pages)).status());
    nodes_gone = joined.nodes_gone;
    M3_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelCpuRunner> ranks,
                        TensorParallelCpuRunner::create_distributed(
                            loaded.config, *loaded.weights, std::move(joined.ranks), ep,
                            threads_per_rank, static_cast<int32_t>(plan.pages), dp,
                            options.kv_cache_dtype, /*whole_lm_head_on_rank0=*/
                            options.speculative));
    bytes_read = ranks->weight_bytes_read();
    if (options.speculative) {
      M3_ASSIGN_OR_RETURN(draft, load_draft(model_path, options, loaded.config,
                                            ranks->first_rank_model(),
                                            ranks->first_rank_backend()));
    }
    runner = std::move(ranks);
  } else if (tp > 1) {
    // With --dp, plan.pages is each attention group's pool.
    M3_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelCpuRunner> ranks,
                        TensorParallelCpuRunner::create(loaded.config, *loaded.weights, tp, ep,
                                                        threads_per_rank,
                                                        static_cast<int32_t>(plan.pages), dp,
                                                        options.kv_cache_dtype,
                                                        // The draft's logits need the whole head.
                                                        options.speculative));
    bytes_read = ranks->weight_bytes_read();
    if (options.speculative) {
      M3_ASSIGN_OR_RETURN(draft, load_draft(model_path, options, loaded.config,
                                            ranks->first_rank_model(),
                                            ranks->first_rank_backend()));
    }
    runner = std::move(ranks);
  } else {
    bytes_read = {whole_model_reads.total()};
    // With a draft the planned page also holds its features: the runner gets the target's part
    // of the plan's pages.
    const int64_t runner_kv_bytes =
        draft_memory ? plan.pages * target_bytes_per_page : kv_cache_bytes;
    M3_ASSIGN_OR_RETURN(auto cpu_runner, MiniMaxM3ModelRunner::create(std::move(backend),
                                                                      std::move(loaded.model),
                                                                      runner_kv_bytes,
                                                                      options.kv_cache_dtype));
    if (options.speculative) {
      M3_ASSIGN_OR_RETURN(draft, load_draft(model_path, options, loaded.config,
                                            cpu_runner->model(), cpu_runner->backend()));
    }
    runner = std::move(cpu_runner);
  }
  if (options.speculative && real_shape) {
    // The GPU draft next to the real-shape target, on its GPU and stream.
    std::string dir = options.draft_model_path;
    if (dir.empty() && !model_path.empty()) dir = (fs::path(model_path) / "dspark").string();
    M3_ASSIGN_OR_RETURN(draft, make_cuda_dspark_draft(
                                   *runner, dir, options.dummy_weights || options.draft_dummy_weights,
                                   max_running));
  }
  if (options.speculative && !draft) {
    return Status(StatusCode::kUnimplemented,
                  "--speculative-algorithm: speculative decoding runs on the float32 path (CPU "
                  "ranks of one process, or the float32 CUDA backend) or on one GPU on the "
                  "real-shape kernels");
  }
  std::vector<std::string> report;
  report.push_back("weights: " + weight_formats_summary(*loaded.weights) + "; " +
                   format_bytes(weight_bytes_per_rank) + (tp > 1 ? " per rank" : "") +
                   " on the " + mem.device_name +
                   (real_shape ? " in those formats (real-shape CUDA kernels)"
                               : " as float32 (the reference path)"));
  report.push_back(gpu_ranks && multi_node
                   ? "layout: " + std::to_string(local_ranks) + " of " + std::to_string(tp) +
                         " GPUs (ranks " + std::to_string(nodes.node_rank * local_ranks) + ".." +
                         std::to_string((nodes.node_rank + 1) * local_ranks - 1) + ") on node " +
                         std::to_string(nodes.node_rank) + " of " +
                         std::to_string(nodes.nnodes) + " over NCCL (tp " + std::to_string(tp) +
                         ", dp " + std::to_string(dp) + ", ep " + std::to_string(ep) + ")" +
                         (dp > 1 ? ": " + gpu_layout_summary(loaded.config, tp, ep, dp)
                                 : std::string())
                   : gpu_ranks ? "layout: " + std::to_string(tp) +
                                  " GPUs (0.." + std::to_string(tp - 1) +
                                  ") in this process over NCCL (tp " + std::to_string(tp) +
                                  ", dp " + std::to_string(dp) + ", ep " + std::to_string(ep) +
                                  "): " + gpu_layout_summary(loaded.config, tp, ep, dp)
                   : tp > 1 ? "layout: " +
                               (multi_node ? std::to_string(local_ranks) + " of " +
                                                 std::to_string(tp) + " CPU ranks on node " +
                                                 std::to_string(nodes.node_rank) + " of " +
                                                 std::to_string(nodes.nnodes) + " over Gloo (tp "
                                           : std::to_string(tp) +
                                                 " CPU ranks in this process over Gloo (tp ") +
                               std::to_string(tp) + ", dp " + std::to_string(dp) + ", ep " +
                               std::to_string(ep) + ")" +
                               (ep > 1 ? "; routed experts: " +
                                             std::to_string(loaded.config.num_local_experts / ep) +
                                             " of " +
                                             std::to_string(loaded.config.num_local_experts) +
                                             " per rank, moved to by all-to-all"
                                       : std::string())
                          : std::string("layout: 1 device (tp 1, dp 1, ep 1)"));
  if (const uint64_t stored = checkpoint_stored_bytes(*loaded.weights); stored > 0 && !real_shape)
    report.push_back(weights_read_summary(multi_node ? nodes.node_rank * local_ranks : 0,
                                          bytes_read, stored));
  const KvCacheDtype kv_dtype = real_shape ? real_shape_kv_dtype : options.kv_cache_dtype;
  report.push_back("KV cache: " +
                   kv_pool_summary(kv_dtype, mem.kv_bytes_per_page, page_size, plan.max_tokens) +
                   "; " + std::to_string(plan.pages) + " pages of " + std::to_string(page_size) +
                   " tokens (" +
                   format_bytes(kv_cache_bytes) + ", " + plan.sized_by + ")" +
                   (dp > 1 ? " per DP group (" + std::to_string(dp) + " groups)" : "") +
                   "; context length " + std::to_string(context_length));

  if (draft_memory) {
    const int64_t per_seq = draft_context_bytes_per_sequence(*draft_memory);
    report.push_back(
        "draft memory: DSpark weights " + format_bytes(draft_weight_bytes(*draft_memory)) +
        " (float32); context cache " + format_bytes(per_seq) + " per running sequence, " +
        format_bytes(int64_t{max_running} * per_seq) + " for " + std::to_string(max_running) +
        " (--max-running-requests); " +
        (draft_feature_page_bytes > 0
             ? "target features for the prefix cache " + format_bytes(draft_feature_page_bytes) +
                   " per KV page, " + format_bytes(draft_feature_page_bytes * plan.pages) +
                   " for the pool's " + std::to_string(plan.pages) + " pages (in the KV cache)"
             : std::string("no prefix cache, no target features kept")));
  }

  EngineConfig cfg;
  cfg.scheduler.page_size = page_size;
  cfg.scheduler.chunked_prefill_size =
      options.chunked_prefill_size > 0 ? options.chunked_prefill_size : context_length;
  cfg.scheduler.chunked_prefill_size_while_decoding =
      std::min(options.chunked_prefill_size_while_decoding, cfg.scheduler.chunked_prefill_size);
  if (options.max_running_requests > 0) {
    cfg.scheduler.max_running_requests = options.max_running_requests;
  }
  cfg.scheduler.enable_prefix_cache = options.enable_prefix_cache;
  // Engine::create checks these against the runner's dp_groups().
  cfg.scheduler.num_dp_groups = dp;
  cfg.scheduler.load_balance = options.load_balance;
  cfg.context_length = context_length;
  cfg.max_waiting_requests = options.max_queued_requests;
  cfg.generation_defaults = defaults;
  cfg.detokenizer = std::move(detokenizer);
  cfg.on_failure = options.on_failure;
  if (nodes_gone && options.on_failure) {
    cfg.on_failure = [gone = nodes_gone, report = options.on_failure](const Status& why) {
      const std::string who = gone();
      report(who.empty() ? why : Status(why.code(), who + ": " + why.message()));
    };
  }
  HiCacheOptions hicache;
  if (options.hicache) {
    KvPageCopier* copier = runner->kv_page_copier();
    if (copier == nullptr) {
      return Status(StatusCode::kUnimplemented,
                    "--enable-hierarchical-cache: this model runner cannot copy KV pages to host "
                    "memory (no page copier could be made for it)");
    }
    const int64_t page_bytes = copier->page_bytes();
    const int64_t host_pages =
        options.hicache_host_bytes > 0
            ? options.hicache_host_bytes / page_bytes
            : static_cast<int64_t>(static_cast<double>(plan.pages) * options.hicache_ratio);
    if (host_pages < 1 || host_pages > INT32_MAX) {
      return invalid_argument(
          (options.hicache_host_bytes > 0 ? "--hicache-size" : "--hicache-ratio") +
          std::string(": the host tier would hold ") + std::to_string(host_pages) +
          " KV pages of " + format_bytes(page_bytes) + "; it needs at least one");
    }
    // The arena is reserved up front but touched page by page: refuse at startup what the
    // machine cannot hold (after the weights and the KV pool are resident) rather than let the
    // kernel kill the server once the tier fills.
    if (auto avail = available_host_memory(); avail.is_ok() && host_pages * page_bytes > *avail) {
      return Status(StatusCode::kResourceExhausted,
                    (options.hicache_host_bytes > 0 ? "--hicache-size" : "--hicache-ratio") +
                        std::string(": a host tier of ") + format_bytes(host_pages * page_bytes) +
                        " exceeds the " + format_bytes(*avail) + " of memory available");
    }
    hicache.host_pages = static_cast<int32_t>(host_pages);
    hicache.policy = options.hicache_policy;
    hicache.disk_dir = options.hicache_disk_dir;
    // A page's bytes are the ranks' shards one after another in the KV dtype: the layout and the
    // dtype are part of the key.
    hicache.model_identity =
        kv_identity(model_path, options.dummy_weights, loaded.config, page_size, page_bytes) +
        (tp > 1 ? "|tp=" + std::to_string(tp) : "") + "|kv=" + kv_cache_dtype_name(kv_dtype);
    report.push_back(
        "HiCache: host tier " + std::to_string(host_pages) + " pages of " +
        std::to_string(page_size) + " tokens = " + std::to_string(host_pages * page_size) +
        " tokens (" + format_bytes(host_pages * page_bytes) + ", " +
        (options.hicache_host_bytes > 0 ? "--hicache-size"
                                        : "--hicache-ratio " + fmt_ratio(options.hicache_ratio)) +
        "), " + hicache_write_policy_name(options.hicache_policy) +
        (options.hicache_disk_dir.empty() ? "; no disk tier"
                                          : "; disk tier in " + options.hicache_disk_dir));
  }
  LoadedEngine out;
  M3_ASSIGN_OR_RETURN(out.engine, Engine::create(std::move(cfg), std::move(runner)));
  if (options.hicache) M3_RETURN_IF_ERROR(out.engine->enable_hicache(hicache));
  if (draft) {
    SpeculativeOptions so = options.speculative_options;
    if (so.num_draft_tokens == 0) so.num_draft_tokens = draft->block_size() + 1;
    const int32_t B = draft->block_size();
    M3_RETURN_IF_ERROR(out.engine->enable_speculative(std::move(draft), so));
    out.report.push_back("speculative decoding: DSpark draft, block " + std::to_string(B) + ", " +
                         std::to_string(so.num_draft_tokens) + " tokens per verify, " +
                         (so.method == VerifyMethod::kBlock ? "block" : "token-wise") +
                         " verification" +
                         (so.simulate_accept_length > 0
                              ? ", FORCED acceptance of " +
                                    std::to_string(so.simulate_accept_length) +
                                    " tokens (benchmark; output is not the model's)"
                              : std::string()));
  }
  out.context_length = context_length;
  out.report.insert(out.report.begin(), report.begin(), report.end());
  out.keepalive = std::shared_ptr<minimax_m3::LoadedModel>(
      new minimax_m3::LoadedModel{loaded.config, std::move(loaded.weights), nullptr, {}});
  return out;
}

Status check_gpu_ranks_fit(const MiniMaxM3Config& cfg, int tp, int ep, int dp) {
  Status fit = minimax_m3::check_real_shape_fit(cfg);
  // Under --dp a rank's heads are its attention group's share (tp / dp ranks).
  if (fit.is_ok()) fit = minimax_m3::check_tensor_parallel(cfg, tp, ep, dp);
  for (int r = 0; r < tp && fit.is_ok(); ++r)
    fit = minimax_m3::check_real_shape_fit(minimax_m3::rank_config(cfg, r, tp, ep, dp));
  if (fit.is_ok()) return fit;
  return Status(fit.code(), "--tp " + std::to_string(tp) +
                                (ep > 1 ? " --ep " + std::to_string(ep) : std::string()) +
                                (dp > 1 ? " --enable-dp-attention --dp " + std::to_string(dp)
                                        : std::string()) +
                                " --device cuda: " + fit.message());
}

CudaKvPoolRequest gpu_pool_request(const EngineStackOptions& options, int tp, int ep, int dp,
                                   std::shared_ptr<JoinedGpuNodes> nodes) {
  CudaKvPoolRequest pool;
  pool.tensor_parallel = tp;
  pool.expert_parallel = ep;
  pool.dp_attention = dp;
  pool.dist_timeout = options.nodes.dist_timeout;
  pool.custom_all_reduce = options.custom_all_reduce;
  pool.max_decode_rows = options.decode_max_rows;
  pool.kv_cache_dtype = real_shape_kv_cache_dtype(options.kv_cache_dtype);
  pool.nodes = std::move(nodes);
  pool.whole_vocab_on_rank0 = options.speculative;
  return pool;
}

Result<int> run_follower_node(const std::string& model_path, const EngineStackOptions& options) {
  const NodeLayout& nodes = options.nodes;
  M3_ASSIGN_OR_RETURN(const RankLayout layout,
                      resolve_rank_layout(options.tensor_parallel, options.expert_parallel,
                                          options.enable_expert_parallel));
  const int tp = layout.tp, ep = layout.ep;
  M3_RETURN_IF_ERROR(check_node_layout(nodes, tp));
  if (nodes.node_rank == 0) return internal_error("[app] run_follower_node on node 0");
  const int dp = std::max(1, options.dp_attention);
  M3_RETURN_IF_ERROR(check_dp_attention(layout, dp, true));
  if (!(options.dummy_weights && model_path.empty()) && !fs::is_directory(model_path)) {
    return Status(StatusCode::kNotFound, "model directory '" + model_path + "' does not exist");
  }
  M3_ASSIGN_OR_RETURN(MiniMaxM3Config cfg, model_config(model_path, options));
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, tp, ep, dp));
  std::unique_ptr<WeightSource> weights;
  if (options.dummy_weights) {
    weights = std::make_unique<minimax_m3::DummyWeightSource>(cfg);
  } else {
    M3_ASSIGN_OR_RETURN(weights, Checkpoint::open(model_path));
  }
  const int local_ranks = tp / nodes.nnodes;
  std::fprintf(stderr, "m3serve: node %d of %d: joining the group at %s (ranks %d..%d of %d)\n",
               nodes.node_rank, nodes.nnodes, nodes.dist_init_addr.c_str(),
               nodes.node_rank * local_ranks, (nodes.node_rank + 1) * local_ranks - 1, tp);
  if (options.device == "cuda") return follow_on_gpus(cfg, *weights, options, tp, ep, dp);
  M3_ASSIGN_OR_RETURN(JoinedRanks joined, join_nodes(nodes, tp, dp));
  M3_ASSIGN_OR_RETURN(const int32_t pages, joined.share_kv_pages(0));
  const int cores = options.num_threads > 0 ? options.num_threads
                                            : static_cast<int>(std::thread::hardware_concurrency());
  M3_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelCpuRunner> runner,
                      TensorParallelCpuRunner::create_distributed(
                          cfg, *weights, std::move(joined.ranks), ep,
                          std::max(1, cores / local_ranks), pages, dp, options.kv_cache_dtype));
  std::string read;
  if (const uint64_t stored = checkpoint_stored_bytes(*weights); stored > 0)
    read = "; " + weights_read_summary(runner->first_rank(), runner->weight_bytes_read(), stored);
  std::fprintf(stderr, "m3serve: node %d of %d: ready: %d KV pages%s; following node 0\n",
               nodes.node_rank, nodes.nnodes, pages, read.c_str());
  std::fflush(stderr);
  return end_following(nodes, runner->follow(), joined.nodes_gone);
}

Result<EngineStack> make_engine_stack(const std::string& model_path,
                                      const EngineStackOptions& options) {
  if (!fs::is_directory(model_path)) {
    return Status(StatusCode::kNotFound, "model directory '" + model_path + "' does not exist");
  }
  // Tokenizer and template first: they fail fast and cheaply.
  M3_ASSIGN_OR_RETURN(std::shared_ptr<const Tokenizer> tokenizer, serving::load_tokenizer(model_path));
  M3_ASSIGN_OR_RETURN(ChatTemplate tmpl, load_chat_template(model_path));
  auto tails = std::make_shared<serving::DetokenizerTails>();
  M3_ASSIGN_OR_RETURN(LoadedEngine loaded,
                      make_engine(model_path, options, serving::make_detokenizer_factory(tokenizer, tails)));
  EngineStack stack;
  stack.backend =
      std::make_unique<serving::EngineBackend>(std::move(loaded.engine), loaded.context_length,
                                      std::move(loaded.keepalive), std::move(tails));
  stack.report = std::move(loaded.report);
  stack.codec = std::make_unique<serving::TokenizerCodec>(tokenizer);
  M3_RETURN_IF_ERROR(attach_vision(model_path, options, *stack.backend, *stack.codec, stack.report));
  stack.renderer = std::make_unique<serving::TemplateRenderer>(std::move(tmpl));
  return stack;
}

}  // namespace m3::app

#include "app/devices.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <string>

#include <filesystem>

#include "app/multi_node.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/expert_placement.h"
#if defined(M3_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/runtime/device_memory.h"
#include "backend/cuda/runtime/stream.h"
#include "model/minimax_m3/cuda/cuda_dspark_draft.h"
#include "model/minimax_m3/cuda/cuda_dspark_f32.h"
#include "model/minimax_m3/cuda/cuda_m3_runner.h"
#include "model/minimax_m3/cuda/cuda_vision_tower.h"
#endif

namespace m3::app {

bool cuda_built_in() {
#if defined(M3_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
  if (!cuda_built_in()) {
    std::fprintf(stderr, "m3serve: --device auto: cpu (this m3serve has no CUDA backend)\n");
    return "cpu";
  }
  auto probe = make_backend("cuda", 1);
  if (!probe.is_ok()) {
    std::fprintf(stderr, "m3serve: --device auto: cpu (%s)\n", probe.status().message().c_str());
    return "cpu";
  }
  std::fprintf(stderr, "m3serve: --device auto: cuda (%s)\n", (*probe)->name().c_str());
  return "cuda";
}

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(threads));
  if (device != "cuda")
    return invalid_argument("--device must be cpu or cuda, got '" + device + "'");
#if defined(M3_HAVE_CUDA)
  auto be = CudaBackend::create(0);
  if (!be.is_ok())
    return Status(StatusCode::kNotFound, "--device cuda: no usable GPU: " + be.status().message());
  return std::unique_ptr<Backend>(std::move(be).value());
#else
  return Status(StatusCode::kUnimplemented,
                "--device cuda: this m3serve was not built with the CUDA backend (configure with "
                "-DM3_CUDA=ON where nvcc is installed; 'm3serve version' says 'cuda: no')");
#endif
}

Result<int64_t> cuda_memory_bytes() {
#if defined(M3_HAVE_CUDA)
  M3_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::select_device(0));
  return info.global_mem_bytes;
#else
  return Status(StatusCode::kUnimplemented,
                "--device cuda: this m3serve was not built with the CUDA backend");
#endif
}

Result<std::unique_ptr<ModelRunner>> make_cuda_model_runner(const MiniMaxM3Config& cfg,
                                                            const WeightSource& src,
                                                            const CudaKvPoolRequest& pool) {
#if defined(M3_HAVE_CUDA)
  minimax_m3::CudaM3Options o;
  // --load-format dummy: the weights are generated on the GPU in the same formats.
  o.gpu_dummy_weights = dynamic_cast<const minimax_m3::DummyWeightSource*>(&src) != nullptr;
  CudaRanks ranks;
  ranks.ranks = pool.tensor_parallel;
  ranks.ep = pool.expert_parallel;
  ranks.dp = pool.dp_attention;
  ranks.timeout = pool.dist_timeout;
  ranks.whole_vocab_on_rank0 = pool.whole_vocab_on_rank0;
  if (!pool.custom_all_reduce) ranks.one_shot_max_bytes = 0;
  if (pool.max_decode_rows > 0) o.max_batch = pool.max_decode_rows;
  o.kv_cache_dtype = pool.kv_cache_dtype;
  int64_t kv_cache_bytes = pool.kv_cache_bytes, profile_tokens = pool.profile_tokens;
  if (pool.nodes) {
    // --nnodes: this node's GPUs are ranks first .. of the group. Every GPU of every node sizes
    // its pool as node 0's do (the profile step runs the model's collectives on all of them):
    // node 0 publishes its sizing, the others take it.
    const JoinedGpuNodes& nodes = *pool.nodes;
    M3_ASSIGN_OR_RETURN(const GpuPoolShare agreed,
                        nodes.share_pool(GpuPoolShare{pool.kv_cache_bytes, pool.profile_tokens}));
    if (nodes.node_rank != 0 && pool.kv_cache_bytes > 0 &&
        pool.kv_cache_bytes != agreed.kv_cache_bytes) {
      const std::string node0 =
          agreed.kv_cache_bytes > 0 ? "--kv-cache-bytes " + std::to_string(agreed.kv_cache_bytes)
                                    : "a profile step, then the fewest pages any GPU holds";
      std::fprintf(stderr, "m3serve: note: node %d: --kv-cache-bytes %lld changes nothing here: "
                   "every GPU sizes its KV pool as node 0's do (%s)\n", nodes.node_rank,
                   static_cast<long long>(pool.kv_cache_bytes), node0.c_str());
    }
    kv_cache_bytes = agreed.kv_cache_bytes;
    profile_tokens = agreed.profile_tokens;
    auto share = std::make_shared<CudaNodeShare>();
    share->first = nodes.ranks.first;
    share->count = nodes.ranks.count;
    share->share_unique_id = nodes.share_unique_id;
    share->steps = nodes.steps;
    share->idle_wait = nodes.idle_wait;
    share->keepalive = pool.nodes;
    ranks.nodes = std::move(share);
  }
  std::unique_ptr<CudaM3ModelRunner> r;
  if (kv_cache_bytes > 0) {
    M3_ASSIGN_OR_RETURN(r, CudaM3ModelRunner::create(cfg, src, kv_cache_bytes, o, ranks));
  } else {
    if (!pool.plan_pool_bytes)
      return internal_error("[app.devices] a profiled KV pool needs its planner");
    o.profile_tokens = profile_tokens;
    auto plan = pool.plan_pool_bytes;
    M3_ASSIGN_OR_RETURN(
        r, CudaM3ModelRunner::create_profiled(
               cfg, src,
               [plan](const minimax_m3::CudaMemoryProfile& p) {
                 return plan(MeasuredMemory{p.total_bytes, p.weight_bytes, p.working_bytes,
                                             p.free_bytes});
               },
               o, ranks));
  }
  if (pool.tensor_parallel > 1) {
    // What each GPU holds, as loaded (the windows of the checkpoint it read, in their formats),
    // and under --ep the routed experts it holds.
    // This node's GPUs only, by their rank in the group.
    std::string per_gpu;
    for (int i = 0; i < r->local_ranks(); ++i) {
      const int rank = r->first_rank() + i;
      const minimax_m3::CudaM3Stats st = r->rank_model(i).stats();
      per_gpu += (i == 0 ? "" : ", ") + std::to_string(rank) + ": " +
                 std::to_string(st.weight_bytes) + " weight + " + std::to_string(st.kv_bytes) +
                 " KV bytes";
      if (pool.dp_attention > 1)
        per_gpu += " in DP group " +
                   std::to_string(rank / (pool.tensor_parallel / pool.dp_attention));
      if (pool.expert_parallel > 1) {
        const minimax_m3::ExpertPlacement place = minimax_m3::place_experts(
            cfg, rank, pool.tensor_parallel, pool.expert_parallel);
        per_gpu += " (experts " + std::to_string(place.begin) + "-" +
                   std::to_string(place.begin + place.count - 1) + ")";
      }
    }
    const std::string flags = (pool.expert_parallel > 1
                                ? " --ep " + std::to_string(pool.expert_parallel)
                                : std::string()) +
                           (pool.dp_attention > 1
                                ? " --enable-dp-attention --dp " + std::to_string(pool.dp_attention)
                                : std::string());
    const std::string node =
        pool.nodes ? "node " + std::to_string(pool.nodes->node_rank) + " of " +
                         std::to_string(pool.nodes->nnodes) + ": "
                   : std::string();
    std::fprintf(stderr, "m3serve: --tp %d%s on GPUs (%s%s); all-reduce %s\n",
                 pool.tensor_parallel, flags.c_str(), node.c_str(), per_gpu.c_str(),
                 r->all_reduce_path().c_str());
  }
  return std::unique_ptr<ModelRunner>(std::move(r));
#else
  return Status(StatusCode::kUnimplemented,
                "--device cuda: this m3serve was not built with the CUDA backend");
#endif
}

Result<std::unique_ptr<DraftModel>> make_cuda_dspark_draft(ModelRunner& runner,
                                                           const std::string& draft_dir,
                                                           bool dummy_weights,
                                                           int64_t max_sequences) {
  const std::string flag = "--speculative-draft-model-path '" + draft_dir + "'";
#if defined(M3_HAVE_CUDA)
  // With GPU ranks (--tp, --ep) the draft runs beside rank 0: on its GPU and stream, with its
  // embedding table and lm_head (the other ranks hold their vocabulary slices, rank 0 the whole:
  // CudaKvPoolRequest::whole_vocab_on_rank0), its features rank 0's captured residual stream (the
  // same on every rank after the all-reduces).
  auto* cuda_runner = dynamic_cast<CudaM3ModelRunner*>(&runner);
  if (cuda_runner == nullptr)
    return Status(StatusCode::kUnimplemented,
                  "--speculative-algorithm DSPARK: the GPU draft needs the real-shape CUDA runner");
  namespace fs = std::filesystem;
  const bool has_config = !draft_dir.empty() && fs::exists(fs::path(draft_dir) / "config.json");
  minimax_m3::dspark::DSparkConfig cfg;
  if (has_config) {
    auto c = minimax_m3::dspark::load_dspark_config(draft_dir);
    if (!c.is_ok()) return Status(c.status().code(), flag + ": " + c.status().message());
    cfg = std::move(c).value();
  } else if (dummy_weights) {
    cfg = minimax_m3::dspark::default_dspark_config_for(cuda_runner->model().config());
  } else {
    return Status(StatusCode::kNotFound,
                  flag + ": no DSpark draft there (no config.json); give the draft's directory, "
                         "or use --load-format dummy for random draft weights");
  }
  std::unique_ptr<WeightSource> src;
  if (!dummy_weights) {
    auto ck = Checkpoint::open(draft_dir);
    if (!ck.is_ok()) return Status(ck.status().code(), flag + ": " + ck.status().message());
    src = std::move(ck).value();
  }
  minimax_m3::CudaDSparkOptions o;
  o.max_sequences = std::max<int64_t>(1, max_sequences);
  o.dummy_weights = dummy_weights;
  auto d = minimax_m3::CudaDSparkDraft::load(cfg, &cuda_runner->model(), src.get(),
                                             dummy_weights ? "dummy draft weights" : draft_dir, o);
  if (!d.is_ok()) return Status(d.status().code(), flag + ": " + d.status().message());
  std::fprintf(stderr,
               "m3serve: DSpark draft on the GPU: %lld weight bytes; %lld context bytes per "
               "speculative sequence (at most %lld), taken at its first step; the memory plan "
               "kept them out of the KV pool\n",
               static_cast<long long>((*d)->weight_bytes()),
               static_cast<long long>((*d)->plan().kv_bytes_per_sequence),
               static_cast<long long>(o.max_sequences));
  return std::unique_ptr<DraftModel>(std::move(d).value());
#else
  (void)runner;
  (void)dummy_weights;
  (void)max_sequences;
  return Status(StatusCode::kUnimplemented, flag + ": this m3serve has no CUDA backend");
#endif
}

Result<ImageEncoder> make_cuda_image_encoder(const VisionConfig& config,
                                             const VisionWeights& weights) {
#if defined(M3_HAVE_CUDA)
  // The tower is not thread-safe and the request threads call it: one image at a time. The
  // current device is per thread, so every call selects GPU 0 (the model's first rank).
  struct Shared {
    std::mutex mu;
    std::unique_ptr<CudaVisionTower> tower;
  };
  auto shared = std::make_shared<Shared>();
  M3_RETURN_IF_ERROR(cuda::set_current_device(0));
  M3_ASSIGN_OR_RETURN(shared->tower, CudaVisionTower::create(config, weights));
  return ImageEncoder([shared](std::span<const float> patches, int32_t grid_t, int32_t grid_h,
                               int32_t grid_w) -> Result<std::vector<float>> {
    std::lock_guard<std::mutex> lock(shared->mu);
    M3_RETURN_IF_ERROR(cuda::set_current_device(0));
    const CudaVisionImage image{patches, VisionImageGrid{grid_t, grid_h, grid_w}};
    M3_ASSIGN_OR_RETURN(std::vector<std::vector<float>> out,
                        shared->tower->encode(std::span<const CudaVisionImage>(&image, 1)));
    return std::move(out[0]);
  });
#else
  (void)config;
  (void)weights;
  return unimplemented("the vision tower on the GPU needs a build with CUDA");
#endif
}

minimax_m3::dspark::BlockAttentionFn dspark_block_attention_for(Backend* backend) {
#if defined(M3_HAVE_CUDA)
  if (backend->kind() == DeviceKind::kCuda)
    return minimax_m3::cuda_dspark_block_attention_f32(static_cast<CudaBackend*>(backend));
#endif
  (void)backend;
  return {};
}

}  // namespace m3::app

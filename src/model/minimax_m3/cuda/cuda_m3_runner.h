// The engine's ModelRunner (model/model.h) over CudaM3Model (the real-shape CUDA path): the step's
// slices are CudaM3Model's batch, as for the float32 model's runner. The scheduler's page ids
// index the model's bf16 KV cache directly. Hidden-state capture (a draft model's input) is
// honoured; input embeddings are not available on this path yet (a step asking for them fails
// with kUnimplemented).
//
// Tensor and expert parallelism over the GPUs of this process (--tp N, --ep E;
// CudaTensorParallel in cuda_m3_model.h): one CudaM3Model per rank, rank r on its own GPU. Loading and every step run
// on all ranks at once, rank 0 on the calling (engine) thread and each other rank on a thread of
// its own, since the ranks' collectives must be in flight together. Rank 0's outputs are the
// model's. A collective that does not complete within the communicator's timeout fails the step
// on every rank; the group is then unusable and health() says so.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm/communicator.h"
#include "model/model.h"
#include "model/minimax_m3/cuda/cuda_kv_page_copier.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

struct CUstream_st;

namespace m3 {

// The GPU ranks of a runner.
struct CudaRanks {
  int ranks = 1;
  // --ep: expert-parallel ranks among the `ranks` (divides it; CudaTensorParallel::ep). The KV
  // pool per rank does not depend on it (attention stays split over all ranks).
  int ep = 1;
  std::vector<int> devices;  // rank r's GPU; empty: GPU r
  // Rank r's communicator on its model's compute stream. Empty: NCCL, the group made here from
  // one unique id (comm/nccl_communicator.h) with `timeout` as its watchdog (--dist-timeout).
  std::function<Result<std::unique_ptr<comm::Communicator>>(int rank, int device, CUstream_st*)>
      make_communicator;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // With NCCL: float32 sums of at most this many bytes (the decode step's) take the one-shot
  // all-reduce over peer memory (backend/cuda/comm/one_shot_all_reduce.h); 0: NCCL for all.
  // Where the GPUs cannot reach each other's memory, NCCL for all (all_reduce_path() says so).
  int64_t one_shot_max_bytes = int64_t{2} << 20;
};

class CudaM3ModelRunner final : public ModelRunner {
 public:
  explicit CudaM3ModelRunner(std::unique_ptr<minimax_m3::CudaM3Model> model);
  ~CudaM3ModelRunner() override;

  // Loads the model with as many KV pages as fit in kv_cache_bytes on each rank
  // (options.num_kv_pages is overwritten). invalid_argument from check_real_shape_fit when the
  // config (or a rank's share of it) does not fit.
  static Result<std::unique_ptr<CudaM3ModelRunner>> create(const MiniMaxM3Config& cfg,
                                                           const WeightSource& src,
                                                           int64_t kv_cache_bytes,
                                                           minimax_m3::CudaM3Options options,
                                                           CudaRanks ranks = {});
  // Loads the weights, runs the profile step (options.profile_tokens; CudaM3Options) and makes
  // the pool of `pool_bytes(profile)` bytes (on every rank: the fewest pages any rank can hold).
  static Result<std::unique_ptr<CudaM3ModelRunner>> create_profiled(
      const MiniMaxM3Config& cfg, const WeightSource& src,
      std::function<Result<int64_t>(const minimax_m3::CudaMemoryProfile&)> pool_bytes,
      minimax_m3::CudaM3Options options, CudaRanks ranks = {});

  int32_t vocab_size() const override;
  int32_t hidden_size() const override;
  int32_t num_kv_pages() const override;
  int32_t page_size() const override;
  int32_t num_ranks() const override { return static_cast<int32_t>(models_.size()); }
  // Decode rows the engine offers are sampled on the GPU after the head (only their token ids
  // are copied back); other rows, and the rows of a prefill step, return their logits.
  bool samples_on_device() const override { return true; }
  ModelFeatures features() const override { return {true, true}; }
  // HiCache's page copies over every rank's shard (cuda_kv_page_copier.h), made on first use;
  // null when a copy stream or event cannot be made.
  KvPageCopier* kv_page_copier() override;
  Status forward(const ModelStep& step, ModelOutput& out) override;
  Status health() const override;
  // How the ranks all-reduce, for the startup report ("NCCL", or the one-shot path and its limit).
  const std::string& all_reduce_path() const { return all_reduce_path_; }

  // Rank 0's model (the only one without tensor parallelism).
  minimax_m3::CudaM3Model& model() { return *models_[0]; }
  minimax_m3::CudaM3Model& rank_model(int rank) { return *models_[static_cast<size_t>(rank)]; }

  class RankThreads;

 private:
  CudaM3ModelRunner() = default;
  static Result<std::unique_ptr<CudaM3ModelRunner>> load(const MiniMaxM3Config& cfg,
                                                         const WeightSource& src,
                                                         const minimax_m3::CudaM3Options& options,
                                                         CudaRanks ranks);

  std::vector<std::unique_ptr<minimax_m3::CudaM3Model>> models_;
  std::unique_ptr<minimax_m3::CudaKvPageCopier> copier_;  // made by kv_page_copier()
  std::unique_ptr<RankThreads> threads_;  // ranks 1.. (none without tensor parallelism)
  Status broken_;                          // the error that made the group unusable
  std::string all_reduce_path_ = "none (one GPU)";
};

}  // namespace m3

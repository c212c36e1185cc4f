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
//
// Over several nodes (CudaRanks::nodes, --nnodes) each process holds its node's ranks: the engine's
// process sends every step to the others over a host group (step_channel.h) before running it,
// and the others run each step they receive (follow()), so every rank of every node runs it at
// once and the NCCL collectives meet.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/comm/communicator.h"
#include "model/model.h"
#include "model/step_channel.h"
#include "model/minimax_m3/cuda/cuda_kv_page_copier.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

struct CUstream_st;

namespace m3 {

// GPU ranks over several processes, one per node (--nnodes; app/multi_node.h, join_gpu_nodes):
// this process drives ranks [first, first + count) of CudaRanks::ranks, on its GPUs 0 .. count-1
// (or CudaRanks::devices). Every rank joins one NCCL group with its global rank; the process with
// rank 0 runs the engine and sends each step over `steps` (model/step_channel.h), the others
// follow() them.
struct CudaNodeShare {
  int first = 0;
  int count = 1;
  // Hands the NCCL unique id over the rendezvous: the process with rank 0 passes the id it made
  // and gets it back, the others pass an empty one and get rank 0's (or an error after the
  // rendezvous' timeout).
  std::function<Result<std::vector<char>>(const std::vector<char>& id)> share_unique_id;
  // A host group of one rank per process, the engine's process rank 0.
  std::shared_ptr<comm::Communicator> steps;
  // How long a follower waits for the next step (an idle server).
  std::chrono::milliseconds idle_wait{std::chrono::hours(24 * 365)};
  std::shared_ptr<void> keepalive;  // the rendezvous
};

// The GPU ranks of a runner.
struct CudaRanks {
  int ranks = 1;
  // --ep: expert-parallel ranks among the `ranks` (divides it; CudaTensorParallel::ep). The KV
  // pool per rank does not depend on it (attention stays split over all ranks).
  int ep = 1;
  // --enable-dp-attention --dp: attention groups of ranks / dp consecutive ranks (divides it;
  // CudaTensorParallel::dp). Each rank's pool is its group's (every group has num_kv_pages()
  // pages), its page its group's share of the KV heads; dp_groups() reports it to the engine.
  // Rank 0 still returns every slice's outputs (it holds every group's rows: cuda_m3_model.h).
  int dp = 1;
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
  // Ranks over several processes (null: every rank in this process). The one-shot all-reduce
  // needs every rank's memory mapped into one process: with nodes, NCCL for all.
  std::shared_ptr<const CudaNodeShare> nodes;
  // Rank 0 holds the whole embedding and head for a DSpark draft beside it
  // (CudaTensorParallel::whole_vocab_on_rank0); the others their vocabulary slice.
  bool whole_vocab_on_rank0 = false;
};

class CudaM3ModelRunner final : public ModelRunner, public StepFollower {
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
  // Every rank of the group, in this process or not.
  int32_t num_ranks() const override { return world_; }
  int32_t dp_groups() const override { return dp_; }
  // Decode rows the engine offers are sampled on the GPU after the head (only their token ids
  // are copied back); other rows, and the rows of a prefill step, return their logits.
  bool samples_on_device() const override { return true; }
  ModelFeatures features() const override { return {true, true}; }
  // HiCache's page copies over every rank's shard (cuda_kv_page_copier.h), made on first use;
  // null when a copy stream or event cannot be made.
  KvPageCopier* kv_page_copier() override;
  Status forward(const ModelStep& step, ModelOutput& out) override;
  Status health() const override;
  // A process without rank 0 (CudaRanks::nodes): runs the steps rank 0's process sends on this
  // process's GPUs until it shuts down (ok) or the group breaks (the error, naming the rank).
  Status follow() override;
  // How the ranks all-reduce, for the startup report ("NCCL", or the one-shot path and its limit).
  const std::string& all_reduce_path() const { return all_reduce_path_; }

  // This process's first rank's model (rank 0's, the only one without tensor parallelism, on the
  // engine's process).
  minimax_m3::CudaM3Model& model() { return *models_[0]; }
  // This process's ranks: global ranks first_rank() .. first_rank() + local_ranks() - 1;
  // rank_model takes the index among them.
  minimax_m3::CudaM3Model& rank_model(int local) { return *models_[static_cast<size_t>(local)]; }
  int first_rank() const { return first_rank_; }
  int local_ranks() const { return static_cast<int>(models_.size()); }

  class RankThreads;

 private:
  CudaM3ModelRunner() = default;
  static Result<std::unique_ptr<CudaM3ModelRunner>> load(const MiniMaxM3Config& cfg,
                                                         const WeightSource& src,
                                                         const minimax_m3::CudaM3Options& options,
                                                         CudaRanks ranks);

  std::vector<std::unique_ptr<minimax_m3::CudaM3Model>> models_;
  std::unique_ptr<minimax_m3::CudaKvPageCopier> copier_;  // made by kv_page_copier()
  // This process's ranks (all but the first) on their threads; none with one local rank.
  Status run_local(const ModelStep& step, ModelOutput* out);

  std::unique_ptr<RankThreads> threads_;  // local ranks 1.. (none with one local rank)
  Status broken_;                          // the error that made the group unusable
  int world_ = 1;
  int dp_ = 1;  // attention groups (CudaRanks::dp)
  int first_rank_ = 0;
  std::shared_ptr<const CudaNodeShare> nodes_;  // ranks over several processes
  std::string all_reduce_path_ = "none (one GPU)";
};

}  // namespace m3

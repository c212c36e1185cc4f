// The engine's ModelRunner over the float32 MiniMax-M3 model split over T CPU ranks
// (tensor_parallel.h: tensor and expert parallelism): each rank has its own CPU backend, its
// slices and experts of the weights, its KV heads of every page and a Gloo communicator.
// forward() runs the step on every rank at once and returns rank 0's output; after each
// all-reduce every rank holds the same hidden state, so rank 0's logits are the model's.
//
// Attention data parallelism (dp > 1, --enable-dp-attention --dp): the ranks form dp groups of
// ranks / dp consecutive ranks, each with its own attention communicator and KV pool
// (num_kv_pages() pages per group, each rank holding its heads of its group's pages). Every rank
// receives the whole step; a group runs attention for the slices naming it
// (ModelSlice::dp_group), the feed-forward blocks run on every group's tokens over all ranks
// (model.h), and forward() assembles the output from each group's first rank, in slice order.
//
// Ranks in this process only (the default): rank 0 runs on the engine thread, the others on
// their own threads, which take each step from shared memory. A failing rank fails the step
// with its error; a rank that stops answering fails the others' collectives within the timeout.
//
// Ranks over several processes (--nnodes; `LocalRanks` names this process's share): the process
// with rank 0 (node 0, the engine's) broadcasts each step over the group (step_wire.h), and every
// other rank, here or in another process, waits for it, decodes it and runs it. The other
// processes call follow(), which returns when node 0 shuts down (ok) or the group breaks (the
// error, naming the rank). Once a collective has failed the group is unusable: health() says so
// and the engine fails everything (ModelRunner::health). With dp > 1 the attention groups'
// communicators come with the ranks (LocalRanks::attn_comms, made through the same rendezvous),
// and a group's first rank may live in another process: after each step every rank takes part in
// one all-to-all that sends each group's logits (and captured hidden states) from the group's
// first rank to rank 0.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/comm/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "kv/kv_page_copier.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/model.h"
#include "model/step_channel.h"

namespace m3 {

// This process's ranks of a group spread over processes: ranks [first, first + comms.size()) of
// the group, each with its communicator (the group's size is each communicator's size()).
struct LocalRanks {
  int first = 0;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  // With attention data parallelism (dp > 1) and groups of more than one rank: each local rank's
  // attention-group communicator (rank rank % (size / dp) of size / dp), in the order of comms.
  // Empty otherwise.
  std::vector<std::unique_ptr<comm::Communicator>> attn_comms;
  // How long a rank waits for the next step (an idle server); the collectives of a step use the
  // communicators' own timeout (--dist-timeout).
  std::chrono::milliseconds idle_wait{std::chrono::hours(24 * 365)};
  std::shared_ptr<void> keepalive;  // the rendezvous the communicators were made through
};

class TensorParallelCpuRunner final : public ModelRunner, public StepFollower {
 public:
  // Loads rank r's part of `cfg` / `src` for r in [0, ranks) onto CPU backends of
  // threads_per_rank threads, with KV caches of `num_pages` pages (every rank holds every page,
  // for its KV heads). ep > 1 places the routed experts over ep of the ranks (tensor_parallel.h).
  // dp > 1 splits the ranks into dp attention groups (see above; every group has num_pages
  // pages); it must divide ranks, with the heads split over ranks / dp. kv_dtype: the caches'
  // storage (--kv-cache-dtype; a page-head's scale is per KV head, so a rank's heads quantise as
  // the unsharded model's do). The LM head is split by vocabulary over the ranks; with
  // whole_lm_head_on_rank0 (a DSpark draft on rank 0 reads it) rank 0 loads all of it.
  static Result<std::unique_ptr<TensorParallelCpuRunner>> create(
      const MiniMaxM3Config& cfg, const WeightSource& src, int ranks, int ep, int threads_per_rank,
      int32_t num_pages, int dp = 1, KvCacheDtype kv_dtype = KvCacheDtype::kFloat32,
      bool whole_lm_head_on_rank0 = false);
  // This process's share of a group over several processes (see above). With dp > 1 and groups of
  // more than one rank, local.attn_comms must hold every local rank's group communicator.
  static Result<std::unique_ptr<TensorParallelCpuRunner>> create_distributed(
      const MiniMaxM3Config& cfg, const WeightSource& src, LocalRanks local, int ep,
      int threads_per_rank, int32_t num_pages, int dp = 1,
      KvCacheDtype kv_dtype = KvCacheDtype::kFloat32, bool whole_lm_head_on_rank0 = false);
  ~TensorParallelCpuRunner() override;

  // A process without rank 0: runs the steps node 0 broadcasts until it shuts down (ok) or the
  // group breaks (the first rank's error).
  Status follow() override;

  // Bytes one KV page id takes on every rank together (with dp groups: that page of every group,
  // each rank holding its share of its group's).
  static int64_t bytes_per_page(const MiniMaxM3Config& cfg, int ranks, int dp = 1,
                                KvCacheDtype kv_dtype = KvCacheDtype::kFloat32);

  int32_t vocab_size() const override;
  int32_t hidden_size() const override;
  int32_t num_kv_pages() const override;
  int32_t page_size() const override;
  // Every rank of the group, in this process or not.
  int32_t num_ranks() const override { return static_cast<int32_t>(ranks_[0].comm->size()); }
  int32_t dp_groups() const override { return dp_; }
  ModelFeatures features() const override { return {true, true}; }
  // Bytes of the checkpoint each of this process's ranks read while loading its weights, in rank
  // order from the first local rank (ReadCounter::Scope; 0 for sources that read no file, such
  // as --load-format dummy).
  const std::vector<uint64_t>& weight_bytes_read() const { return bytes_read_; }
  int first_rank() const { return first_rank_; }
  // This process's first rank's model and backend (rank 0 on node 0): a speculative draft runs
  // there, unsplit, next to the sharded target. It reads the target's embedding and final norm
  // (whole on every rank) and its lm_head, which is split by vocabulary over the ranks unless
  // the runner was created with whole_lm_head_on_rank0 (rank 0 then loads all of it and computes
  // its slice in place). Use only between forward() calls: the rank computes inside them.
  const minimax_m3::Model& first_rank_model() const { return *ranks_[0].model; }
  Backend* first_rank_backend() const { return ranks_[0].backend.get(); }
  Status forward(const ModelStep& step, ModelOutput& out) override;
  Status health() const override;
  // HiCache's page copies over every rank's shard (PagedKvCacheCopier); null with attention
  // data-parallel groups or ranks in other processes, whose pages this process cannot copy, and
  // with a quantised KV cache (the tiers copy float32 pages).
  KvPageCopier* kv_page_copier() override { return copier_.get(); }

 private:
  struct Rank {
    std::unique_ptr<comm::Communicator> comm;
    std::unique_ptr<comm::Communicator> attn_comm;  // its attention group's (dp > 1, ranks/dp > 1)
    std::unique_ptr<CpuBackend> backend;
    std::unique_ptr<minimax_m3::Model> model;
    std::unique_ptr<minimax_m3::PagedKvCache> cache;
    ModelOutput out;
    Status status;
  };
  TensorParallelCpuRunner() = default;
  static Result<std::unique_ptr<TensorParallelCpuRunner>> make(
      const MiniMaxM3Config& cfg, const WeightSource& src, LocalRanks local, int ep,
      int threads_per_rank, int32_t num_pages, int dp, KvCacheDtype kv_dtype,
      bool whole_lm_head_on_rank0);
  void worker(size_t r);
  // Distributed: a rank other than the group's rank 0 receives and runs steps until stopped.
  Status receive_steps(size_t r);
  // Distributed with dp > 1: every rank's part of the all-to-all that brings each group's outputs
  // from the group's first rank to rank 0 (whose `out` then holds every slice's).
  Status gather_group_outputs(size_t r, const ModelStep& step, ModelOutput& out);
  void record_failure(const Status& s);

  MiniMaxM3Config cfg_;
  int32_t dp_ = 1;
  std::vector<Rank> ranks_;
  std::vector<uint64_t> bytes_read_;  // per local rank
  std::unique_ptr<KvPageCopier> copier_;
  int first_rank_ = 0;
  bool distributed_ = false;
  std::chrono::milliseconds idle_wait_{0};
  std::shared_ptr<void> keepalive_;
  mutable std::mutex failure_mu_;
  Status failure_;  // the group broke (distributed)
  std::vector<Status> receive_status_;  // per local rank, set when its receive loop ends
  // The step the workers run: published under mu_ with a new generation number.
  std::mutex mu_;
  std::condition_variable start_, done_;
  const ModelStep* step_ = nullptr;
  uint64_t generation_ = 0;
  size_t pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace m3

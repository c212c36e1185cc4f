// The engine's ModelRunner over the float32 MiniMax-M3 model split over T CPU ranks
// (tensor_parallel.h: tensor and expert parallelism) in this process: each rank has its own CPU
// backend, its slices and experts of the weights, its KV heads of every page and a Gloo
// communicator. forward() runs the step on every
// rank at once (rank 0 on the engine thread, the others on their own threads, which wait for the
// next step in between) and returns rank 0's output; after each all-reduce every rank holds the
// same hidden state, so rank 0's logits are the model's. A failing rank fails the step with its
// error; a rank that stops answering fails the others' collectives within the timeout.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/comm/communicator.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/model.h"

namespace m3 {

class TensorParallelCpuRunner final : public ModelRunner {
 public:
  // Loads rank r's part of `cfg` / `src` for r in [0, ranks) onto CPU backends of
  // threads_per_rank threads, with KV caches of `num_pages` pages (every rank holds every page,
  // for its KV heads). ep > 1 places the routed experts over ep of the ranks (tensor_parallel.h).
  static Result<std::unique_ptr<TensorParallelCpuRunner>> create(const MiniMaxM3Config& cfg,
                                                                 const WeightSource& src,
                                                                 int ranks, int ep,
                                                                 int threads_per_rank,
                                                                 int32_t num_pages);
  ~TensorParallelCpuRunner() override;

  // Bytes one KV page takes on every rank together.
  static int64_t bytes_per_page(const MiniMaxM3Config& cfg, int ranks);

  int32_t vocab_size() const override;
  int32_t hidden_size() const override;
  int32_t num_kv_pages() const override;
  int32_t page_size() const override;
  int32_t num_ranks() const override { return static_cast<int32_t>(ranks_.size()); }
  ModelFeatures features() const override { return {true, true}; }
  Status forward(const ModelStep& step, ModelOutput& out) override;

 private:
  struct Rank {
    std::unique_ptr<comm::Communicator> comm;
    std::unique_ptr<CpuBackend> backend;
    std::unique_ptr<minimax_m3::Model> model;
    std::unique_ptr<minimax_m3::PagedKvCache> cache;
    ModelOutput out;
    Status status;
  };
  TensorParallelCpuRunner() = default;
  void worker(size_t r);

  MiniMaxM3Config cfg_;
  std::vector<Rank> ranks_;
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

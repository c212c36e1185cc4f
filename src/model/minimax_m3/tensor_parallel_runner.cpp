#include "model/minimax_m3/tensor_parallel_runner.h"

#include <algorithm>
#include <string>

#include "backend/comm/gloo_communicator.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3 {

int64_t TensorParallelCpuRunner::bytes_per_page(const MiniMaxM3Config& cfg, int ranks) {
  // Every rank holds the same number of KV heads (replicated past their count).
  CpuBackend probe_backend(1);
  minimax_m3::PagedKvCache probe(&probe_backend, minimax_m3::rank_config(cfg, 0, ranks), 1);
  return probe.bytes_per_page() * ranks;
}

Result<std::unique_ptr<TensorParallelCpuRunner>> TensorParallelCpuRunner::create(
    const MiniMaxM3Config& cfg, const WeightSource& src, int ranks, int ep, int threads_per_rank,
    int32_t num_pages) {
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, ranks, ep));
  if (num_pages <= 0) {
    return invalid_argument("[model.minimax_m3.tensor_parallel_runner] KV cache of " +
                            std::to_string(num_pages) + " pages");
  }
  M3_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<comm::Communicator>> comms,
                      comm::create_local_gloo_group(ranks));
  std::unique_ptr<TensorParallelCpuRunner> r(new TensorParallelCpuRunner());
  r->cfg_ = cfg;
  r->ranks_.resize(static_cast<size_t>(ranks));
  for (int i = 0; i < ranks; ++i) {
    Rank& k = r->ranks_[static_cast<size_t>(i)];
    k.comm = std::move(comms[static_cast<size_t>(i)]);
    k.backend = std::make_unique<CpuBackend>(std::max(1, threads_per_rank));
    M3_ASSIGN_OR_RETURN(k.model, minimax_m3::Model::load(cfg, src, k.backend.get(),
                                                         {i, ranks, k.comm.get(), ep}));
    k.cache = std::make_unique<minimax_m3::PagedKvCache>(k.backend.get(), k.model->config(),
                                                         num_pages);
  }
  for (size_t i = 1; i < r->ranks_.size(); ++i) {
    r->workers_.emplace_back([p = r.get(), i] { p->worker(i); });
  }
  return r;
}

TensorParallelCpuRunner::~TensorParallelCpuRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TensorParallelCpuRunner::worker(size_t r) {
  uint64_t seen = 0;
  while (true) {
    const ModelStep* step = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      step = step_;
    }
    Rank& k = ranks_[r];
    k.status = k.model->forward(step->slices, k.cache.get(), &k.out, step->capture_layers);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_.notify_all();
  }
}

Status TensorParallelCpuRunner::forward(const ModelStep& step, ModelOutput& out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = &step;
    pending_ = ranks_.size() - 1;
    ++generation_;
  }
  start_.notify_all();
  Rank& first = ranks_[0];
  Status s = first.model->forward(step.slices, first.cache.get(), &out, step.capture_layers);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    step_ = nullptr;
  }
  if (!s.is_ok()) return s;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    if (!ranks_[r].status.is_ok()) return ranks_[r].status;
  }
  return Status::ok();
}

int32_t TensorParallelCpuRunner::vocab_size() const {
  return static_cast<int32_t>(cfg_.vocab_size);
}
int32_t TensorParallelCpuRunner::hidden_size() const {
  return static_cast<int32_t>(cfg_.hidden_size);
}
int32_t TensorParallelCpuRunner::num_kv_pages() const {
  return static_cast<int32_t>(ranks_[0].cache->num_pages());
}
int32_t TensorParallelCpuRunner::page_size() const {
  return static_cast<int32_t>(ranks_[0].cache->page_size());
}

}  // namespace m3

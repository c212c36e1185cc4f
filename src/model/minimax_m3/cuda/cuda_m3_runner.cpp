#include "model/minimax_m3/cuda/cuda_m3_runner.h"

#include <algorithm>
#include <condition_variable>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_budget.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "backend/cuda/comm/one_shot_all_reduce.h"
#if defined(M3_HAVE_NCCL)
#include "backend/cuda/comm/nccl_communicator.h"
#include "backend/cuda/comm/one_shot_communicator.h"
#endif

namespace m3 {

// Ranks 1 .. N-1 each on a thread of its own, waiting for the next job; run() gives every rank
// the same job, runs rank 0's on the calling thread and returns once all are done (the first
// failing rank's error, by rank order).
class CudaM3ModelRunner::RankThreads {
 public:
  explicit RankThreads(int ranks) : slots_(static_cast<size_t>(ranks)) {
    for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status run(const std::function<Status(int rank)>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
      pending_ = static_cast<int>(threads_.size());
    }
    cv_.notify_all();
    slots_[0] = job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    for (const Status& s : slots_)
      if (!s.is_ok()) return s;
    return Status::ok();
  }

 private:
  void loop(int rank) {
    uint64_t seen = 0;
    while (true) {
      const std::function<Status(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      Status s = (*job)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(rank)] = std::move(s);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::vector<Status> slots_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<Status(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

CudaM3ModelRunner::CudaM3ModelRunner(std::unique_ptr<minimax_m3::CudaM3Model> model) {
  models_.push_back(std::move(model));
}
CudaM3ModelRunner::~CudaM3ModelRunner() {
  // Rank 0's process stopping cleanly tells the others, which then exit 0 (a broken group has no
  // one to tell).
  if (nodes_ && first_rank_ == 0 && broken_.is_ok()) (void)send_step(*nodes_->steps, nullptr);
}

KvPageCopier* CudaM3ModelRunner::kv_page_copier() {
  if (copier_ == nullptr) {
    std::vector<minimax_m3::CudaM3Model*> ranks;
    for (auto& m : models_) ranks.push_back(m.get());
    auto c = minimax_m3::CudaKvPageCopier::create(std::move(ranks));
    if (!c.is_ok()) return nullptr;
    copier_ = std::move(c).value();
  }
  return copier_.get();
}

Result<std::unique_ptr<CudaM3ModelRunner>> CudaM3ModelRunner::load(
    const MiniMaxM3Config& cfg, const WeightSource& src, const minimax_m3::CudaM3Options& options,
    CudaRanks ranks) {
  const int n = ranks.ranks;  // every rank of the group
  if (n < 1 || n > 64)
    return invalid_argument("[model.minimax_m3.cuda.runner] --tp " + std::to_string(n) +
                            " outside [1, 64]");
  // This process's ranks: [first, first + local) (all of them without nodes).
  const CudaNodeShare* nodes = ranks.nodes.get();
  const int first = nodes ? nodes->first : 0;
  const int local = nodes ? nodes->count : n;
  if (nodes && (local < 1 || first < 0 || first + local > n || !nodes->steps))
    return invalid_argument("[model.minimax_m3.cuda.runner] ranks " + std::to_string(first) +
                            ".." + std::to_string(first + local - 1) + " of " +
                            std::to_string(n) + " over several processes need their step group");
  if (!ranks.devices.empty() && static_cast<int>(ranks.devices.size()) != local)
    return invalid_argument("[model.minimax_m3.cuda.runner] " +
                            std::to_string(ranks.devices.size()) + " devices for " +
                            std::to_string(local) + " ranks");
  if (ranks.ep < 1 || n % ranks.ep != 0)
    return invalid_argument("[model.minimax_m3.cuda.runner] --ep " + std::to_string(ranks.ep) +
                            " must divide --tp " + std::to_string(n));
  if (ranks.dp < 1 || n % ranks.dp != 0)
    return invalid_argument("[model.minimax_m3.cuda.runner] --dp " + std::to_string(ranks.dp) +
                            " must divide --tp " + std::to_string(n));
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, n, ranks.ep, ranks.dp));
  for (int r = 0; r < n; ++r) M3_RETURN_IF_ERROR(minimax_m3::check_real_shape_fit(
                                  minimax_m3::rank_config(cfg, r, n, ranks.ep, ranks.dp)));
  std::vector<int> devices = ranks.devices;  // by local rank
  for (int r = static_cast<int>(devices.size()); r < local; ++r) devices.push_back(r);
  auto comm_for = ranks.make_communicator;
  std::string path = n > 1 ? "the caller's communicator" : "none (one GPU)";
  // The one-shot group the ranks' communicators use, if any: the models fuse their decode
  // all-reduces with the norms after them through it (CudaTensorParallel::one_shot).
  std::shared_ptr<cuda::OneShotAllReduce> fused_one_shot;
  if (n > 1 && !comm_for) {
#if defined(M3_HAVE_NCCL)
    // One unique id for the whole group: made here, or over several processes by rank 0's and
    // handed to the others through the rendezvous.
    comm::NcclUniqueId id;
    if (first == 0) {
      M3_ASSIGN_OR_RETURN(id, comm::make_nccl_unique_id());
    }
    if (nodes) {
      if (!nodes->share_unique_id)
        return invalid_argument("[model.minimax_m3.cuda.runner] NCCL over several processes "
                                "needs the unique id's exchange");
      std::vector<char> mine;
      if (first == 0) mine.assign(id.bytes.begin(), id.bytes.end());
      M3_ASSIGN_OR_RETURN(const std::vector<char> shared, nodes->share_unique_id(mine));
      if (shared.size() != id.bytes.size())
        return internal_error("[model.minimax_m3.cuda.runner] the NCCL unique id from the "
                              "rendezvous has " + std::to_string(shared.size()) + " bytes, not " +
                              std::to_string(id.bytes.size()));
      std::copy(shared.begin(), shared.end(), id.bytes.begin());
    }
    const auto timeout = ranks.timeout;
    // Small float32 sums over peer memory where every pair of GPUs reaches the other's.
    std::shared_ptr<cuda::OneShotAllReduce> one_shot;
    path = "NCCL";
    if (nodes) {
      // The one-shot kernel reads every rank's staging buffer through peer memory: it needs
      // every rank in this process. Ranks on other nodes sum over NCCL only.
      path = "NCCL (ranks " + std::to_string(first) + ".." + std::to_string(first + local - 1) +
             " of " + std::to_string(n) + " here, the others in other processes: the one-shot "
             "all-reduce over peer memory needs every rank in one process)";
    } else if (ranks.one_shot_max_bytes >= 16) {
      cuda::OneShotOptions so;
      so.max_elements = ranks.one_shot_max_bytes / 16 * 4;
      so.timeout = timeout;
      Result<std::shared_ptr<cuda::OneShotAllReduce>> g = cuda::OneShotAllReduce::create(devices, so);
      if (g.is_ok()) {
        one_shot = std::move(g).value();
        path = "one-shot over peer memory up to " + std::to_string(so.max_elements * 4 / 1024) +
               " KiB, NCCL above";
        if (options.kernels.fused_all_reduce_norm) {
          fused_one_shot = one_shot;
          path += "; decode all-reduces fused with the norm after them";
        }
      } else if (g.status().code() == StatusCode::kUnavailable) {
        path = "NCCL (" + g.status().message() + ")";
      } else {
        return g.status();
      }
    }
    comm_for = [id, n, timeout, one_shot](int rank, int device,
                                          CUstream_st* stream) -> Result<std::unique_ptr<comm::Communicator>> {
      comm::NcclOptions o;
      o.timeout = timeout;
      M3_ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> c,
                          comm::create_nccl_communicator(rank, n, device, id, stream, o));
      if (one_shot == nullptr) return c;
      return comm::with_one_shot_all_reduce(std::move(c), one_shot, stream);
    };
#else
    return Status(StatusCode::kUnimplemented,
                  "[model.minimax_m3.cuda.runner] --tp " + std::to_string(n) +
                      " on GPUs needs NCCL, which this m3serve was built without");
#endif
  }
  std::unique_ptr<CudaM3ModelRunner> runner(new CudaM3ModelRunner());
  runner->all_reduce_path_ = path;
  runner->world_ = n;
  runner->dp_ = ranks.dp;
  runner->first_rank_ = first;
  runner->nodes_ = ranks.nodes;
  runner->models_.resize(static_cast<size_t>(local));
  if (local > 1) runner->threads_ = std::make_unique<RankThreads>(local);
  // The pool planner may log; the ranks call it one at a time.
  std::mutex plan_mu;
  // Local rank i is rank first + i of the group.
  const auto load_rank = [&](int i) -> Status {
    const int r = first + i;
    minimax_m3::CudaM3Options o = options;
    o.device = devices[static_cast<size_t>(i)];
    o.tp.rank = r;
    o.tp.ranks = n;
    o.tp.ep = ranks.ep;
    o.tp.dp = ranks.dp;
    o.tp.one_shot = fused_one_shot;
    o.tp.whole_vocab_on_rank0 = ranks.whole_vocab_on_rank0;
    if (n > 1) {
      const int device = o.device;
      o.tp.make_communicator = [&comm_for, r, device](CUstream_st* stream) {
        return comm_for(r, device, stream);
      };
    }
    if (options.kv_pages_after_profile) {
      o.kv_pages_after_profile = [&](const minimax_m3::CudaMemoryProfile& p) {
        std::lock_guard<std::mutex> lock(plan_mu);
        return options.kv_pages_after_profile(p);
      };
    }
    M3_ASSIGN_OR_RETURN(runner->models_[static_cast<size_t>(i)],
                        minimax_m3::CudaM3Model::load(cfg, src, o));
    return Status::ok();
  };
  if (local == 1) {
    M3_RETURN_IF_ERROR(load_rank(0));
  } else {
    M3_RETURN_IF_ERROR(runner->threads_->run(load_rank));
  }
  return runner;
}

Result<std::unique_ptr<CudaM3ModelRunner>> CudaM3ModelRunner::create(
    const MiniMaxM3Config& cfg, const WeightSource& src, int64_t kv_cache_bytes,
    minimax_m3::CudaM3Options options, CudaRanks ranks) {
  // Fit first: the page arithmetic below assumes the real shapes.
  M3_RETURN_IF_ERROR(minimax_m3::check_real_shape_fit(cfg));
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, ranks.ranks, ranks.ep, ranks.dp));
  M3_ASSIGN_OR_RETURN(int32_t pages,
                      kv_pages_for_budget(kv_cache_bytes, minimax_m3::CudaM3Model::kv_bytes_per_page(
                                                              cfg, ranks.ranks, ranks.ep,
                                                              options.kv_cache_dtype, ranks.dp)));
  options.num_kv_pages = pages;
  options.kv_pages_after_profile = nullptr;
  return load(cfg, src, options, std::move(ranks));
}

Result<std::unique_ptr<CudaM3ModelRunner>> CudaM3ModelRunner::create_profiled(
    const MiniMaxM3Config& cfg, const WeightSource& src,
    std::function<Result<int64_t>(const minimax_m3::CudaMemoryProfile&)> pool_bytes,
    minimax_m3::CudaM3Options options, CudaRanks ranks) {
  M3_RETURN_IF_ERROR(minimax_m3::check_real_shape_fit(cfg));
  M3_RETURN_IF_ERROR(minimax_m3::check_tensor_parallel(cfg, ranks.ranks, ranks.ep, ranks.dp));
  const int64_t page_bytes =
      minimax_m3::CudaM3Model::kv_bytes_per_page(cfg, ranks.ranks, ranks.ep,
                                                 options.kv_cache_dtype, ranks.dp);
  options.num_kv_pages = 0;
  options.kv_pages_after_profile =
      [pool_bytes = std::move(pool_bytes),
       page_bytes](const minimax_m3::CudaMemoryProfile& p) -> Result<int64_t> {
    M3_ASSIGN_OR_RETURN(const int64_t bytes, pool_bytes(p));
    M3_ASSIGN_OR_RETURN(const int32_t pages, kv_pages_for_budget(bytes, page_bytes));
    return int64_t{pages};
  };
  return load(cfg, src, options, std::move(ranks));
}

int32_t CudaM3ModelRunner::vocab_size() const {
  return static_cast<int32_t>(models_[0]->config().vocab_size);
}
int32_t CudaM3ModelRunner::num_kv_pages() const {
  return static_cast<int32_t>(models_[0]->num_kv_pages());
}
int32_t CudaM3ModelRunner::page_size() const {
  return static_cast<int32_t>(models_[0]->page_size());
}

int32_t CudaM3ModelRunner::hidden_size() const {
  return static_cast<int32_t>(models_[0]->config().hidden_size);
}

Status CudaM3ModelRunner::health() const { return broken_; }

Status CudaM3ModelRunner::run_local(const ModelStep& step, ModelOutput* out) {
  if (models_.size() == 1) return models_[0]->forward(step.slices, out, step.capture_layers);
  // Every rank runs the step; the other ranks' outputs are empty (no head).
  std::vector<ModelOutput> others(models_.size());
  return threads_->run([&](int i) {
    // Every rank captures too, so that all take the same path (the same collectives).
    return models_[static_cast<size_t>(i)]->forward(
        step.slices, i == 0 ? out : &others[static_cast<size_t>(i)], step.capture_layers);
  });
}

Status CudaM3ModelRunner::forward(const ModelStep& step, ModelOutput& out) {
  if (!broken_.is_ok()) return broken_;
  if (world_ == 1) return models_[0]->forward(step.slices, &out, step.capture_layers);
  if (first_rank_ != 0)
    return internal_error("[model.minimax_m3.cuda.runner] forward() on a process without rank 0 "
                          "(it follows rank 0's process)");
  // Over several processes the others get the step first: their ranks' collectives must meet
  // this process's.
  Status s = nodes_ ? send_step(*nodes_->steps, &step) : Status::ok();
  if (s.is_ok()) s = run_local(step, &out);
  // A collective that failed (a rank died or stopped calling: kUnavailable) leaves the group
  // unusable; an invalid step (checked on every rank alike before anything runs) does not.
  if (s.code() == StatusCode::kUnavailable) broken_ = s;
  return s;
}

Status CudaM3ModelRunner::follow() {
  if (!nodes_ || first_rank_ == 0)
    return internal_error("[model.minimax_m3.cuda.runner] follow() needs ranks in another process "
                          "than rank 0's");
  ModelOutput unused;  // a rank other than 0 computes no head
  for (;;) {
    Result<std::optional<WireStep>> step = receive_step(*nodes_->steps, nodes_->idle_wait);
    if (!step.is_ok()) {
      broken_ = step.status();
      return broken_;
    }
    if (!step->has_value()) return Status::ok();  // rank 0's process shut down
    unused = {};
    const Status s = run_local((*step)->step, &unused);
    // A bad step fails every rank alike (rank 0's process reports it to its requests) and the
    // group stays usable; a failed collective breaks it.
    if (s.code() == StatusCode::kUnavailable) {
      broken_ = s;
      return s;
    }
  }
}

}  // namespace m3

#include "core/thread_pool.h"

#include <algorithm>
#include <exception>

namespace m3 {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads_ = std::max(1, num_threads);
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool ThreadPool::run_one_chunk() {
  int64_t begin, end;
  const std::function<void(int64_t, int64_t)>* fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_ == nullptr || next_ >= job_n_) return false;
    begin = next_;
    end = std::min(job_n_, begin + chunk_);
    next_ = end;
    ++pending_;
    fn = job_;
  }
  std::exception_ptr err;
  try {
    (*fn)(begin, end);
  } catch (...) {
    err = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (err && !error_) error_ = err;
    --pending_;
    if (pending_ == 0 && next_ >= job_n_) cv_done_.notify_all();
  }
  return true;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
    }
    while (run_one_chunk()) {
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t max_chunks = static_cast<int64_t>(num_threads_) * 4;
  int64_t chunk = std::max(min_chunk, (n + max_chunks - 1) / max_chunks);
  bool nested;
  {
    std::lock_guard<std::mutex> lock(mu_);
    nested = in_job_;
    if (!nested) in_job_ = true;
  }
  if (num_threads_ == 1 || chunk >= n || nested) {
    // Serial path. A nested call, or a call from a second thread while a job runs, also lands
    // here, so it is safe (just not parallel).
    if (!nested) {
      std::lock_guard<std::mutex> lock(mu_);
      in_job_ = false;
    }
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    chunk_ = chunk;
    next_ = 0;
    pending_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  cv_work_.notify_all();
  while (run_one_chunk()) {
  }
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_ == 0 && next_ >= job_n_; });
    job_ = nullptr;
    err = error_;
    error_ = nullptr;
    in_job_ = false;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace m3

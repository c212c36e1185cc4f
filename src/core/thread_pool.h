// A small fixed-size thread pool with a blocking parallel_for, used by the CPU backend.
// Work is split into contiguous index ranges; which thread runs a range never changes a result
// (callers compute each output element in a fixed order), so results do not depend on the
// number of threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace m3 {

class ThreadPool {
 public:
  // num_threads <= 0 picks std::thread::hardware_concurrency(). The calling thread also works,
  // so a pool of N runs N-1 background threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over [0, n) split into at most num_threads() * 4 contiguous chunks of at
  // least `min_chunk` indices; blocks until every chunk is done. Not reentrant: fn must not call
  // parallel_for on the same pool (nested calls run inline, serially). An exception thrown by fn
  // is rethrown here after all chunks finish.
  void parallel_for(int64_t n, int64_t min_chunk,
                    const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void worker_loop();
  bool run_one_chunk();  // returns false when no chunk was left

  int num_threads_ = 1;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  bool stop_ = false;

  // The job in flight (guarded by mu_).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t chunk_ = 1;
  int64_t next_ = 0;
  int64_t pending_ = 0;  // chunks handed out and not finished
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool in_job_ = false;
};

}  // namespace m3

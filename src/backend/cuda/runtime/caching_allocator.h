// A caching device allocator for one stream. cudaMalloc/cudaFree synchronise the device and cost
// tens of microseconds, so freed blocks are kept in size-keyed free lists and handed out again;
// after warm-up a decode loop that asks for the same sizes never reaches cudaMalloc.
//
// Stream-ordering: every block is used only by work on the owner's single stream, and a block is
// freed on the host after that work was enqueued, so work enqueued later on the same stream by its
// next owner is ordered after the previous owner's work. (Multi-stream use would need events.)
//
// Sizes are rounded up: to 512 B below 1 MiB, to 2 MiB above. A cached block is reused for a
// request of at most its size and at least half its size (so big blocks are not wasted on small
// requests). When cudaMalloc fails, every cached block is released and the call retried once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace m3::cuda {

struct AllocatorStats {
  int64_t bytes_in_use = 0;     // handed out and not yet freed (rounded sizes)
  int64_t bytes_cached = 0;     // held in free lists
  int64_t peak_in_use = 0;
  int64_t num_device_allocs = 0;  // cudaMalloc calls that succeeded
  int64_t num_cache_hits = 0;
};

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // resource_exhausted when the device has no room even after emptying the cache.
  Result<void*> allocate(int64_t bytes);
  // Returns a block to the cache. Freeing a pointer this allocator did not hand out is an
  // internal error (M3_CHECK). free(nullptr) is a no-op.
  void free(void* p);
  // cudaFree of every cached block (not of blocks in use).
  void release_cached();
  AllocatorStats stats() const;

  static int64_t round_size(int64_t bytes);

 private:
  mutable std::mutex mu_;
  std::multimap<int64_t, void*> free_;           // size -> block
  std::unordered_map<void*, int64_t> in_use_;    // block -> size
  AllocatorStats stats_;
};

// Scratch for one step or call: blocks from `a`, all returned (stream-ordered, as above) when it
// goes out of scope.
class ScopedScratch {
 public:
  explicit ScopedScratch(CachingAllocator* a) : a_(a) {}
  ~ScopedScratch() {
    for (void* p : ptrs_) a_->free(p);
  }
  ScopedScratch(const ScopedScratch&) = delete;
  ScopedScratch& operator=(const ScopedScratch&) = delete;
  // `count` elements (at least one), uninitialised.
  template <typename T>
  Result<T*> get(int64_t count) {
    M3_ASSIGN_OR_RETURN(void* p, a_->allocate(std::max<int64_t>(count, 1) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  CachingAllocator* a_;
  std::vector<void*> ptrs_;
};

}  // namespace m3::cuda

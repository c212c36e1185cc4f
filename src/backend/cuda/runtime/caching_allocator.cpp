#include "backend/cuda/runtime/caching_allocator.h"

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

CachingAllocator::~CachingAllocator() {
  release_cached();
  // Blocks still in use at destruction belong to leaked DeviceBuffers; free them anyway.
  for (auto& [p, size] : in_use_) cudaFree(p);
}

int64_t CachingAllocator::round_size(int64_t bytes) {
  if (bytes <= 0) bytes = 1;
  constexpr int64_t kSmall = 512, kLarge = int64_t{2} << 20, kLargeFrom = int64_t{1} << 20;
  int64_t unit = bytes < kLargeFrom ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

Result<void*> CachingAllocator::allocate(int64_t bytes) {
  const int64_t size = round_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    void* p = it->second;
    int64_t got = it->first;
    free_.erase(it);
    stats_.bytes_cached -= got;
    in_use_[p] = got;
    stats_.bytes_in_use += got;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
    ++stats_.num_cache_hits;
    return p;
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, static_cast<size_t>(size));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state of the runtime
    for (auto& [s, q] : free_) cudaFree(q);
    free_.clear();
    stats_.bytes_cached = 0;
    e = cudaMalloc(&p, static_cast<size_t>(size));
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::kResourceExhausted,
                  "[cuda.allocator] cudaMalloc of " + std::to_string(size) + " bytes failed: " +
                      cudaGetErrorString(e) + " (in use " + std::to_string(stats_.bytes_in_use) +
                      " bytes)");
  }
  in_use_[p] = size;
  stats_.bytes_in_use += size;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
  ++stats_.num_device_allocs;
  return p;
}

void CachingAllocator::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  M3_CHECK(it != in_use_.end(), "[cuda.allocator] free of a pointer not allocated here");
  free_.emplace(it->second, p);
  stats_.bytes_in_use -= it->second;
  stats_.bytes_cached += it->second;
  in_use_.erase(it);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, q] : free_) cudaFree(q);
  free_.clear();
  stats_.bytes_cached = 0;
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace m3::cuda

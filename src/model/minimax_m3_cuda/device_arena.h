// Owned device memory for the real-shape model: weights, the KV cache and the decode buffers are
// allocated once at load (cudaMalloc) and freed together. Not for per-step scratch (that goes
// through cuda::CachingAllocator). Host code; includes the CUDA runtime header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/status.h"

namespace m3::minimax_m3 {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena() {
    for (void* p : blocks_) cudaFree(p);
  }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `count` zero-filled elements; resource_exhausted (naming `what`) when the device is full.
  template <typename T>
  Result<T*> alloc(int64_t count, const std::string& what) {
    const size_t bytes = static_cast<size_t>(count < 1 ? 1 : count) * sizeof(T);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      return Status(StatusCode::kResourceExhausted, "[model.minimax_m3_cuda] cudaMalloc of " +
                                                        std::to_string(bytes) + " bytes for " +
                                                        what + " failed: " + cudaGetErrorString(e));
    }
    blocks_.push_back(p);
    e = cudaMemset(p, 0, bytes);
    if (e != cudaSuccess) return cuda::cuda_error(e, "cudaMemset", __FILE__, __LINE__);
    bytes_ += static_cast<int64_t>(bytes);
    return static_cast<T*>(p);
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<void*> blocks_;
  int64_t bytes_ = 0;
};

}  // namespace m3::minimax_m3

// Device memory and copies for host code outside the kernels (the model, the runners): owned
// allocations made once at load (DeviceArena), page-locked host staging (PinnedHostBuffer) and the
// copies, fills and synchronisations a model step needs. Every call returns a Status naming the
// CUDA call that failed. This header includes no CUDA header (streams are CUstream_st*, which is
// what cudaStream_t names).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// Owned device memory: weights, the KV cache and the decode buffers, allocated once at load and
// freed together. Not for per-step scratch (that goes through CachingAllocator).
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `count` zero-filled elements; resource_exhausted (naming `what`) when the device is full.
  template <typename T>
  Result<T*> alloc(int64_t count, const std::string& what) {
    const size_t bytes = static_cast<size_t>(count < 1 ? 1 : count) * sizeof(T);
    M3_ASSIGN_OR_RETURN(void* p, alloc_bytes(bytes, what));
    return static_cast<T*>(p);
  }
  int64_t bytes() const { return bytes_; }

 private:
  Result<void*> alloc_bytes(size_t bytes, const std::string& what);
  std::vector<void*> blocks_;
  int64_t bytes_ = 0;
};

// Page-locked host memory, grown on demand and never shrunk. From pageable memory the driver
// stages each copy in pieces; page-locked copies go straight to the device.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  ~PinnedHostBuffer();
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  // At least `bytes` bytes. Growing frees the old buffer after `in_use_by` finishes (the copies
  // queued on it may still read or write it).
  Result<uint8_t*> reserve(size_t bytes, CUstream_st* in_use_by);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Stream-ordered copies (page-locked host memory makes them asynchronous to the host).
Status copy_to_device_async(void* dst, const void* src, size_t bytes, CUstream_st* stream);
Status copy_to_host_async(void* dst, const void* src, size_t bytes, CUstream_st* stream);
Status copy_device_to_device_async(void* dst, const void* src, size_t bytes, CUstream_st* stream);
// `rows` rows of `row_bytes` bytes from src (rows `src_pitch` bytes apart) to dst (`dst_pitch`
// apart), device to device: a strided block, such as one rank's columns of a [rows, V] matrix.
Status copy_device_to_device_2d_async(void* dst, size_t dst_pitch, const void* src,
                                      size_t src_pitch, size_t row_bytes, size_t rows,
                                      CUstream_st* stream);
Status fill_zero_async(void* dst, size_t bytes, CUstream_st* stream);
// Synchronous copy from pageable host memory and fill, on the legacy default stream (which a
// non-blocking stream does not wait for: call synchronize_device before the first step).
Status copy_to_device(void* dst, const void* src, size_t bytes);
Status fill_zero(void* dst, size_t bytes);
// Waits for all work on the current device.
Status synchronize_device();
// Waits for the work queued on `stream`.
Status synchronize_stream(CUstream_st* stream);

// The current device's free and total memory as the driver reports them (cudaMemGetInfo): what
// every process and this one's context, allocations and caches leave free.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0, total_bytes = 0;
};
Result<DeviceMemoryInfo> device_memory_info();
// Makes `device` current for the calling thread (the current device is per thread).
Status set_current_device(int device);

}  // namespace m3::cuda

#include "backend/cuda/runtime/device_memory.h"

#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

DeviceArena::~DeviceArena() {
  for (void* p : blocks_) cudaFree(p);
}

Result<void*> DeviceArena::alloc_bytes(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the error state of the failed allocation
    return Status(StatusCode::kResourceExhausted, "[cuda.device_arena] cudaMalloc of " +
                                                      std::to_string(bytes) + " bytes for " +
                                                      what + " failed: " + cudaGetErrorString(e));
  }
  blocks_.push_back(p);
  M3_CUDA_RETURN_IF_ERROR(cudaMemset(p, 0, bytes));
  bytes_ += static_cast<int64_t>(bytes);
  return p;
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

Result<uint8_t*> PinnedHostBuffer::reserve(size_t bytes, CUstream_st* in_use_by) {
  if (bytes > bytes_) {
    if (data_ != nullptr) {
      M3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(in_use_by));
      cudaFreeHost(data_);
      data_ = nullptr;
      bytes_ = 0;
    }
    M3_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data_, bytes));
    bytes_ = bytes;
  }
  return static_cast<uint8_t*>(data_);
}

Status copy_to_device_async(void* dst, const void* src, size_t bytes, CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
  return Status::ok();
}

Status copy_to_host_async(void* dst, const void* src, size_t bytes, CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  return Status::ok();
}

Status copy_device_to_device_async(void* dst, const void* src, size_t bytes, CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  return Status::ok();
}

Status copy_device_to_device_2d_async(void* dst, size_t dst_pitch, const void* src,
                                      size_t src_pitch, size_t row_bytes, size_t rows,
                                      CUstream_st* stream) {
  if (rows == 0 || row_bytes == 0) return Status::ok();
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                            cudaMemcpyDeviceToDevice, stream));
  return Status::ok();
}

Status copy_to_device(void* dst, const void* src, size_t bytes) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return Status::ok();
}

Status fill_zero_async(void* dst, size_t bytes, CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, bytes, stream));
  return Status::ok();
}

Status fill_zero(void* dst, size_t bytes) {
  M3_CUDA_RETURN_IF_ERROR(cudaMemset(dst, 0, bytes));
  return Status::ok();
}

Result<DeviceMemoryInfo> device_memory_info() {
  size_t free_bytes = 0, total_bytes = 0;
  M3_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceMemoryInfo{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

Status synchronize_device() {
  M3_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

Status synchronize_stream(CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return Status::ok();
}

Status set_current_device(int device) {
  M3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return Status::ok();
}

}  // namespace m3::cuda

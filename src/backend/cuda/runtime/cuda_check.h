// Error checks for CUDA runtime and cuBLASLt calls. Expected failures (out of memory, a device
// that is not sm_90, a launch that does not fit) become m3::Status values naming the call, the
// file and the line; M3_CUDA_CHECK is for calls whose failure means the device state is broken
// (it throws m3::InternalError, caught at a step boundary).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/status.h"

namespace m3::cuda {

Status cuda_error(cudaError_t e, const char* expr, const char* file, int line);
Status cublas_error(cublasStatus_t s, const char* expr, const char* file, int line);

}  // namespace m3::cuda

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define M3_CUDA_RETURN_IF_ERROR(expr)                                                  \
  do {                                                                                 \
    cudaError_t m3_cuda_err_ = (expr);                                                 \
    if (m3_cuda_err_ != cudaSuccess)                                                   \
      return ::m3::cuda::cuda_error(m3_cuda_err_, #expr, __FILE__, __LINE__);          \
  } while (0)

// After a kernel launch: configuration errors (bad grid, too much shared memory) show up here.
#define M3_CUDA_RETURN_IF_LAUNCH_ERROR(kernel_name) \
  M3_CUDA_RETURN_IF_ERROR((static_cast<void>(kernel_name), cudaGetLastError()))

#define M3_CUBLAS_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                 \
    cublasStatus_t m3_cublas_st_ = (expr);                                             \
    if (m3_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                        \
      return ::m3::cuda::cublas_error(m3_cublas_st_, #expr, __FILE__, __LINE__);       \
  } while (0)

// For calls that must not fail (device state broken otherwise): throws m3::InternalError.
#define M3_CUDA_CHECK(expr)                                                            \
  do {                                                                                 \
    cudaError_t m3_cuda_err_ = (expr);                                                 \
    if (m3_cuda_err_ != cudaSuccess)                                                   \
      ::m3::check_failed(__FILE__, __LINE__, #expr, cudaGetErrorString(m3_cuda_err_)); \
  } while (0)

// Status -> InternalError, for the void-returning Backend ops.
#define M3_CHECK_OK(expr)                                                          \
  do {                                                                             \
    ::m3::Status m3_st_ = (expr);                                                  \
    if (!m3_st_.is_ok()) ::m3::check_failed(__FILE__, __LINE__, #expr, m3_st_.to_string()); \
  } while (0)

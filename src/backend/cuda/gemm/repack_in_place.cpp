#include "backend/cuda/gemm/repack_in_place.h"

#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

Status repack_in_place(uint8_t* w, int64_t groups, int64_t bytes,
                       const std::function<Status(const uint8_t* src, uint8_t* dst)>& repack,
                       CUstream_st* stream) {
  void* tmp = nullptr;
  M3_CUDA_RETURN_IF_ERROR(cudaMalloc(&tmp, static_cast<size_t>(bytes)));
  Status st = Status::ok();
  for (int64_t g = 0; g < groups && st.is_ok(); ++g) {
    uint8_t* m = w + g * bytes;
    const cudaError_t e = cudaMemcpyAsync(tmp, m, static_cast<size_t>(bytes),
                                          cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) {
      st = cuda_error(e, "cudaMemcpyAsync", __FILE__, __LINE__);
      break;
    }
    st = repack(static_cast<const uint8_t*>(tmp), m);
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  cudaFree(tmp);
  if (!st.is_ok()) return st;
  if (sync != cudaSuccess) return cuda_error(sync, "cudaStreamSynchronize", __FILE__, __LINE__);
  return Status::ok();
}

}  // namespace m3::cuda

// Selection of every causal block for dense (full-attention) prefill rows; see sparse_prefill.h.
#include <algorithm>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

__global__ void dense_selection_kernel(const int32_t* __restrict__ positions, int64_t n,
                                       int64_t groups, int64_t page_size, int64_t top_k,
                                       int32_t* __restrict__ selected) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / (groups * top_k), slot = i % top_k;
    const int64_t qb = positions[t] / page_size;
    selected[i] = slot <= qb ? static_cast<int32_t>(qb - slot) : -1;
  }
}

}  // namespace

Status launch_dense_selection(const int32_t* positions, int64_t t, int64_t groups,
                              int64_t page_size, int64_t top_k, int32_t* selected,
                              CUstream_st* stream) {
  const int64_t n = t * groups * top_k;
  if (n == 0) return Status::ok();
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
  dense_selection_kernel<<<blocks, 256, 0, stream>>>(positions, n, groups, page_size, top_k,
                                                      selected);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(dense_selection_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

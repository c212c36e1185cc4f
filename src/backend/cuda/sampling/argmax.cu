#include "backend/cuda/sampling/argmax.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

// One block per row; thread-strided scan, then warp and block argmax.
__global__ void __launch_bounds__(kThreads) argmax_kernel(ArgmaxParams p) {
  __shared__ float s_v[32];
  __shared__ int64_t s_i[32];
  const int64_t b = blockIdx.x;
  const float* row = p.logits + b * p.ld;
  float bv = -INFINITY;
  int64_t bi = INT64_MAX;
  for (int64_t i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = row[i];
    if (better(v, i, bv, bi)) bv = v, bi = i;  // NaN compares false: never taken
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s_v[warp] = bv, s_i[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w)
      if (better(s_v[w], s_i[w], bv, bi)) bv = s_v[w], bi = s_i[w];
    p.out[b] = bi == INT64_MAX ? -1 : static_cast<int32_t>(bi);
  }
}

}  // namespace

Status launch_argmax(const ArgmaxParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  if (p.vocab <= 0 || p.ld < p.vocab)
    return invalid_argument("[cuda.argmax] bad vocab / row stride");
  argmax_kernel<<<static_cast<unsigned>(p.batch), kThreads, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(argmax_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

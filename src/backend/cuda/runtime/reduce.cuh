// Warp and block reductions shared by the kernels.
#pragma once

#include <cuda_runtime.h>

namespace m3::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the block with `op` (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. `smem` holds 32 floats. Synchronises the block.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, float* smem, Op op, float identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : identity;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float block_sum(float v, float* smem) {
  return block_reduce(v, smem, [](float a, float b) { return a + b; }, 0.0f);
}

// NaN-ignoring like fmaxf.
__device__ __forceinline__ float block_max(float v, float* smem) {
  return block_reduce(v, smem, [](float a, float b) { return fmaxf(a, b); }, -INFINITY);
}

// The power of two 2^s that brings a row of largest magnitude m into [2^14, 2^15) (f16 keeps
// every bf16 value of the row exactly, down to 2^-31 of m), as s; 0 for m = 0 or non-finite m.
__device__ __forceinline__ int f16_row_shift(float m) {
  if (!(m > 0.0f) || !isfinite(m)) return 0;
  int e = 0;
  frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1)
  return min(15 - e, 126);
}

}  // namespace m3::cuda

#include "backend/cuda/gemm/x_f16.h"

#include <cuda_fp16.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA per row: the largest magnitude, then the scaled conversion (8 elements per step).
__global__ void __launch_bounds__(kThreads) x_to_f16_kernel(XToF16Params p) {
  __shared__ float red[32];
  pdl_launch_dependents();  // a following PDL GEMV (kMmaDirect) may start streaming its weights
  const int64_t r = blockIdx.x;
  const uint4* x = reinterpret_cast<const uint4*>(p.x + r * p.ldx);
  const int64_t nv = p.k / 8;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    const uint4 v = __ldg(x + i);
    for (uint32_t w : {v.x, v.y, v.z, v.w})
      m = fmaxf(m, fmaxf(fabsf(bf16_to_f32(uint16_t(w))), fabsf(bf16_to_f32(uint16_t(w >> 16)))));
  }
  m = block_max(m, red);
  const int sh = f16_row_shift(m);
  const float s = ldexpf(1.0f, sh);
  if (threadIdx.x == 0) p.inv_scale[r] = ldexpf(1.0f, -sh);
  uint4* out = reinterpret_cast<uint4*>(p.out + r * p.ldo);
  for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
    const uint4 v = __ldg(x + i);
    uint32_t o[4];
    const uint32_t in[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2 h = __floats2half2_rn(bf16_to_f32(uint16_t(in[j])) * s,
                                          bf16_to_f32(uint16_t(in[j] >> 16)) * s);
      o[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    out[i] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

}  // namespace

Status launch_x_to_f16(const XToF16Params& p, CUstream_st* stream) {
  if (p.rows == 0) return Status::ok();
  if (p.k <= 0 || p.k % 8 != 0 || p.ldx % 8 != 0 || p.ldo % 8 != 0 ||
      (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.out) & 15) != 0)
    return invalid_argument("[cuda.x_to_f16] k, row strides and pointers must be multiples of 8 "
                            "elements / 16 bytes (k = " + std::to_string(p.k) + ")");
  x_to_f16_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(x_to_f16_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

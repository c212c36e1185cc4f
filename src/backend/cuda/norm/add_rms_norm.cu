#include "backend/cuda/norm/add_rms_norm.h"

#include <cuda_fp16.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

// 1024 threads, at most 2 float4 each: every load of a row (residual, delta or its partial
// sources, weight) is issued before the first reduction, so a row costs about one memory latency
// plus the reductions (batch 1 runs one CTA; it was ~5 us with 256 threads and serial loads).
constexpr int kThreads = 1024;
constexpr int kMaxVecPerThread = 2;  // hidden <= 1024 · 2 · 4 = 8192

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float4 mul4(float4 a, float s) {
  return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s), __fmul_rn(a.w, s));
}

// Element group i (float4) of row t's delta from the fused source: the split-K sum in slice order
// from 0 (gemv_epilogue_kernel's order) or the MoE combine in slot order (moe_combine_kernel's
// order, the first product not added to 0).
__device__ __forceinline__ float4 fused_delta(const AddRmsNormParams& p, int64_t t, int64_t i,
                                              int64_t nv) {
  if (p.delta_partial != nullptr) {
    const float4* src = reinterpret_cast<const float4*>(p.delta_partial) + t * nv + i;
    const int64_t plane = p.t * nv;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int64_t s = 0; s < p.delta_slices; ++s) a = add4(a, __ldcg(src + s * plane));
    return a;
  }
  const float4* c = reinterpret_cast<const float4*>(p.moe_contrib) + t * p.moe_top_k * nv + i;
  float4 o = mul4(__ldcg(c), p.moe_weights[t * p.moe_top_k]);
#pragma unroll 4
  for (int64_t s = 1; s < p.moe_top_k; ++s)
    o = add4(o, mul4(__ldcg(c + s * nv), p.moe_weights[t * p.moe_top_k + s]));
  if (p.moe_shared != nullptr)
    o = add4(o, __ldcg(reinterpret_cast<const float4*>(p.moe_shared) + t * nv + i));
  return o;
}

// One block per token; each thread keeps its float4 pieces of the row in registers between the
// sum of squares and the scaling, so the row is read once.
__global__ void __launch_bounds__(kThreads) add_rms_norm_kernel(AddRmsNormParams p) {
  pdl_launch_dependents();  // a following PDL GEMV may start streaming its weights
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int64_t nv = p.hidden / 4;
  float4* r = reinterpret_cast<float4*>(p.residual + t * p.hidden);
  const float4* d = p.delta ? reinterpret_cast<const float4*>(p.delta + t * p.hidden) : nullptr;
  const bool has_delta = d != nullptr || p.delta_partial != nullptr || p.moe_contrib != nullptr;
  float4 v[kMaxVecPerThread];
  uint2 wv[kMaxVecPerThread];
  const uint2* w = reinterpret_cast<const uint2*>(p.weight);
  // The weight depends on no kernel: requested before the wait for the previous one (a no-op
  // without the programmatic launch attribute).
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) wv[j] = w[i];
  }
  pdl_wait();
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) {
      float4 x = r[i];
      if (has_delta) {
        const float4 y = d ? d[i] : fused_delta(p, t, i, nv);
        x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        r[i] = x;
      }
      v[j] = x;
      ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
    }
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.hidden) + p.eps);
  uint2* o = reinterpret_cast<uint2*>(p.out + t * p.hidden);
  uint2 ob[kMaxVecPerThread];  // the bf16 outputs, kept for the f16 copy
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) {
      const float w0 = 1.0f + __uint_as_float(wv[j].x << 16), w1 = 1.0f + __uint_as_float(wv[j].x & 0xFFFF0000u);
      const float w2 = 1.0f + __uint_as_float(wv[j].y << 16), w3 = 1.0f + __uint_as_float(wv[j].y & 0xFFFF0000u);
      const uint32_t a = f32_to_bf16(v[j].x * inv * w0) | (uint32_t(f32_to_bf16(v[j].y * inv * w1)) << 16);
      const uint32_t b = f32_to_bf16(v[j].z * inv * w2) | (uint32_t(f32_to_bf16(v[j].w * inv * w3)) << 16);
      ob[j] = make_uint2(a, b);
      o[i] = ob[j];
      for (uint32_t u : {a, b})
        m = fmaxf(m, fmaxf(fabsf(bf16_to_f32(uint16_t(u))), fabsf(bf16_to_f32(uint16_t(u >> 16)))));
    }
  }
  if (p.out_f16 == nullptr) return;
  m = block_max(m, red);
  const int sh = f16_row_shift(m);
  const float s = ldexpf(1.0f, sh);
  if (threadIdx.x == 0) p.out_inv_scale[t] = ldexpf(1.0f, -sh);
  uint2* of = reinterpret_cast<uint2*>(p.out_f16 + t * p.hidden);
#pragma unroll
  for (int j = 0; j < kMaxVecPerThread; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < nv) {
      uint32_t h[2];
      const uint32_t in[2] = {ob[j].x, ob[j].y};
      for (int q = 0; q < 2; ++q) {
        const __half2 v2 = __floats2half2_rn(bf16_to_f32(uint16_t(in[q])) * s,
                                             bf16_to_f32(uint16_t(in[q] >> 16)) * s);
        h[q] = *reinterpret_cast<const uint32_t*>(&v2);
      }
      of[i] = make_uint2(h[0], h[1]);
    }
  }
}

}  // namespace

Status launch_add_rms_norm(const AddRmsNormParams& p, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  if (p.hidden % 4 != 0 || p.hidden > int64_t{kThreads} * kMaxVecPerThread * 4)
    return invalid_argument("[cuda.add_rms_norm] hidden " + std::to_string(p.hidden) +
                            " must be a multiple of 4 and at most 8192");
  if ((p.out_f16 == nullptr) != (p.out_inv_scale == nullptr))
    return invalid_argument("[cuda.add_rms_norm] out_f16 and out_inv_scale go together");
  const int sources = (p.delta != nullptr) + (p.delta_partial != nullptr) + (p.moe_contrib != nullptr);
  if (sources > 1)
    return invalid_argument("[cuda.add_rms_norm] at most one of delta, delta_partial, moe_contrib");
  if (p.delta_partial != nullptr && p.delta_slices < 1)
    return invalid_argument("[cuda.add_rms_norm] delta_partial needs delta_slices >= 1");
  if (p.moe_contrib != nullptr && (p.moe_weights == nullptr || p.moe_top_k < 1))
    return invalid_argument("[cuda.add_rms_norm] moe_contrib needs moe_weights and moe_top_k >= 1");
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, add_rms_norm_kernel, dim3(static_cast<unsigned>(p.t)),
                                        dim3(kThreads), 0, stream, p));
  return Status::ok();
}

}  // namespace m3::cuda

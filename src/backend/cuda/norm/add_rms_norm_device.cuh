// Device pieces of the fused residual add + Gemma RMSNorm (norm/add_rms_norm.h), shared by its
// one-CTA and cluster kernels (add_rms_norm.cu): the delta sources, the scaled bf16 output and
// its f16 copy.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/norm/add_rms_norm.h"
#include "core/dtype.h"

namespace m3::cuda::norm {

// CTAs per row of the cluster kernels (a row's float4 pieces split into 8 contiguous ranges).
constexpr int kClusterCtas = 8;

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float4 mul4(float4 a, float s) {
  return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s), __fmul_rn(a.w, s));
}

// Element group i (float4) of row t's delta from the fused source: the split-K sum in slice order
// from 0 (gemv_epilogue_kernel's order) or the MoE combine in slot order (moe_combine_kernel's
// order, the first product not added to 0).
// Sources up to this many (split-K slices, MoE slots) are all requested before the first sum:
// with the loop below the loads went out one L2 round trip after another (the MoE-combine norm
// took ~6.7 us at batch 1 against ~3 us for a stored delta; H200 trace). The sums keep their
// order, so the bits are the loop's.
constexpr int kHoistedSources = 8;

__device__ __forceinline__ float4 fused_delta(const AddRmsNormParams& p, int64_t t, int64_t i,
                                              int64_t nv) {
  if (p.delta_partial != nullptr) {
    const float4* src = reinterpret_cast<const float4*>(p.delta_partial) + t * nv + i;
    const int64_t plane = p.t * nv;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (p.delta_slices <= kHoistedSources) {
      float4 v[kHoistedSources];
#pragma unroll
      for (int s = 0; s < kHoistedSources; ++s)
        if (s < p.delta_slices) v[s] = __ldcg(src + s * plane);
#pragma unroll
      for (int s = 0; s < kHoistedSources; ++s)
        if (s < p.delta_slices) a = add4(a, v[s]);
      return a;
    }
#pragma unroll 4
    for (int64_t s = 0; s < p.delta_slices; ++s) a = add4(a, __ldcg(src + s * plane));
    return a;
  }
  const int64_t k = p.moe_top_k;
  const float4* c = reinterpret_cast<const float4*>(p.moe_contrib) + t * k * nv + i;
  const float* w = p.moe_weights + t * k;
  const float4* sh =
      p.moe_shared != nullptr ? reinterpret_cast<const float4*>(p.moe_shared) + t * nv + i : nullptr;
  float4 o;
  if (k <= kHoistedSources) {
    float4 v[kHoistedSources];
    float wv[kHoistedSources];
#pragma unroll
    for (int s = 0; s < kHoistedSources; ++s)
      if (s < k) v[s] = __ldcg(c + s * nv), wv[s] = w[s];
    const float4 shv = sh != nullptr ? __ldcg(sh) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    o = mul4(v[0], wv[0]);
#pragma unroll
    for (int s = 1; s < kHoistedSources; ++s)
      if (s < k) o = add4(o, mul4(v[s], wv[s]));
    if (sh != nullptr) o = add4(o, shv);
    return o;
  }
  o = mul4(__ldcg(c), w[0]);
#pragma unroll 4
  for (int64_t s = 1; s < k; ++s) o = add4(o, mul4(__ldcg(c + s * nv), w[s]));
  if (sh != nullptr) o = add4(o, __ldcg(sh));
  return o;
}

// residual + delta at float4 i of row t (the residual alone without a delta).
__device__ __forceinline__ float4 row_piece(const AddRmsNormParams& p, const float4* r,
                                            const float4* d, bool has_delta, int64_t t, int64_t i,
                                            int64_t nv) {
  float4 x = r[i];
  if (has_delta) {
    const float4 y = d ? d[i] : fused_delta(p, t, i, nv);
    x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
  return x;
}

// bf16(x · inv · (1 + w)) of a float4 piece with its bf16 weights wv, as two bf16 pairs.
__device__ __forceinline__ uint2 norm_piece(float4 x, float inv, uint2 wv) {
  const float w0 = 1.0f + __uint_as_float(wv.x << 16), w1 = 1.0f + __uint_as_float(wv.x & 0xFFFF0000u);
  const float w2 = 1.0f + __uint_as_float(wv.y << 16), w3 = 1.0f + __uint_as_float(wv.y & 0xFFFF0000u);
  const uint32_t a = f32_to_bf16(x.x * inv * w0) | (uint32_t(f32_to_bf16(x.y * inv * w1)) << 16);
  const uint32_t b = f32_to_bf16(x.z * inv * w2) | (uint32_t(f32_to_bf16(x.w * inv * w3)) << 16);
  return make_uint2(a, b);
}

__device__ __forceinline__ float abs_max_bf16x4(uint2 o, float m) {
  for (uint32_t u : {o.x, o.y})
    m = fmaxf(m, fmaxf(fabsf(bf16_to_f32(uint16_t(u))), fabsf(bf16_to_f32(uint16_t(u >> 16)))));
  return m;
}

// The f16 copy of a bf16 piece times 2^sh (s = 2^sh: exact, x_f16.h's rule).
__device__ __forceinline__ uint2 f16_piece(uint2 o, float s) {
  uint32_t h[2];
  const uint32_t in[2] = {o.x, o.y};
  for (int q = 0; q < 2; ++q) {
    const __half2 v2 = __floats2half2_rn(bf16_to_f32(uint16_t(in[q])) * s,
                                         bf16_to_f32(uint16_t(in[q] >> 16)) * s);
    h[q] = *reinterpret_cast<const uint32_t*>(&v2);
  }
  return make_uint2(h[0], h[1]);
}

}  // namespace m3::cuda::norm

// Device code of the per-head Gemma RMSNorm + partial half-split RoPE (qk_norm_rope.h describes
// the math), shared by qk_norm_rope.cu and attention_inputs.cu so that both produce the same bits:
// one function, one lane layout, one float operation order. CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda::qk_norm {

constexpr int kHeadDim = 128;     // D: lane l holds dims l, l + 32, l + 64, l + 96
constexpr int kMaxHalfFreq = 64;  // rotary_dim / 2 <= 64

// The frequency table f[i] = theta^(-2i/rotary_dim), i < rotary_dim / 2, in float, built on the
// host exactly as the CPU backend builds it.
inline void build_inv_freq(double theta, int64_t rotary_dim, float (&inv_freq)[kMaxHalfFreq]) {
  for (int64_t i = 0; i < rotary_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    inv_freq[i] = 1.0f / static_cast<float>(std::pow(theta, static_cast<double>(e)));
  }
}

// What one lane needs of a head besides its values, all independent of them (so that a kernel can
// get it before it waits for the values' writer): the norm weight's factors (1 + w_d) and the
// rotation's cos / sin of the lane's dims d = lane + 32 j.
struct HeadFactors {
  float w[4];
  float cs[4], sn[4];  // only for d < rot_width
};

__device__ __forceinline__ void head_factors(const uint16_t* weight, float pos,
                                             const float (&inv_freq)[kMaxHalfFreq],
                                             int64_t rotary_dim, int64_t rot_width, int lane,
                                             HeadFactors& f) {
  const int64_t half_freq = rotary_dim / 2;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int d = lane + 32 * j;
    f.w[j] = __fadd_rn(1.0f, bf16_to_f32(weight[d]));
    f.cs[j] = 1.0f, f.sn[j] = 0.0f;
    if (d < rot_width) {
      const float ang = __fmul_rn(inv_freq[d % half_freq], pos);
      double sn, cs;
      sincos(static_cast<double>(ang), &sn, &cs);
      f.cs[j] = static_cast<float>(cs), f.sn[j] = static_cast<float>(sn);
    }
  }
}

// One head of one token, by one warp: v[j] = x[lane + 32 j] (float32) in, out[j] = the bf16
// bits of dim lane + 32 j out, with the factors of head_factors. `y` is the warp's own 128
// floats of shared memory (RoPE partners d ± rot_width/2 are read through it). Every lane of the
// warp must call it.
//   ss  = warp_sum(fma(v3, v3, fma(v2, v2, fma(v1, v1, fma(v0, v0, 0)))))   (lane-local, butterfly)
//   inv = 1 / sqrt(ss / 128 + eps)
//   y_d = (x_d · inv) · (1 + w_d)
//   r_d = y_d · cos + (d < half ? -y_{d+half} : y_{d-half}) · sin   for d < rot_width, angle
//         fl(f[d mod rotary_dim/2] · pos), sin/cos in double then rounded to float; else y_d
// Every operation is written as an explicit fma or rounding intrinsic, so the compiler has no
// contraction choice and every caller gets the same bits. They are what the plain expressions of
// the original kernel compiled to (its PTX: fma.rn(ss, 2^-7, eps), sqrt.rn, rcp.rn, mul.rn; the
// default -prec-div / -prec-sqrt / -fmad).
__device__ __forceinline__ void norm_rope_finish(const float (&v)[4], const HeadFactors& f,
                                                 float eps, int64_t rot_width,
                                                 float (&y)[kHeadDim], int lane,
                                                 uint16_t (&out)[4]) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) ss = fmaf(v[j], v[j], ss);
  ss = warp_sum(ss);
  const float inv = __frcp_rn(__fsqrt_rn(fmaf(ss, 1.0f / 128.0f, eps)));
#pragma unroll
  for (int j = 0; j < 4; ++j) y[lane + 32 * j] = __fmul_rn(__fmul_rn(v[j], inv), f.w[j]);
  __syncwarp();
  const int64_t half = rot_width / 2;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int d = lane + 32 * j;
    float r = y[d];
    if (d < rot_width) {
      const float partner = d < half ? -y[d + half] : y[d - half];
      r = __fadd_rn(__fmul_rn(r, f.cs[j]), __fmul_rn(partner, f.sn[j]));
    }
    out[j] = f32_to_bf16(r);
  }
}

// Both in one call (for kernels with nothing to wait for in between).
__device__ __forceinline__ void norm_rope_head(const float (&v)[4], const uint16_t* weight,
                                               float eps, float pos,
                                               const float (&inv_freq)[kMaxHalfFreq],
                                               int64_t rotary_dim, int64_t rot_width,
                                               float (&y)[kHeadDim], int lane,
                                               uint16_t (&out)[4]) {
  HeadFactors f;
  head_factors(weight, pos, inv_freq, rotary_dim, rot_width, lane, f);
  norm_rope_finish(v, f, eps, rot_width, y, lane, out);
}

}  // namespace m3::cuda::qk_norm

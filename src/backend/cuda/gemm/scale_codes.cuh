// Exact device decodes of the quantised formats' codes to float: E4M3 (MXFP8 values, NVFP4 block
// scales), E8M0 (MXFP8 block scales) and E2M1 (NVFP4 values). Every result is representable in
// float, so a product with a scale is exact where the format promises it (quant_gemv.h); and the
// scaling of an f16x2 pair to bf16x2.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace m3::cuda {

// E4M3 (bias 7, no infinities, S.1111.111 = NaN) to float, exact.
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t e = (b >> 3) & 0xF, m = b & 7;
  float v;
  if ((b & 0x7F) == 0x7F) {
    v = __int_as_float(0x7FC00000);
  } else if (e == 0) {
    v = static_cast<float>(m) * 0.001953125f;  // m/8 · 2^-6
  } else {
    v = __int_as_float(static_cast<int>(((e + 120) << 23) | (m << 20)));
  }
  return (b & 0x80) ? -v : v;
}

// E8M0 2^(s - 127); 0xFF is NaN.
__device__ __forceinline__ float e8m0_to_float(uint32_t s) {
  if (s == 0xFF) return __int_as_float(0x7FC00000);
  if (s == 0) return __int_as_float(0x00400000);  // 2^-127 (subnormal)
  return __int_as_float(static_cast<int>(s << 23));
}

// E2M1: sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float e2m1_to_float(uint32_t c) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMag[c & 7];
  return (c & 8) ? -v : v;
}

// f16x2 times a float scale, rounded to bf16x2: how the NVFP4 f16 fragments (codes x 2^-14)
// become bf16 weights; exact when the scale carries the 2^14 (a code has at most 2 significant
// bits, an E4M3 scale 4).
__device__ __forceinline__ uint32_t scale_to_bf16x2(uint32_t h2, float s) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * s, f.y * s);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// An E4M3 block scale times 2^112 in both halves of a bf16x2 (exact: 4 significant bits between
// 2^103 and 2^121): the multiplier of nvfp4_mma::fragment_bf16's codes x 2^-126, so that one bf16
// multiply (mul_bf16x2) gives the exact weight x 2^-14; whoever takes the product applies the 2^14.
__device__ __forceinline__ uint32_t e4m3_to_bf16x2_x2p112(uint32_t b) {
  // Without branches (it runs in the register-weights GEMM's main loop). E4M3's exponent and
  // mantissa bits moved to f16's positions are the value x 2^-8, subnormals included: normal
  // 2^(e-15)(1 + m/8) against 2^(e-7)(1 + m/8), subnormal m/8 x 2^-14 against m/8 x 2^-6.
  // f16 -> float, x 2^120 and float -> bf16 (4 significant bits) are exact. NaN stays NaN.
  const uint32_t h = ((b & 0x7F) << 7) | ((b & 0x80) << 8);
  const float v = __half2float(__ushort_as_half(static_cast<unsigned short>(h))) * 0x1p120f;
  const uint32_t bits = (b & 0x7F) == 0x7F
                            ? (0x7FC0u | (b & 0x80) << 8)
                            : static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  return bits | bits << 16;
}

// a x b on bf16x2 bit patterns, rounded to nearest (exact for the products above: at most 6
// significant bits, and the subnormal code 2^-127 in a is an input, never a result).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

}  // namespace m3::cuda

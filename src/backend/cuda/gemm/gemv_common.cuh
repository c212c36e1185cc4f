// Device pieces shared by the GEMV kernels (quant_gemv.h): the per-format lane shapes of the
// CUDA-core kernels, the streaming load and the dequantisation helpers.
//
// Dequantisation without tensor cores, with few integer operations per element:
//  * MXFP8: cvt.rn.f16x2.e4m3x2 (two codes per instruction, exact), f16 -> f32 (exact); the E8M0
//    block scale (a power of two) multiplies the 16-element partial sum.
//  * NVFP4: two E2M1 codes n_i, n_{i+4} of a 32-bit word become one f16x2 by shifting: magnitude
//    bits (e1 e0 m) to f16 bits 9-11 and the sign to bit 15, giving f16 values e2m1 · 2^-14
//    (exact; e = 0 lands on f16 subnormals, which is right); f16 -> f32 is exact and the 2^14
//    is folded into the block factor. The E4M3 block scales are converted two at a time.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda::gemv {

template <QuantFormat F>
struct FormatTraits;
template <>
struct FormatTraits<QuantFormat::kMxfp8> {
  static constexpr int kElemsPerLane = 16;            // one 16-byte load
  static constexpr int kSlice = 32 * kElemsPerLane;   // 512
  static constexpr int kBits = 8;
  static constexpr int kScaleBlock = 32;
};
template <>
struct FormatTraits<QuantFormat::kNvfp4> {
  static constexpr int kElemsPerLane = 32;
  static constexpr int kSlice = 32 * kElemsPerLane;   // 1024
  static constexpr int kBits = 4;
  static constexpr int kScaleBlock = 16;
};
template <>
struct FormatTraits<QuantFormat::kBf16> {
  static constexpr int kElemsPerLane = 8;
  static constexpr int kSlice = 32 * kElemsPerLane;   // 256
  static constexpr int kBits = 16;
  static constexpr int kScaleBlock = 0;               // no scales
};

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float2 e4m3x2_to_float2(uint16_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(two));
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

// f16x2 of (n_i, n_{i+4}) of word w, scaled by 2^-14 (see the file comment).
template <int I>
__device__ __forceinline__ float2 e2m1_pair(uint32_t w) {
  constexpr int kMag = 9 - 4 * I, kSign = 12 - 4 * I;
  const uint32_t mag = (kMag >= 0 ? (w << kMag) : (w >> -kMag)) & 0x0E000E00u;
  const uint32_t sign = (kSign >= 0 ? (w << kSign) : (w >> -kSign)) & 0x80008000u;
  uint32_t h = mag | sign;
  return __half22float2(*reinterpret_cast<__half2*>(&h));
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xFFFF0000u); }

}  // namespace m3::cuda::gemv

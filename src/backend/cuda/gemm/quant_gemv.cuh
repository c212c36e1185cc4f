// Device pieces of the CUDA-core GEMVs (see quant_gemv.h for the contract): the per-format lane
// shapes, the streaming load, the dequantisation helpers (shared with variant 3,
// quant_gemv_v3.cuh), and the BF16 kernel (variant 2).
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

constexpr int kWarps = 8;

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

// Dot product of one lane's 8 BF16 weights with MT activation rows.
template <QuantFormat F, int MT>
struct LaneDot;

template <int MT>
struct LaneDot<QuantFormat::kBf16, MT> {
  __device__ __forceinline__ static uint32_t load_scale(const uint8_t*, int64_t) { return 0; }
  __device__ __forceinline__ static void run(uint4 wv, const uint8_t*, int64_t, float g,
                                             const float (&x)[MT][8], float (&out)[MT]) {
    run_scaled(wv, 0, g, x, out);
  }
  __device__ __forceinline__ static void run_scaled(uint4 wv, uint32_t, float,
                                                    const float (&x)[MT][8], float (&out)[MT]) {
    const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float a = bf16_lo(words[q]), b = bf16_hi(words[q]);
#pragma unroll
      for (int m = 0; m < MT; ++m) out[m] = fmaf(b, x[m][2 * q + 1], fmaf(a, x[m][2 * q], out[m]));
    }
  }
};

// Variant 2, the BF16 GEMV (the lm_head at one row and the router above 32 rows; 579 us for the
// lm_head at one row on the H200, 88 % of HBM): a warp owns a K-slice of kRowsV2 = 4 weight rows
// and keeps its lane's slice of MT activation rows in registers; the 4 rows' loads are issued
// before the first is used, and the lane partial sums are reduced by one transposing butterfly
// (6 shuffles per 4 rows and activation row instead of 20). Lane 0 of each row writes
// partial[s, r, n]; the epilogue sums the slices.
constexpr int kRowsV2 = 4;  // MXFP8 / BF16; NVFP4 uses 2 (registers)

template <QuantFormat F>
__host__ __device__ constexpr int rows_v2() { return F == QuantFormat::kNvfp4 ? 2 : kRowsV2; }

template <QuantFormat F, int MT>
__global__ void __launch_bounds__(kWarps * 32, 2) quant_gemv_kernel_v2(QuantGemvParams p) {
  using T = FormatTraits<F>;
  constexpr int E = T::kElemsPerLane;
  constexpr int kRowsV2 = rows_v2<F>();
  constexpr int kLog2RowsV2 = kRowsV2 == 4 ? 2 : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t num_slices = p.k / T::kSlice;
  const int64_t row_tiles = (p.n + kRowsV2 - 1) / kRowsV2;
  const int64_t wid = blockIdx.x * int64_t{kWarps} + warp;
  if (wid >= row_tiles * num_slices) return;
  const int64_t tile = wid / num_slices, s = wid % num_slices;
  int64_t g = 0, r_begin = 0, r_end = p.num_rows;
  if (p.group_offsets != nullptr) {
    g = p.active_groups[blockIdx.y];
    if (g < 0) return;
    r_begin = p.group_offsets[g];
    r_end = p.group_offsets[g + 1];
  }
  const int64_t row_bytes = p.k * T::kBits / 8;
  const int64_t scale_cols = T::kScaleBlock > 0 ? p.k / T::kScaleBlock : 0;
  const uint8_t* wg = p.w + g * p.n * row_bytes;
  const uint8_t* sg = T::kScaleBlock > 0 ? p.w_scale + g * p.n * scale_cols : nullptr;
  float gf = 1.0f;
  if constexpr (F == QuantFormat::kNvfp4) gf = (p.w_global ? p.w_global[g] : 1.0f) * 16384.0f;
  const int64_t k0 = s * T::kSlice + int64_t{lane} * E;
  const int64_t n0 = tile * kRowsV2;
  const int rows_here = static_cast<int>(p.n - n0 < kRowsV2 ? p.n - n0 : kRowsV2);

  // Issue every weight and scale load of the tile first: they do not depend on the activations.
  uint4 wv[kRowsV2];
  uint32_t sc[kRowsV2];
  const uint8_t* wp = wg + n0 * row_bytes + k0 * T::kBits / 8;
  const uint8_t* sp = sg ? sg + n0 * scale_cols : nullptr;
#pragma unroll
  for (int u = 0; u < kRowsV2; ++u) {
    const bool ok = u < rows_here;
    wv[u] = ok ? ld_stream(wp) : make_uint4(0, 0, 0, 0);
    sc[u] = ok && sp ? LaneDot<F, MT>::load_scale(sp, k0) : 0u;
    wp += row_bytes;
    if (sp) sp += scale_cols;
  }
  for (int64_t r0 = r_begin; r0 < r_end; r0 += MT) {
    float x[MT][E];
    int64_t rid[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const bool valid = r0 + m < r_end;
      rid[m] = valid ? (p.sorted_rows ? p.sorted_rows[r0 + m] : r0 + m) : -1;
      const int64_t xr = valid ? rid[m] / p.x_row_div : 0;
      const uint4* src = reinterpret_cast<const uint4*>(p.x + xr * p.ldx + k0);
#pragma unroll
      for (int v = 0; v < E / 8; ++v) {
        const uint4 b = valid ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
        x[m][8 * v + 0] = bf16_lo(b.x), x[m][8 * v + 1] = bf16_hi(b.x);
        x[m][8 * v + 2] = bf16_lo(b.y), x[m][8 * v + 3] = bf16_hi(b.y);
        x[m][8 * v + 4] = bf16_lo(b.z), x[m][8 * v + 5] = bf16_hi(b.z);
        x[m][8 * v + 6] = bf16_lo(b.w), x[m][8 * v + 7] = bf16_hi(b.w);
      }
    }
    float part[MT][kRowsV2];
#pragma unroll
    for (int u = 0; u < kRowsV2; ++u) {
      float out[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) out[m] = 0.0f;
      LaneDot<F, MT>::run_scaled(wv[u], sc[u], gf, x, out);
#pragma unroll
      for (int m = 0; m < MT; ++m) part[m][u] = out[m];
    }
    // Transposing butterfly: round r (xor 16 >> r) halves the values a lane keeps; after
    // log2(R) rounds a lane holds the sum over R lanes of one row, whose index bits are the
    // lane bits 4, 3, ... used; the remaining lane bits are summed by plain xor shuffles.
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      int row = 0;
#pragma unroll
      for (int r = 0; r < kLog2RowsV2; ++r) {
        const int bit = 16 >> r, w = kRowsV2 >> (r + 1);
        const bool upper = (lane & bit) != 0;
        row = 2 * row + (upper ? 1 : 0);
#pragma unroll
        for (int j = 0; j < w; ++j) {
          const float lo_v = part[m][j], hi_v = part[m][j + w];
          const float got = __shfl_xor_sync(0xffffffffu, upper ? lo_v : hi_v, bit);
          part[m][j] = (upper ? hi_v : lo_v) + got;
        }
      }
      float total = part[m][0];
#pragma unroll
      for (int bit = 16 >> kLog2RowsV2; bit >= 1; bit >>= 1)
        total += __shfl_xor_sync(0xffffffffu, total, bit);
      constexpr int kLowMask = (32 >> kLog2RowsV2) - 1;  // lanes that share a row
      if ((lane & kLowMask) == 0 && row < rows_here && rid[m] >= 0)
        p.partial[(s * p.num_rows + rid[m]) * p.n + n0 + row] = total;
    }
  }
}

}  // namespace m3::cuda::gemv

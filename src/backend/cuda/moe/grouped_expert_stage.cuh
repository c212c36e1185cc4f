// What the two grouped expert GEMM kernels (grouped_expert_gemm.cu: mma.sync; grouped_expert_
// gemm_wgmma.cu: wgmma) share: the geometry of one pipeline stage of quantised weights (128
// weight rows x 128 columns of NVFP4 or MXFP8 codes plus their block scales), the copy of a
// stage's codes and scales into shared memory with cp.async, the exact conversion of 16 columns of
// one weight row to bf16, and the SwiGLU-OAI epilogue expression. Both kernels keep the raw stage
// in the same shared-memory order (the global order of the layout: row-major rows, or the mma
// layouts' 16-row tiles), so only where the bf16 values are written differs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/gemm/scale_codes.cuh"
#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/runtime/cp_async.cuh"
#include "quant/mxfp8_mma_layout.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda::grouped {

constexpr int kBM = static_cast<int>(kGroupedTileM);
constexpr int kBN = static_cast<int>(kGroupedTileN);
constexpr int kBK = static_cast<int>(kGroupedTileK);
static_assert(kBM == 128 && kBN == 128 && kBK == 128, "the thread mappings assume 128");
static_assert(kBK == nvfp4_mma::kChunkK && kBK == mxfp8_mma::kStageK,
              "a stage is one chunk of the mma layouts");

// Per-format geometry of one stage's quantised weights.
template <QuantFormat F>
struct StageGeometry {
  static constexpr bool kNv = F == QuantFormat::kNvfp4;
  static constexpr int kBlock = kNv ? 16 : 32;                // elements per scale
  static constexpr int kRowBytes = kNv ? kBK / 2 : kBK;       // codes of one row, one stage
  static constexpr int kRawBytes = kBN * kRowBytes;           // 8 KB | 16 KB
  static constexpr int kScaleRowBytes = kBK / kBlock;         // 8 | 4
  static constexpr int kScaleBytes = kBN * kScaleRowBytes;    // 1 KB | 512 B
  static constexpr int kChunkBytes = kNv ? nvfp4_mma::kChunkBytes : mxfp8_mma::kStageBytes;
};

// Where one CTA's weights come from: expert e's codes and scales, the CTA's weight rows (w_row[lr]
// = matrix row of local row lr) and, in the mma layouts, its first 16-row tile.
struct StageSource {
  const uint8_t* wq = nullptr;  // the expert's codes
  const uint8_t* ws = nullptr;  // the expert's scales (row-major in every layout)
  const int32_t* w_row = nullptr;  // [kBN] in shared memory
  int n = 0, k = 0, k_stages = 0, tiling = 0, tau0 = 0;
};

// Copies stage ks's codes (to raw_s, kRawBytes) and scales (to raw_s + kRawBytes) with cp.async;
// `threads` threads, tid < threads. Row-major: local row lr's codes at lr·kRowBytes. mma layouts:
// the CTA's 8 tiles of 16 rows, (tile, stage) chunks of kChunkBytes back to back, as in global.
template <QuantFormat F, int kThreads>
__device__ __forceinline__ void load_stage_weights(uint32_t raw_s, const StageSource& s, int ks,
                                                   int tid) {
  using G = StageGeometry<F>;
  static_assert(G::kRawBytes % (16 * kThreads) == 0, "whole 16-byte copies per thread");
  const int64_t w_row_stride = G::kNv ? s.k / 2 : s.k;
#pragma unroll
  for (int i = 0; i < G::kRawBytes / 16 / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const uint8_t* g;
    if (s.tiling == static_cast<int>(WeightLayout::kRowMajor)) {
      constexpr int kPerRow = G::kRowBytes / 16;
      const int lr = idx / kPerRow, c = idx % kPerRow;
      g = s.wq + int64_t{s.w_row[lr]} * w_row_stride + ks * G::kRowBytes + c * 16;
    } else {
      constexpr int kPerTile = G::kChunkBytes / 16;
      const int lt = idx / kPerTile, c = idx % kPerTile;
      g = s.wq + (int64_t{s.tau0 + lt} * s.k_stages + ks) * G::kChunkBytes + c * 16;
    }
    cp_async16(raw_s + idx * 16, g, 16);
  }
  if (tid < kBN) {
    const uint32_t sc_s = raw_s + G::kRawBytes + tid * G::kScaleRowBytes;
    const uint8_t* g =
        s.ws + int64_t{s.w_row[tid]} * (s.k / G::kBlock) + ks * G::kScaleRowBytes;
    if constexpr (G::kNv) {
      cp_async8(sc_s, g, 8);
    } else {
      cp_async4(sc_s, g, 4);
    }
  }
}

// Two E4M3 codes (low byte -> low half) to an exact f16x2.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  return h;
}

// One byte of two E2M1 codes (element 2i low nibble) to the f16x2 (code · 2^-14) pair: the three
// magnitude bits go to f16 bits 9..11, the sign to bit 15 (as nvfp4_mma::fragment).
__device__ __forceinline__ uint32_t e2m1x2_to_f16x2(uint32_t b) {
  return ((b << 9) & 0x0E00u) | ((b << 12) & 0x8000u) | ((b << 21) & 0x0E000000u) |
         ((b << 24) & 0x80000000u);
}

// Where the codes and the scale of columns 16·cg .. 16·cg + 15 of local weight row lr sit in a
// raw stage (byte offsets from the stage's codes and from its scales), and for NVFP4 in the mma
// layout which half (tile rows g or g + 8) of the packed words is the row's. Depends only on
// (lr, cg) and the CTA, not on the stage: a kernel can compute it once.
struct Loc16 {
  int raw = 0, sc = 0, h = 0;
};
template <QuantFormat F>
__device__ __forceinline__ Loc16 locate16(const StageSource& s, int lr, int cg) {
  using G = StageGeometry<F>;
  const int col0 = cg * 16;
  Loc16 l;
  if constexpr (G::kNv) {
    l.sc = lr * G::kScaleRowBytes + cg;
    if (s.tiling == static_cast<int>(WeightLayout::kRowMajor)) {
      l.raw = lr * G::kRowBytes + cg * 8;
    } else {
      // nvfp4_mma::locate: lane 4g + t holds columns 32t + 4i + j of tile rows g, g + 8 in
      // its words i = 0..7 (16-byte halves swapped for lanes with bit 2 set).
      const nvfp4_mma::TilePos tp =
          nvfp4_mma::tile_pos(s.w_row[lr], s.n, static_cast<nvfp4_mma::Tiling>(s.tiling));
      const int lt = static_cast<int>(tp.tau) - s.tau0, g = tp.rr & 7;
      const int ln = 4 * g + (col0 >> 5), i0 = (col0 & 31) >> 2;  // i0 = 0 or 4
      l.raw = lt * G::kChunkBytes + ln * 32 + (((i0 >> 2) ^ ((ln >> 2) & 1)) << 4);
      l.h = tp.rr >> 3;
    }
  } else {
    l.sc = lr * G::kScaleRowBytes + (col0 >> 5);
    if (s.tiling == static_cast<int>(WeightLayout::kRowMajor)) {
      l.raw = lr * G::kRowBytes + col0;
    } else {
      // mxfp8_mma::offset: (row, col) at u·512 + (4g + t)·16 + h·8 + col % 8; the 16 columns
      // are lanes t0 and t0 + 1, 16 bytes apart.
      const nvfp4_mma::TilePos tp =
          nvfp4_mma::tile_pos(s.w_row[lr], s.n, static_cast<nvfp4_mma::Tiling>(s.tiling));
      const int lt = static_cast<int>(tp.tau) - s.tau0, g = tp.rr & 7, h = tp.rr >> 3;
      const int u = col0 >> 5, t0 = (col0 & 31) >> 3;  // t0 = 0 or 2
      l.raw = lt * G::kChunkBytes + u * 512 + h * 8 + (4 * g + t0) * 16;
    }
  }
  return l;
}

// The 16 columns located by l of a raw stage (codes at raw, scales at raw + kRawBytes) as 8
// bf16x2 words (o[i] = columns 16·cg + 2i, + 1): exact, the same values launch_dequant_bf16
// writes (e2m1·e4m3 and e4m3·2^e are bf16 numbers; the NVFP4 per-matrix multiplier is left to
// the epilogue).
template <QuantFormat F>
__device__ __forceinline__ void convert16(const uint8_t* raw, int tiling, const Loc16& l,
                                          uint32_t (&o)[8]) {
  using G = StageGeometry<F>;
  const uint8_t* sc = raw + G::kRawBytes;
  uint32_t h2[8];  // f16x2 pairs of columns col0 + 2i, + 1
  float scale;
  if constexpr (G::kNv) {
    scale = e4m3_to_float(sc[l.sc]) * 16384.0f;  // codes carry 2^-14
    if (tiling == static_cast<int>(WeightLayout::kRowMajor)) {
      const uint2 v = *reinterpret_cast<const uint2*>(raw + l.raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        h2[j] = e2m1x2_to_f16x2((v.x >> (8 * j)) & 0xFF);
        h2[4 + j] = e2m1x2_to_f16x2((v.y >> (8 * j)) & 0xFF);
      }
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(raw + l.raw);
      const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int ii = 0; ii < 4; ++ii) {  // word ii: columns 4ii .. 4ii + 3
        h2[2 * ii] = nvfp4_mma::fragment(w4[ii], l.h);
        h2[2 * ii + 1] = nvfp4_mma::fragment(w4[ii], 2 + l.h);
      }
    }
  } else {
    scale = e8m0_to_float(sc[l.sc]);
    uint32_t c4[4];  // 16 codes, element 4w + b in byte b of word w
    if (tiling == static_cast<int>(WeightLayout::kRowMajor)) {
      const uint4 v = *reinterpret_cast<const uint4*>(raw + l.raw);
      c4[0] = v.x, c4[1] = v.y, c4[2] = v.z, c4[3] = v.w;
    } else {
      const uint2 v0 = *reinterpret_cast<const uint2*>(raw + l.raw);
      const uint2 v1 = *reinterpret_cast<const uint2*>(raw + l.raw + 16);
      c4[0] = v0.x, c4[1] = v0.y, c4[2] = v1.x, c4[3] = v1.y;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      h2[2 * w] = e4m3x2_to_f16x2(c4[w] & 0xFFFF);
      h2[2 * w + 1] = e4m3x2_to_f16x2(c4[w] >> 16);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) o[i] = scale_to_bf16x2(h2[i], scale);
}

// Columns 16·cg .. 16·cg + 15 of local weight row lr of a raw stage, located and converted.
template <QuantFormat F>
__device__ __forceinline__ void dequant16(const uint8_t* raw, const StageSource& s, int lr, int cg,
                                          uint32_t (&o)[8]) {
  convert16<F>(raw, s.tiling, locate16<F>(s, lr, cg), o);
}

// Same float expression as swiglu_oai_bf16_kernel (prefill_kernels.cu), then bf16 rounding.
__device__ __forceinline__ float swiglu_oai(float g, float u, float alpha, float limit) {
  const float gc = fminf(g, limit);
  const float uc = fminf(fmaxf(u, -limit), limit);
  const float sig = 1.0f / __fadd_rn(1.0f, expf(-__fmul_rn(gc, alpha)));
  return __fmul_rn(__fmul_rn(gc, sig), __fadd_rn(uc, 1.0f));
}

// The expert of row tile mt: tile_off[lo] <= mt < tile_off[lo + 1] (binary search; the caller has
// checked mt < tile_off[E]).
__device__ __forceinline__ int expert_of_tile(const int32_t* tile_off, int num_experts, int mt) {
  int lo = 0, hi = num_experts;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (tile_off[mid] <= mt) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The routed rows of row tile mt (mt < tile_off[E]): its expert, its first row in the sorted
// order and how many of its kGroupedTileM rows are routed.
struct RowTile {
  int e = 0, row_begin = 0, rows = 0;
};
__device__ __forceinline__ RowTile row_tile(const GroupedExpertGemmParams& p, int mt) {
  RowTile t;
  t.e = expert_of_tile(p.tile_offsets, static_cast<int>(p.num_experts), mt);
  t.row_begin = p.group_offsets[t.e] + (mt - p.tile_offsets[t.e]) * kBM;
  t.rows = min(kBM, p.group_offsets[t.e + 1] - t.row_begin);
  return t;
}

// The activation row that the tile's row r reads (a_rows gathers routed row ids token·top_k +
// slot), or -1 past its routed rows.
__device__ __forceinline__ int32_t source_row(const GroupedExpertGemmParams& p, const RowTile& t,
                                              int r) {
  if (r >= t.rows) return -1;
  return p.a_rows != nullptr ? static_cast<int32_t>(p.a_rows[t.row_begin + r] / p.a_row_div)
                             : t.row_begin + r;
}

}  // namespace m3::cuda::grouped

// MXFP8 weights in the order the register-fed tensor-core decode GEMV (kMmaDirect,
// backend/cuda/gemm/gemv_mma_direct.cu) streams them ("mma layout"): every warp reads whole
// 2-KB runs instead of 32-byte pieces of 16 rows.
//
// Why: kMmaDirect on the checkpoint's row-major order, where each 16-row tile of a 32-column
// block is sixteen 32-byte pieces of rows K bytes apart, ran at 2.3-2.6 TB/s (qkv [9856 x 6144]
// at one row: 26.7 us); the same kernel reading each (tile, 128 columns) as 2 KB contiguous
// bytes ran it in 19.1 us (H200): HBM serves long runs faster.
//
// Geometry. A matrix [N, K] of E4M3 codes is cut into tiles of 16 rows (kRows16: rows
// 16τ .. 16τ + 15; kSwigluPairs, for a gate|up matrix read with the SwiGLU epilogue: gate rows
// 8τ .. 8τ + 7, then up rows N/2 + 8τ .. N/2 + 8τ + 7; the same tile rows as the NVFP4 layout,
// nvfp4_mma::tile_row) and stages of 128 columns; a (tile, stage) is 2048 bytes: 4 scale blocks
// of 32 columns x 32 lanes (lane = 4g + t) x 16 bytes. Lane (g, t) of block u holds the 8 codes
// at columns 128s + 32u + 8t .. + 7 of tile row g, then those of tile row g + 8: one 16-byte
// load gives exactly the A registers of mma.m16n8k16 for the block's two k-steps (each code
// pair through cvt.rn.f16x2.e4m3x2). Same size as the checkpoint order (N·K bytes); the E8M0
// scales stay row-major [N, K/32]. Requirements (fits): N % 16 == 0, K % 128 == 0.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::mxfp8_mma {

using Tiling = nvfp4_mma::Tiling;
constexpr int kStageK = 128;
constexpr int kStageBytes = 2048;

// Byte offset of element (row, col) of an [N, K] matrix in the layout.
M3_HOST_DEVICE inline int64_t offset(int64_t row, int64_t col, int64_t n, int64_t k,
                                     Tiling tiling) {
  const nvfp4_mma::TilePos tp = nvfp4_mma::tile_pos(row, n, tiling);
  const int64_t s = col / kStageK;
  const int u = static_cast<int>(col % kStageK) / 32, t = static_cast<int>(col % 32) / 8;
  const int lane = 4 * (tp.rr & 7) + t;
  return (tp.tau * (k / kStageK) + s) * kStageBytes + u * 512 + lane * 16 + (tp.rr >> 3) * 8 +
         col % 8;
}

// Whether an [N, K] MXFP8 matrix can take the layout with this tiling.
inline bool fits(int64_t n, int64_t k, Tiling tiling) {
  const bool mma = tiling == Tiling::kRows16 || tiling == Tiling::kSwigluPairs;
  return mma && n > 0 && n % 16 == 0 && k > 0 && k % kStageK == 0;
}

// Host reference of the repack: `groups` matrices [N, K] in checkpoint order -> the layout.
// fits() must hold.
std::vector<uint8_t> pack_matrix(const uint8_t* row_major, int64_t groups, int64_t n, int64_t k,
                                 Tiling tiling);

}  // namespace m3::mxfp8_mma

// NVFP4 weights in the order the tensor-core decode GEMV consumes them ("mma layout"), so that
// turning a 32-bit word of codes into the four f16x2 operand registers of one mma.sync k-step
// costs 2 instructions per register instead of 4.
//
// Why: on Hopper the NVFP4 GEMV (kMmaRing, backend/cuda/gemm/gemv_mma.cuh) issues ~33 instructions
// per mma, two thirds of them dequantisation (ncu on the H200, batch-1 experts: issue slots 56 %
// busy, ALU the busiest pipe). E2M1 code n = s e1 e0 m becomes the
// exact f16 n · 2^-14 when e1 e0 m go to f16 bits 11..9 and s to bit 15. In the checkpoint's
// order (two codes per byte) the sign and the magnitude of a code need different shifts, so each
// f16x2 costs two shifts and two masks. Here a word is stored pre-mixed (an invertible linear map
// over GF(2), applied once at load) such that, with r = x >> 3,
//     frag0 = (r ^ x) & T        frag1 = (r ^ (x << 2)) & T
//     frag2 = (r ^ (x << 6)) & T frag3 = (r ^ (x << 9)) & T
// with T = the f16x2 bit positions {9, 10, 11, 15, 25, 26, 27, 31}: 4 shifts + 4 LOP3 for 8
// codes. Plain shifts rather than rotations (the first version used 4 funnel shifts) because
// ptxas issues left shifts as IMAD.SHL on the FMA pipe, while funnel shifts and LOP3 share the ALU
// pipe, which ncu showed as the busiest (58 % at batch 1); this
// moves 3 of the 8 instructions per word off it. (Exhaustive search over shifts of up to
// 12 bits: no invertible choice needs fewer than 4.)
//
// Geometry. A matrix [N, K] is cut into tiles of 16 rows, either rows 16τ .. 16τ + 15 (kRows16)
// or, for a gate|up matrix read with the SwiGLU epilogue, gate rows 8τ .. 8τ + 7 then up rows
// N/2 + 8τ .. N/2 + 8τ + 7 (kSwigluPairs); tile row rr: g = rr % 8, h = rr / 8. Each tile is
// cut into chunks of 128 columns; a (tile, chunk) is 1024 bytes: 32 lanes (lane = 4g + t) x 8
// k-steps x one word. Word (lane, i) holds the codes of rows g and g + 8 (h = 0, 1) at columns
// 128c + 32t + 4i + j, j = 0..3; fragment (j / 2)·2 + h holds columns j = 0, 2 (low half) and
// 1, 3 (high half) of row h: exactly mma.m16n8k16's A registers a0..a3 for logical k pairs
// (2t, 2t+1) = physical j 0, 1 and (2t+8, 2t+9) = j 2, 3, whose activations are the 8 contiguous
// bytes at column 128c + 32t + 4i. The two 16-byte halves of a lane's 32 bytes are swapped for
// lanes with bit 2 set, so that a warp's 16-byte shared-memory reads do not conflict.
// Same size as the checkpoint order (N·K/2 bytes); block scales are unchanged (row-major).
// Requirements: K % 128 == 0, N % 16 == 0 (kRows16) or N % 16 == 0 with N/2 % 8 == 0 (pairs).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace m3::nvfp4_mma {

enum class Tiling : int { kRowMajor = 0, kRows16 = 1, kSwigluPairs = 2 };

constexpr uint32_t kT = 0x8E008E00u;  // f16x2 bits 9-11, 15 | 25-27, 31
constexpr int kChunkK = 128;
constexpr int kChunkBytes = 1024;

// Fragment f (0..3) of a packed word: an f16x2 of two codes times 2^-14 (no scale).
M3_HOST_DEVICE inline uint32_t fragment(uint32_t x, int f) {
  const uint32_t r3 = x >> 3;
  switch (f) {
    case 0: return (r3 ^ x) & kT;
    case 1: return (r3 ^ (x << 2)) & kT;
    case 2: return (r3 ^ (x << 6)) & kT;
    default: return (r3 ^ (x << 9)) & kT;
  }
}

// Fragment f as bf16x2 bits instead: the same two codes times 2^-126 (the code 0.5 is the bf16
// subnormal 2^-127). The f16 fragment's code bits 9-11 (| 25-27) move to the bf16 exponent's low
// bits and the mantissa's top bit, 6-8 (| 22-24); the signs stay at 15 and 31. One shift and one
// bit select more than fragment(), and then one bf16 multiply by a block scale carrying 2^112 gives
// the exact weight times 2^-14 in bf16, where the f16 fragment needs two conversions through
// float (the bf16 wgmma's A operand, grouped_expert_gemm_wgmma_rs.cu).
M3_HOST_DEVICE inline uint32_t fragment_bf16(uint32_t x, int f) {
  const uint32_t h = fragment(x, f);
  constexpr uint32_t kKeep = 0x90009000u;  // bits 12, 15 | 28, 31 from h, the rest from h >> 3
  return (h & kKeep) | ((h >> 3) & ~kKeep);
}

// The activation order of a 128-column chunk that matches this layout's k-steps: k-step i of lane
// 4g + t multiplies physical columns 32t + 4i + jj and 32t + 4i + 2 + jj (jj = 0, 1) as mma's
// logical k 2t + jj and 2t + 8 + jj, so physical column p of a chunk is logical column
// 16i + 2t + (j & 1) + 8·(j >> 1) (t = p / 32, i = (p / 4) % 8, j = p % 4). A bijection of
// 0..127 that keeps column pairs (2m, 2m + 1) together.
M3_HOST_DEVICE inline int k_order_position(int p) {
  const int t = p >> 5, i = (p >> 2) & 7, j = p & 3;
  return 16 * i + 2 * t + (j & 1) + 8 * (j >> 1);
}

// The E2M1 code in half `half` of a fragment.
M3_HOST_DEVICE inline uint32_t code_of(uint32_t frag, int half) {
  const int b = 16 * half;
  return ((frag >> (9 + b)) & 7u) | (((frag >> (15 + b)) & 1u) << 3);
}

// Weight row of tile row rr of tile tau (N rows in all).
M3_HOST_DEVICE inline int64_t tile_row(int64_t tau, int rr, int64_t n, Tiling tiling) {
  if (tiling == Tiling::kSwigluPairs) return (rr >> 3 ? n / 2 : 0) + tau * 8 + (rr & 7);
  return tau * 16 + rr;
}

// The inverse: the tile and tile row of weight row `row` (also used by the MXFP8 layout).
struct TilePos {
  int64_t tau = 0;
  int rr = 0;
};
M3_HOST_DEVICE inline TilePos tile_pos(int64_t row, int64_t n, Tiling tiling) {
  if (tiling == Tiling::kSwigluPairs) {
    const int64_t h2 = n / 2, r = row < h2 ? row : row - h2;
    return {r / 8, static_cast<int>(r % 8) + (row < h2 ? 0 : 8)};
  }
  return {row / 16, static_cast<int>(row % 16)};
}

// Byte offset (in the matrix) of the word of lane `lane`, k-step i of (tile tau, chunk c).
M3_HOST_DEVICE inline int64_t word_offset(int64_t tau, int64_t c, int lane, int i, int64_t k) {
  return (tau * (k / kChunkK) + c) * kChunkBytes + lane * 32 +
         (((i >> 2) ^ ((lane >> 2) & 1)) << 4) + (i & 3) * 4;
}

// The tiles [first, end) holding rows [row0, row0 + rows) of an [N, K] matrix: whole 16-row tiles
// (kRows16), or with pairs the tiles of the gate rows below N/2 and of the up rows from it.
struct TileRange {
  int64_t first = 0, end = 0;
};
M3_HOST_DEVICE inline TileRange tiles_of_rows(int64_t row0, int64_t rows, int64_t n,
                                              Tiling tiling) {
  const int64_t end = row0 + rows;
  if (tiling != Tiling::kSwigluPairs) return {row0 / 16, (end + 15) / 16};
  const int64_t half = n / 2;
  TileRange r{INT64_MAX, 0};
  if (row0 < half) {  // gate rows [row0, min(end, half)): tiles of 8
    r.first = row0 / 8;
    r.end = ((end < half ? end : half) + 7) / 8;
  }
  if (end > half) {  // up rows [max(row0, half), end) - half
    const int64_t lo = (row0 > half ? row0 : half) - half, hi = end - half;
    r.first = lo / 8 < r.first ? lo / 8 : r.first;
    r.end = (hi + 7) / 8 > r.end ? (hi + 7) / 8 : r.end;
  }
  return r;
}

// Where element (row, col) of an [N, K] matrix lives: the byte offset of its word, the fragment
// and the half.
struct Loc {
  int64_t word = 0;
  int frag = 0, half = 0;
};
M3_HOST_DEVICE inline Loc locate(int64_t row, int64_t col, int64_t n, int64_t k, Tiling tiling) {
  const TilePos tp = tile_pos(row, n, tiling);
  const int g = tp.rr & 7, h = tp.rr >> 3;
  const int64_t tau = tp.tau;
  const int64_t c = col / kChunkK;
  const int t = static_cast<int>(col % kChunkK) / 32, i = static_cast<int>(col % 32) / 4,
            j = static_cast<int>(col % 4);
  Loc l;
  l.word = word_offset(tau, c, 4 * g + t, i, k);
  l.frag = (j >> 1) * 2 + h;
  l.half = j & 1;
  return l;
}

// The code of element (row, col) from packed storage.
M3_HOST_DEVICE inline uint32_t packed_code(const uint8_t* packed, int64_t row, int64_t col,
                                           int64_t n, int64_t k, Tiling tiling) {
  const Loc l = locate(row, col, n, k, tiling);
  const uint8_t* p = packed + l.word;
  const uint32_t x = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                     uint32_t{p[3]} << 24;
  return code_of(fragment(x, l.frag), l.half);
}

// Packing: the inverse of the word map. Column b of the inverse = the word whose fragments
// carry exactly bit b of y, y bit 8·f + q = bit T[q] of fragment f (T listed low to high).
// Computed once on the host (Gaussian elimination over GF(2)); the GPU repack takes the table.
using PackTable = std::array<uint32_t, 32>;
const PackTable& pack_table();

// Word from the 8 codes nib[h][j] (row g + 8h, column j of the k-step), via the table.
M3_HOST_DEVICE inline uint32_t pack_word(const uint32_t* table, const uint8_t (&nib)[2][4]) {
  uint32_t y = 0;
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j) {
      const int f = (j >> 1) * 2 + h, half = j & 1;
      const uint32_t n4 = nib[h][j] & 15u;
      // y bits of fragment f: q = 4·half + {0: bit 9, 1: bit 10, 2: bit 11, 3: bit 15}.
      y |= (n4 & 7u) << (8 * f + 4 * half);
      y |= (n4 >> 3) << (8 * f + 4 * half + 3);
    }
  uint32_t x = 0;
  for (int b = 0; b < 32; ++b)
    if (y >> b & 1u) x ^= table[b];
  return x;
}

// Whether an [N, K] NVFP4 matrix can take the layout.
inline bool fits(int64_t n, int64_t k, Tiling tiling) {
  // Both tilings need whole 16-row tiles (pairs: N/2 % 8 == 0, the same condition).
  const bool mma = tiling == Tiling::kRows16 || tiling == Tiling::kSwigluPairs;
  return mma && n > 0 && n % 16 == 0 && k > 0 && k % kChunkK == 0;
}

// Host reference of the repack: `groups` matrices [N, K/2 bytes] in checkpoint order (code of
// column c in the low nibble of byte c/2 for even c) -> mma layout. fits() must hold.
std::vector<uint8_t> pack_matrix(const uint8_t* row_major, int64_t groups, int64_t n, int64_t k,
                                 Tiling tiling);

}  // namespace m3::nvfp4_mma

// The tensor-core GEMV pieces (mma.sync m16n8k16, f16 in, f32 accumulate) shared by kMmaRing and
// kMmaDirect (gemv_mma_direct.cu), and the kMmaRing kernel: a dequantising GEMV for 1..32
// activation rows per group with its epilogue fused (no split-K partial buffer, no second
// launch). Written after ncu showed kDequantSplitK issue-bound as much as memory-bound: dequantising
// into float and one FMA per element costs ~8 instructions per weight byte for NVFP4; here the
// tensor core does the multiply-adds for 16 weight rows x 8 activation rows at once, so what is
// left per weight element is its conversion to f16.
//
// Operands. A (16 x 16) = 16 weight rows of one tile, dequantised to f16 in registers. B (16 x 8)
// = up to 8 activation rows ("tokens"), read as f16 from a prepared copy of x (x_f16.h: the bf16
// activations times a power of two per row, exact), so no conversion is done per CTA. The mma's
// k order is free as long as A and B agree; each lane's share of a k-step is chosen to match what
// it loads:
//  * MXFP8, one 32-element scale block per chunk: lane (g = lane / 4, t = lane % 4) loads 8 bytes
//    at element 8t of the block for rows g and g + 8 (a quad reads the whole 32-byte block), k-step
//    i takes elements 8t + 4i .. 8t + 4i + 3 (cvt.rn.f16x2.e4m3x2, exact). Both k-steps of a block
//    accumulate into a zeroed fragment, which is then scaled by the block's E8M0 factor in f32.
//  * NVFP4, a chunk of 128 elements (8 scale blocks): lane loads 16 bytes (32 elements) at element
//    32t for rows g and g + 8. E2M1 pairs (n_j, n_{j+4}) of a 32-bit word become f16x2 by bit
//    placement (value x 2^-14, exact), multiplied (HMUL2) by the block's E4M3 scale x 2^7 (exact:
//    every product e2m1 x scale x 2^-7 is a multiple of 2^-17 of at most 21); x pairs are formed
//    to match with two byte permutes per k-step. The global multiplier and 2^7 are applied at the
//    end in f32.
// Products of f16 operands are exact in f32; the tensor core accumulates in f32.
//
// Work split: one CTA per 16-row tile of one group (expert). SwiGLU tiles hold gate rows
// i0 .. i0 + 7 (fragment rows g) and up rows N/2 + i0 .. (rows g + 8), so a lane holds gate and up
// of the same output. The CTA's W warps (1-8, gemv_plan.h's mma_ring_warps) split K into W contiguous
// ranges of stages (2 KB of weights + their scales); each warp streams its range through its own
// ring of kMmaStages slots in shared memory with cp.async (the others in flight while one is
// computed; no registers held by loads in flight). The W partial fragments are summed through
// shared memory in warp order (deterministic) and the epilogue stores float32 (or adds), or
// applies SwiGLU-OAI and stores bf16 or f16 x 2^8.
//
//  * NVFP4 in the mma layout (kPacked; quant/nvfp4_mma_layout.h, repacked at load): a lane's 32
//    bytes of a chunk are its 8 k-steps' words; each word gives the k-step's four A registers by
//    4 shifts + 4 LOP3 (x 2^-14, then the same scale HMUL2), and the activations of
//    k-step i are the 8 contiguous bytes at column 32t + 4i (no byte permutes). ncu, experts at
//    batch 1: 25 instead of 33 instructions per mma; 1.1x (H200: 70.9 -> 62.4 us at T=1).
//
// Measured (H200): 1.2-4x kDequantSplitK from 2 activation rows and for the NVFP4 experts at any
// batch, but slower than kDequantSplitK for large row-major MXFP8 matrices at one row, where each warp's
// instruction stream (dequantise, mma, scale) is latency-bound (ncu: 12.6 cycles per issued
// instruction, < 1 eligible warp per scheduler).
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/gemm/gemv_common.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/pdl.cuh"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda::gemv {

constexpr float kActF16Scale = 256.0f;  // kSwigluF16 stores act x 2^8 (|act| <= limit (limit + 1))

template <QuantFormat F>
struct MmaTraits;
template <>
struct MmaTraits<QuantFormat::kMxfp8> {
  static constexpr int kChunkK = 32;         // one scale block
  static constexpr int kChunkBytes = 16 * 32;  // 16 rows x 32 codes
  static constexpr int kU = 4;               // chunks per pipeline stage (2 KB)
  static constexpr int kScaleBytes = 16 * 4;   // 16 rows x 4 chunks x 1 E8M0 byte
};
template <>
struct MmaTraits<QuantFormat::kNvfp4> {
  static constexpr int kChunkK = 128;        // 8 scale blocks
  static constexpr int kChunkBytes = 16 * 64;  // 16 rows x 64 bytes of E2M1 pairs
  static constexpr int kU = 2;               // chunks per stage (2 KB)
  static constexpr int kScaleBytes = 16 * 2 * 8;  // 16 rows x 2 chunks x 8 E4M3 bytes
};
// Ring slots per warp: one stage in flight while one is used. Measured on the H200 against 3
// and 4 slots: NVFP4 experts at 1 / 8 / 32 tokens 52.8 / 263.7 /
// 734.8 us (3 slots 56.2 / 267.2 / 737.3, 4 slots 59.5 / 294.0 / 790.6), MXFP8 o_proj at 8 rows
// 24.1 us (24.3, 29.4): the warps are bound by their instruction latency, not by the loads in
// flight, and smaller rings leave more of the SM's unified memory to L1 (the activations) and
// more room for CTAs.
constexpr int kMmaStages = 2;

template <QuantFormat F>
constexpr int mma_stage_bytes() {
  return MmaTraits<F>::kU * MmaTraits<F>::kChunkBytes + MmaTraits<F>::kScaleBytes;
}
// The activation slice of one stage (kU chunks of one row, f16) when it is staged with the
// weights (kStageX below, NVFP4 only): each chunk's 256 bytes followed by 16 bytes of zeros,
// which the lanes that carry no activation in an output-scaled mma read (kScaleOut below).
template <QuantFormat F>
constexpr int mma_x_chunk_stride() {
  return MmaTraits<F>::kChunkK * 2 + 16;
}
template <QuantFormat F>
constexpr int mma_x_stage_bytes() {
  return MmaTraits<F>::kU * mma_x_chunk_stride<F>();
}
template <QuantFormat F, bool kStageX = false>
constexpr int mma_slot_bytes() {
  return mma_stage_bytes<F>() + (kStageX ? mma_x_stage_bytes<F>() : 0);
}
template <QuantFormat F, bool kStageX = false>
constexpr int mma_smem_bytes(int warps) {
  return warps * kMmaStages * mma_slot_bytes<F, kStageX>();
}
// Where NVFP4 activation piece pc (16 bytes, pc = 4t + q: columns 32t + 8q of a chunk) sits in a
// staged slice: quarter-warps read q fixed and t = 0..3, 64 bytes apart, which would put t and
// t + 2 on the same banks; flipping q's low bit for t >= 2 spreads them over all 32 banks.
__device__ __forceinline__ int nvfp4_x_piece_slot(int pc) { return pc ^ ((pc >> 3) & 1); }

// x, which the compiler cannot recompute from its inputs (it keeps or spills the register).
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// d = A·B (a zero accumulator: no instructions to clear d first).
__device__ __forceinline__ void mma_f16_first(float (&d)[4], uint32_t a0, uint32_t a1,
                                              uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(two)));
  return h;
}

// f16x2 of E2M1 codes (n_J, n_{J+4}) of word w, times 2^-14 (bit placement; see gemv_common.cuh).
template <int J>
__device__ __forceinline__ uint32_t e2m1_pair_h2(uint32_t w) {
  constexpr int kMag = 9 - 4 * J, kSign = 12 - 4 * J;
  const uint32_t mag = (kMag >= 0 ? (w << kMag) : (w >> -kMag)) & 0x0E000E00u;
  const uint32_t sign = (kSign >= 0 ? (w << kSign) : (w >> -kSign)) & 0x80008000u;
  return mag | sign;
}

// The f16 in the low 16 bits of h, as float (exact).
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFFu)));
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// The four scale operands of a lane from its two pairs of E4M3 block scales (low and high byte:
// blocks 2t and 2t + 1) of rows g (lo2) and g + 8 (hi2): each x 2^7 as an f16x2 broadcast to
// both halves (exact); l0 / h0 serve k-steps 0..3 of a chunk, l1 / h1 k-steps 4..7.
__device__ __forceinline__ void nvfp4_scale_operands(uint32_t lo2, uint32_t hi2, uint32_t* l0,
                                                     uint32_t* l1, uint32_t* h0, uint32_t* h1) {
  const uint32_t s2l = hmul2(e4m3x2_to_f16x2(lo2), 0x58005800u);
  const uint32_t s2h = hmul2(e4m3x2_to_f16x2(hi2), 0x58005800u);
  *l0 = prmt(s2l, 0, 0x1010), *l1 = prmt(s2l, 0, 0x3232);
  *h0 = prmt(s2h, 0, 0x1010), *h1 = prmt(s2h, 0, 0x3232);
}

// Lane `lane`'s 8 words (k-steps 0..7) of one NVFP4 chunk in the mma layout (1 KB at `chunk`):
// its 32 bytes, whose 16-byte halves are swapped for lanes with bit 2 set (conflict-free reads).
__device__ __forceinline__ void nvfp4_lane_words(const uint8_t* chunk, int lane,
                                                 uint32_t (&wv)[8]) {
  const uint8_t* wl = chunk + lane * 32;
  const int sw = (lane >> 2) & 1;
  const uint4 w0 = *reinterpret_cast<const uint4*>(wl + 16 * sw);
  const uint4 w1 = *reinterpret_cast<const uint4*>(wl + 16 * (sw ^ 1));
  wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w;
  wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z, wv[7] = w1.w;
}

// The NVFP4 block scales of lane (g, t) from a stage's scale area sc = [row 16][chunk][8 blocks]
// (this chunk's column; rows `row_stride` bytes apart): blocks 2t and 2t + 1 of rows g (l) and
// g + 8 (h) (nvfp4_scale_operands).
__device__ __forceinline__ void nvfp4_lane_scales(const uint8_t* sc, int g, int t, uint32_t* l0,
                                                  uint32_t* l1, uint32_t* h0, uint32_t* h1,
                                                  int row_stride = 16) {
  nvfp4_scale_operands(*reinterpret_cast<const uint16_t*>(sc + g * row_stride + 2 * t),
                       *reinterpret_cast<const uint16_t*>(sc + (g + 8) * row_stride + 2 * t),
                       l0, l1, h0, h1);
}

// The 8 k-steps of one NVFP4 chunk in the mma layout for one group of 8 activation rows: the
// lane's words wv (k-steps 0..7), its block scales (nvfp4_lane_scales: l0 / h0 for k-steps 0..3,
// l1 / h1 for 4..7) and activations xc (16 bytes per pair of k-steps); k-step i accumulates into
// chain(i) (a float[4] fragment), so the callers choose how many independent chains they keep.
template <typename Chain>
__device__ __forceinline__ void nvfp4_chunk_mma(const uint32_t (&wv)[8], uint32_t l0, uint32_t l1,
                                                uint32_t h0, uint32_t h1, const uint4 (&xc)[4],
                                                Chain chain) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t x = wv[i];
    const uint32_t scl = i < 4 ? l0 : l1, sch = i < 4 ? h0 : h1;
    const uint4 xv = xc[i / 2];
    mma_f16(chain(i), hmul2(nvfp4_mma::fragment(x, 0), scl),
            hmul2(nvfp4_mma::fragment(x, 1), sch), hmul2(nvfp4_mma::fragment(x, 2), scl),
            hmul2(nvfp4_mma::fragment(x, 3), sch), i % 2 ? xv.z : xv.x, i % 2 ? xv.w : xv.y);
  }
}

// The group of this CTA's slot (blockIdx.y; ungrouped: 0), or -1 for an empty slot (the whole
// CTA then returns), and the group's rows [*r_begin, *r_end) of the routed rows (ungrouped: every
// row). Read through L2 (weights_before_wait reads them before the PDL wait: no L1 line of an
// earlier kernel may answer).
__device__ __forceinline__ int64_t cta_group(const QuantGemvParams& p) {
  if (p.token_topk_ids != nullptr) {  // one token: slot s is its s-th expert
    const int64_t id = __ldcg(p.token_topk_ids + blockIdx.y) - p.token_group_base;
    return id >= 0 && id < p.num_groups ? id : -1;
  }
  return p.group_offsets == nullptr ? 0 : __ldcg(p.active_groups + blockIdx.y);
}
__device__ __forceinline__ void group_rows(const QuantGemvParams& p, int64_t grp, int* r_begin,
                                           int* r_end) {
  *r_begin = 0, *r_end = static_cast<int>(p.num_rows);
  if (p.token_topk_ids != nullptr) {  // slot s: routed row s
    *r_begin = blockIdx.y, *r_end = blockIdx.y + 1;
    return;
  }
  if (p.group_offsets == nullptr) return;
  *r_begin = __ldcg(p.group_offsets + grp);
  *r_end = __ldcg(p.group_offsets + grp + 1);
}

// Tile row r (0..15) of 16-row tile `tile` -> weight row (-1: past N); SwiGLU: gate rows i0 + r
// (r < 8), up rows N/2 + i0 + r - 8, with i0 = 8·tile (kMmaRing and kMmaDirect, the mma
// layouts).
__device__ __forceinline__ int mma_tile_weight_row(int tile, int r, int n, bool swiglu) {
  if (swiglu) {
    const int i = tile * 8 + (r & 7);
    return i < n / 2 ? (r >> 3 ? n / 2 + i : i) : -1;
  }
  const int row = tile * 16 + r;
  return row < n ? row : -1;
}

__device__ __forceinline__ float e8m0_exact(uint32_t e) {
  return __uint_as_float(e != 0 ? (e & 0xFFu) << 23 : 0x00400000u);  // 2^(e - 127), e = 0 too
}

// The epilogue of one lane's summed fragment v (the mma's C layout: v[0], v[1] = tile row
// g = lane / 4, tokens 2t, 2t + 1 of a group of 8 (t = lane % 4); v[2], v[3] = tile row g + 8)
// whose weight rows are e_lo / e_hi (-1: none; SwiGLU: gate row e_lo, up row e_hi), for tokens
// with routed rows rid[j] (-1: none) and factors f[j] (the activation's and the weights' scales):
// a float32 store (or add) or SwiGLU-OAI to bf16 / f16 x 2^8.
__device__ __forceinline__ void mma_fragment_store(const QuantGemvParams& p, const float (&v)[4],
                                                   int e_lo, int e_hi, const int64_t (&rid)[2],
                                                   const float (&f)[2]) {
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (rid[j] < 0) continue;
    const float a = v[j] * f[j], b = v[2 + j] * f[j];
    if (!swiglu) {
      float* y = p.epilogue.y + rid[j] * p.epilogue.ldy;
      if (e_lo >= 0) y[e_lo] = p.epilogue.accumulate ? y[e_lo] + a : a;
      if (e_hi >= 0) y[e_hi] = p.epilogue.accumulate ? y[e_hi] + b : b;
    } else if (e_lo >= 0) {
      const float gc = fminf(a, p.epilogue.limit);
      const float uc = fminf(fmaxf(b, -p.epilogue.limit), p.epilogue.limit);
      const float sig = 1.0f / (1.0f + expf(-gc * p.epilogue.alpha));
      const float act = (uc + 1.0f) * (gc * sig);
      const int64_t at = rid[j] * (p.n / 2) + e_lo;
      const uint16_t ab = f32_to_bf16(act);
      if (p.epilogue.kind == GemvEpilogue::kSwigluBf16) {
        p.epilogue.act[at] = ab;
      } else {  // f16 of the bf16-rounded value x 2^8 (exact unless below 2^-25)
        p.epilogue.act[at] = __half_as_ushort(__float2half_rn(bf16_to_f32(ab) * kActF16Scale));
      }
    }
  }
}

// The routed rows and factors of lane `ln`'s two tokens m0 + 2t, m0 + 2t + 1 among rows r0 ..
// r0 + rows_here of group grp (for mma_fragment_store). NVFP4: the sums are in units of
// `nvfp4_unit` (2^7: block scales x 2^7 on E2M1 x 2^-14; 2^14: unscaled E2M1 x 2^-14).
template <QuantFormat F>
__device__ __forceinline__ void mma_fragment_tokens(const QuantGemvParams& p, int ln, int m0,
                                                    int rows_here, int r0, int64_t grp,
                                                    int64_t (&rid)[2], float (&f)[2],
                                                    float nvfp4_unit = 128.0f) {
  float gm = 1.0f;
  if constexpr (F == QuantFormat::kNvfp4)
    gm = (p.w_global ? p.w_global[grp] : 1.0f) * nvfp4_unit;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int m = m0 + 2 * (ln & 3) + j;
    rid[j] = -1;
    f[j] = 0.0f;
    if (m >= rows_here) continue;
    const int r = r0 + m;
    rid[j] = p.sorted_rows ? p.sorted_rows[r] : r;
    const int64_t xr = rid[j] / p.x_row_div;
    f[j] = (p.x_inv_scale ? p.x_inv_scale[xr] : p.x_inv_const) * gm;
  }
}

// F: format; NG: groups of 8 activation rows per pass (1, 2, 4: up to 8, 16, 32 rows).
// Registers are budgeted for three 256-thread CTAs per SM (80; measured on the H200 against 128
// registers and two CTAs: 1.3x faster for MXFP8 at batch 1, NVFP4 experts at batch 8 likewise).
// Dynamic shared memory: mma_smem_bytes<F>(W): each warp's pipeline ring, reused for the
// cross-warp sums after the stream.
// kPacked (NVFP4 only): the weights are in the mma layout (quant/nvfp4_mma_layout.h,
// WeightLayout::kMmaRows16 or kMmaSwigluPairs): a (tile, chunk) is 1 KB contiguous, each lane reads its 8 words with two conflict-free
// 16-byte loads and turns each word into a k-step's four A registers with 4 shifts and 4
// LOP3s (row-major: 16 shifts and masks), and the activations need no byte permutes.
// kStageX (NVFP4, NG == 1, one activation row per pass): the row's slice of each stage is copied into
// the ring slot with the stage's weights (one more 16-byte cp.async per lane), so the mma reads
// its activations from shared memory instead of through L1. Without it each chunk's first mma
// waits for an L1/L2 load issued at the chunk's start (ncu: long-scoreboard stalls
// first, mostly that load; L1 hit rate 31 %: a warp reads each activation once, and the CTAs of
// an SM read them at about the same time). More rows per group take one pass (one stream of the
// weights) per row, so the plan chooses it only where a group has at most one row (batch-1
// decode: a token picks an expert once; gemv_plan.h, mma_ring_form). The slice goes through L1
// (cp.async.ca): at one token every CTA copies the same row at about the same stage, and through
// L2 alone those requests queue at the line's L2 slice (the experts' gate|up 44.2 -> 37.1 us).
// It is read after the PDL wait, as every L1 read of an earlier kernel's output here, so no
// stale line can answer.
// kScaleOut (kPacked and kStageX): the block scales multiply the mma's outputs instead of its A
// operands. With one activation row the mma's 8 B columns are free: the lanes of column c =
// 2t' + h carry the activations of k-group t' in the k-steps of half h (k-steps 4h .. 4h + 3,
// whose weights are all in block 2t' + h), the others zeros (read from the zeros after each
// staged chunk), so output column c of a chunk holds its rows' sums over block c alone; the lane
// holding columns 2t, 2t + 1 multiplies them by the scales of blocks 2t, 2t + 1 (4 FFMA per
// chunk instead of 4 HMUL2 per mma), and the columns are summed at the end. SASS: 205 instead
// of 256 instructions per stage's compute (16 mma). H200, one call: 8-layer model steps
// 1.622 / 1.685, 1.625 / 1.685, 1.621 / 1.693 ms (batch 1 at 1K
// / 4K) against 1.644 / 1.701, 1.640 / 1.700, 1.641 / 1.698 without; the experts alone only
// 62.3-62.5 against 62.8-63.2 us: alone they are not bound by their instruction count; 60
// layers at batch 1: -2.0 to -2.6 %.
template <QuantFormat F, int NG, bool kPacked = false, bool kStageX = false,
          bool kScaleOut = false>
__global__ void __launch_bounds__(256, 3) gemv_mma_ring_kernel(QuantGemvParams p) {
  static_assert(!kStageX || (NG == 1 && F == QuantFormat::kNvfp4),
                "staged activations: NVFP4, one row per pass");
  static_assert(!kScaleOut || (kPacked && kStageX), "output scales: packed, staged activations");
  using T = MmaTraits<F>;
  constexpr int kU = T::kU;
  constexpr int kStage = mma_stage_bytes<F>();        // the x slice (kStageX) follows it
  constexpr int kSlot = mma_slot_bytes<F, kStageX>();  // ring slot stride
  constexpr int kXChunkPieces = T::kChunkK * 2 / 16;   // 16-byte pieces of x per chunk
  constexpr int kXChunk = mma_x_chunk_stride<F>();     // staged x: a chunk's slice + 16 zeros
  constexpr int kRowsPerPass = kStageX ? 1 : 8 * NG;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  // Launched with `pdl` (runtime/pdl.cuh): the CTA may start under the previous kernel's tail and
  // waits for it here, before the routing or the activations it wrote are read (no-ops without
  // the launch attribute). With p.weights_before_wait the group is read and the first stages'
  // weights are requested first, and the CTA waits just before it needs the rows (below).
  // Its dependents may be scheduled only once it has waited: a dependent that reads this
  // kernel's inputs before its own wait (weights_before_wait) then finds them complete.
  const bool early = p.weights_before_wait;
  if (!early) {
    pdl_wait();
    pdl_launch_dependents();
  }

  const int64_t grp = cta_group(p);
  if (grp < 0) return;  // an empty slot: the whole CTA
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  const int64_t row_bytes = F == QuantFormat::kMxfp8 ? k : k / 2;
  const int64_t scale_cols = F == QuantFormat::kMxfp8 ? k / 32 : k / 16;
  const uint8_t* wbase = p.w + grp * int64_t{n} * row_bytes;
  const uint8_t* sbase = p.w_scale + grp * int64_t{n} * scale_cols;
  auto weight_row = [&](int r) { return mma_tile_weight_row(tile, r, n, swiglu); };
  // This warp's stages (kU chunks each; the last may be partial: its missing chunks are
  // zero-filled, so every stage is computed whole, without branches).
  const int chunks = k / T::kChunkK;
  const int stages = (chunks + kU - 1) / kU;
  const int st_begin = static_cast<int>(int64_t{stages} * warp / nwarps);
  const int st_end = static_cast<int>(int64_t{stages} * (warp + 1) / nwarps);
  const int nst = st_end - st_begin;
  uint8_t* ring = smem + warp * kMmaStages * kSlot;
  // The ring's shared-memory address, once, through an opaque move: otherwise ptxas, short of
  // registers under the 80-register cap, rematerialises it from the special registers (CTA id,
  // thread id) at every stage (SASS: ~10 instructions per stage).
  const uint32_t ring_s = opaque_u32(smem_u32(ring));
  static_assert(kMmaStages == 2, "the lane's copy addresses below are per slot");
  const uint32_t ring_lane0 = opaque_u32(ring_s + 16 * lane),
                 ring_lane1 = opaque_u32(ring_s + kSlot + 16 * lane);
  // kScaleOut: where this lane reads its activations of k-step pair q (k-steps 2q, 2q + 1) in a
  // staged chunk: its B column g is block 2t + h's where g = 2t + h (h = q / 2), else the zeros.
  int x_off[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    x_off[q] = g == 2 * t + (q >> 1) ? 16 * nvfp4_x_piece_slot(4 * t + q) : T::kChunkK * 2;

  // This lane's copies, fixed for the whole stream. MXFP8: a chunk = 16 rows x 32 bytes = 32
  // pieces of 16 bytes (lane l: row l / 2, half l % 2); scales: rows 0..15 x 4 bytes (4 chunks;
  // lanes 0..15). NVFP4: a chunk = 16 rows x 64 bytes = 64 pieces (lane l: pieces l and l + 32:
  // row p / 4, quarter p % 4); scales: 16 rows x 2 chunks x 8 bytes (one 16-byte copy per row
  // by lanes 0..15 where aligned, else lane l copies chunk l / 16 of row l % 16).
  constexpr int kPieces = F == QuantFormat::kMxfp8 ? 1 : 2;
  const uint8_t* w_src[kPieces];
  uint32_t w_dst[kPieces];
  bool w_ok[kPieces];
  // Bytes between consecutive chunks of one copy: along a row, or (packed) whole 1-KB blocks.
  const int64_t chunk_stride = kPacked ? T::kChunkBytes : T::kChunkBytes / 16;
#pragma unroll
  for (int h = 0; h < kPieces; ++h) {
    const int piece = lane + 32 * h;
    if constexpr (kPacked) {  // the (tile, chunk) block is copied as it is stored (issue())
      w_src[h] = wbase + int64_t{tile} * chunks * T::kChunkBytes + 16 * piece;
      continue;
    }
    const int r = F == QuantFormat::kMxfp8 ? piece >> 1 : piece >> 2;
    const int q = F == QuantFormat::kMxfp8 ? piece & 1 : piece & 3;
    const int row = weight_row(r);
    w_ok[h] = row >= 0;
    w_src[h] = wbase + int64_t{row >= 0 ? row : 0} * row_bytes + 16 * q;
    w_dst[h] = (F == QuantFormat::kMxfp8 ? r * 32 : r * 64) + 16 * q;
  }
  const int s_r = F == QuantFormat::kMxfp8 ? lane : lane & 15;
  const int s_row = weight_row(s_r);
  const bool s_ok = s_row >= 0 && (F == QuantFormat::kNvfp4 || lane < 16);
  const uint8_t* s_src = sbase + int64_t{s_row >= 0 ? s_row : 0} * scale_cols;
  // NVFP4 scales by 16-byte copies where every row's scales are 16-byte aligned (K % 256 == 0).
  const bool scale16 = F == QuantFormat::kNvfp4 && scale_cols % 16 == 0 &&
                       (reinterpret_cast<uintptr_t>(sbase) & 15) == 0;

  const uint8_t* xsrc = nullptr;  // kStageX: the pass's activation row (f16 bytes)
  // Stage s into ring slot `slot`: its weights and scales (issue_weights) and, kStageX, its
  // activations (issue_x).
  auto issue_weights = [&](int s, int slot) {
    const uint32_t base = ring_s + slot * kSlot;
    const int c0 = s * kU;
    if constexpr (kPacked) {
      // The lane's pieces of kU consecutive 1-KB blocks (N % 16 == 0: every tile is whole), no
      // per-piece predicates: one base pointer and immediate offsets; chunks past K are
      // zero-filled, reading the stage's first.
      const uint8_t* src = w_src[0] + int64_t{c0} * T::kChunkBytes;
      const uint32_t dst = (slot ? ring_lane1 : ring_lane0);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const bool in = u == 0 || c0 + u < chunks;
#pragma unroll
        for (int h = 0; h < kPieces; ++h)
          cp_async16(dst + u * T::kChunkBytes + 512 * h,
                     src + (in ? u * T::kChunkBytes : 0) + 512 * h, in ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u)
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          const bool in = w_ok[h] && c0 + u < chunks;
          cp_async16(base + u * T::kChunkBytes + w_dst[h],
                     w_src[h] + (in ? int64_t{c0 + u} * chunk_stride : 0), in ? 16 : 0);
        }
    }
    if constexpr (F == QuantFormat::kMxfp8) {
      if (lane < 16) {
        const int valid = s_ok ? max(0, min(kU, chunks - c0)) : 0;
        cp_async4(base + kU * T::kChunkBytes + lane * 4, s_src + (valid > 0 ? c0 : 0), valid);
      }
    } else if (scale16) {
      // Both chunks' scales of a row are 16 contiguous bytes: one L2-only copy per row (lanes
      // 0..15), so the scale stream does not evict the activations from L1. K % 256 == 0 here,
      // so every stage is whole.
      if (lane < 16)
        cp_async16(base + kU * T::kChunkBytes + s_r * 16, s_src + int64_t{c0} * 8, s_ok ? 16 : 0);
    } else {
      const int u = lane >> 4;
      const bool in = s_ok && c0 + u < chunks;
      cp_async8(base + kU * T::kChunkBytes + s_r * 16 + u * 8,
                s_src + (in ? int64_t{c0 + u} * 8 : 0), in ? 8 : 0);
    }
  };
  auto issue_x = [&](int s, int slot) {
    if constexpr (kStageX) {
      const uint32_t base = ring_s + slot * kSlot;
      const int c0 = s * kU;
      // The stage's kU chunks of the row are contiguous: lane l copies piece l; chunks past K
      // are zero-filled (their weights are zero too).
      static_assert(kU * kXChunkPieces == 32, "one piece per lane");
      const int u = lane / kXChunkPieces, pc = lane % kXChunkPieces;
      const bool in = c0 + u < chunks;
      const uint32_t dst = base + kStage + u * kXChunk + 16 * nvfp4_x_piece_slot(pc);
      const uint8_t* src = xsrc + (in ? int64_t{c0} * T::kChunkK * 2 + 16 * lane : 0);
      cp_async16_l1(dst, src, in ? 16 : 0);  // through L1: the CTAs of an SM share the request
    }
  };
  auto issue = [&](int s, int slot) {
    issue_weights(s, slot);
    issue_x(s, slot);
  };

  // The first pass's first kMmaStages stages of weights and scales go out as soon as the group
  // is known: before the group's rows and their activations are read (two dependent L2 round
  // trips), and with p.weights_before_wait before the PDL wait, so that the stream starts under
  // the previous kernel's tail. Their activations follow in the pipeline below. H200, 8-layer
  // model steps in one run, three rounds, two stages against one: 1.560 / 1.554 / 1.559 against
  // 1.575 / 1.554 / 1.564 ms at batch 1, 1K; 1.615 / 1.618 / 1.614 against 1.629 / 1.613 /
  // 1.625 at 4K; 2.820 / 2.825 / 2.830 against 2.839 / 2.820 / 2.838 at batch 8. Alone (no
  // kernel before it to overlap) the batch-1 experts lose by it, 50.9-51.1 against 49.3-49.4
  // us: the first mma then waits for both stages.
  int prefetched = min(nst, kMmaStages);
  for (int i = 0; i < prefetched; ++i) issue_weights(st_begin + i, i);
  if (early) {
    pdl_wait();
    pdl_launch_dependents();
  }
  int r_begin, r_end;
  group_rows(p, grp, &r_begin, &r_end);
  if (r_begin >= r_end) {  // no rows (an active group has some): let the copies land first
    cp_async_wait<0>();
    return;
  }

  for (int r0 = r_begin; r0 < r_end; r0 += kRowsPerPass) {
    const int rows_here = min(r_end - r0, kRowsPerPass);
    // x row of this lane's B column (token g of each group of 8), at the lane's column within
    // a chunk (8t for MXFP8, 32t for NVFP4); tokens past the rows read the first row (valid
    // memory; their columns are not stored).
    const uint16_t* xrow[NG];
#pragma unroll
    for (int ng = 0; ng < NG; ++ng) {
      const int m = ng * 8 + g < rows_here ? ng * 8 + g : 0;
      const int r = r0 + m;
      const int64_t rid = p.sorted_rows ? p.sorted_rows[r] : r;
      xrow[ng] = p.xh + (rid / p.x_row_div) * p.ldx + (F == QuantFormat::kMxfp8 ? 8 : 32) * t;
      if (kStageX) xsrc = reinterpret_cast<const uint8_t*>(p.xh + (rid / p.x_row_div) * p.ldx);
    }
    float acc[NG][4];
#pragma unroll
    for (int ng = 0; ng < NG; ++ng)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[ng][j] = 0.0f;
    // Packed NVFP4 at one group of 8 tokens: the odd k-steps accumulate apart, so that the
    // chunk's 8 mma form two dependent chains instead of one (with NG > 1 the groups already do).
    // H200, cuda_decode_bench experts: 1 / 8 / 32 tokens 51.2-51.9 / 251.6-252.7 / 689.0-690.5
    // us against 51.9-52.1 / 253.1-253.4 / 692.6-697.3.
    constexpr bool kOddChain = kPacked && NG == 1 && !kScaleOut;
    float acc_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    // One stage from ring slot `slot` (chunks c0 .. c0 + kU; those past K are zero weights and
    // read the last chunk's activations, or staged zeros, so they add exact zeros).
    auto compute = [&](int slot, int c0) {
      const uint8_t* st = ring + slot * kSlot;
      // Piece pc (16 bytes) of chunk u's activations: staged in the slot or read through L1.
      auto x16 = [&](int ng, int u, int c, int pc) -> uint4 {
        if constexpr (kStageX) {
          return *reinterpret_cast<const uint4*>(st + kStage + u * kXChunk +
                                                 16 * nvfp4_x_piece_slot(pc));
        } else {  // xrow already points at the lane's first piece (t)
          const int q = F == QuantFormat::kNvfp4 ? pc & 3 : 0;
          return __ldg(reinterpret_cast<const uint4*>(xrow[ng] + c * T::kChunkK + 8 * q));
        }
      };
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = min(c0 + u, chunks - 1);  // activations: never past the row
        if constexpr (F == QuantFormat::kMxfp8) {
          const uint2 wl =
              *reinterpret_cast<const uint2*>(st + u * T::kChunkBytes + g * 32 + 8 * t);
          const uint2 wh =
              *reinterpret_cast<const uint2*>(st + u * T::kChunkBytes + (g + 8) * 32 + 8 * t);
          const uint32_t a00 = e4m3x2_to_f16x2(wl.x), a01 = e4m3x2_to_f16x2(wh.x),
                         a02 = e4m3x2_to_f16x2(wl.x >> 16), a03 = e4m3x2_to_f16x2(wh.x >> 16);
          const uint32_t a10 = e4m3x2_to_f16x2(wl.y), a11 = e4m3x2_to_f16x2(wh.y),
                         a12 = e4m3x2_to_f16x2(wl.y >> 16), a13 = e4m3x2_to_f16x2(wh.y >> 16);
          const uint8_t* sc = st + kU * T::kChunkBytes;
          const float f_lo = e8m0_exact(sc[g * 4 + u]), f_hi = e8m0_exact(sc[(g + 8) * 4 + u]);
#pragma unroll
          for (int ng = 0; ng < NG; ++ng) {
            const uint4 xv = x16(ng, u, c, t);
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_f16(d, a00, a01, a02, a03, xv.x, xv.y);
            mma_f16(d, a10, a11, a12, a13, xv.z, xv.w);
            acc[ng][0] = fmaf(d[0], f_lo, acc[ng][0]);
            acc[ng][1] = fmaf(d[1], f_lo, acc[ng][1]);
            acc[ng][2] = fmaf(d[2], f_hi, acc[ng][2]);
            acc[ng][3] = fmaf(d[3], f_hi, acc[ng][3]);
          }
        } else if constexpr (kScaleOut) {
          uint32_t wv[8];
          nvfp4_lane_words(st + u * T::kChunkBytes, lane, wv);
          // The lane's activations of k-step pairs q = 0..3, or zeros (x_off).
          const uint8_t* xs = st + kStage + u * kXChunk;
          uint4 xc[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) xc[q] = *reinterpret_cast<const uint4*>(xs + x_off[q]);
          // Two chains (even and odd k-steps), each from a zero accumulator.
          float de[4], dodd[4];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint32_t x = wv[i];
            const uint4 xv = xc[i / 2];
            const uint32_t b0 = i % 2 ? xv.z : xv.x, b1 = i % 2 ? xv.w : xv.y;
            const uint32_t a0 = nvfp4_mma::fragment(x, 0), a1 = nvfp4_mma::fragment(x, 1),
                           a2 = nvfp4_mma::fragment(x, 2), a3 = nvfp4_mma::fragment(x, 3);
            float(&d)[4] = i % 2 ? dodd : de;
            if (i < 2)
              mma_f16_first(d, a0, a1, a2, a3, b0, b1);
            else
              mma_f16(d, a0, a1, a2, a3, b0, b1);
          }
          // Blocks 2t (low byte) and 2t + 1 of rows g and g + 8: this lane's output columns.
          const uint8_t* sc = st + kU * T::kChunkBytes + u * 8 + 2 * t;
          const uint32_t hl = e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(sc + g * 16));
          const uint32_t hh =
              e4m3x2_to_f16x2(*reinterpret_cast<const uint16_t*>(sc + (g + 8) * 16));
          const float s[4] = {f16_bits_to_f32(hl), f16_bits_to_f32(hl >> 16), f16_bits_to_f32(hh),
                              f16_bits_to_f32(hh >> 16)};
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[0][j] = fmaf(de[j] + dodd[j], s[j], acc[0][j]);
        } else if constexpr (kPacked) {
          uint32_t wv[8];
          nvfp4_lane_words(st + u * T::kChunkBytes, lane, wv);
          // Block scales: k-steps 0..3 are block 2t, 4..7 block 2t + 1.
          uint32_t sl0, sl1, sh0, sh1;
          nvfp4_lane_scales(st + kU * T::kChunkBytes + u * 8, g, t, &sl0, &sl1, &sh0, &sh1);
          // The chunk's activations first (independent of the weights): their L1/L2 latency
          // overlaps the dequantisation instead of stalling the first mma of each pair.
          uint4 xc[NG][4];
#pragma unroll
          for (int ng = 0; ng < NG; ++ng)
#pragma unroll
            for (int q = 0; q < 4; ++q)
              xc[ng][q] = x16(ng, u, c, 4 * t + q);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint32_t x = wv[i];
            const uint32_t scl = i < 4 ? sl0 : sl1, sch = i < 4 ? sh0 : sh1;
            // a0, a2: row g, columns (j0, j1), (j2, j3); a1, a3: row g + 8.
            const uint32_t a0 = hmul2(nvfp4_mma::fragment(x, 0), scl),
                           a1 = hmul2(nvfp4_mma::fragment(x, 1), sch),
                           a2 = hmul2(nvfp4_mma::fragment(x, 2), scl),
                           a3 = hmul2(nvfp4_mma::fragment(x, 3), sch);
#pragma unroll
            for (int ng = 0; ng < NG; ++ng) {
              // Columns 32t + 4i .. + 3 of the chunk: one 16-byte load serves k-steps i, i + 1.
              const uint4 xv = xc[ng][i / 2];
              mma_f16(kOddChain && i % 2 ? acc_odd : acc[ng], a0, a1, a2, a3,
                      i % 2 ? xv.z : xv.x, i % 2 ? xv.w : xv.y);
            }
          }
        } else {
          const uint4 lo =
              *reinterpret_cast<const uint4*>(st + u * T::kChunkBytes + g * 64 + 16 * t);
          const uint4 hi =
              *reinterpret_cast<const uint4*>(st + u * T::kChunkBytes + (g + 8) * 64 + 16 * t);
          uint32_t sl0, sl1, sh0, sh1;  // block scales (elements 0..15 / 16..31 of the lane's 32)
          nvfp4_lane_scales(st + kU * T::kChunkBytes + u * 8, g, t, &sl0, &sl1, &sh0, &sh1);
          const uint32_t wl[4] = {lo.x, lo.y, lo.z, lo.w};
          const uint32_t wh[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint32_t scl = q < 2 ? sl0 : sl1, sch = q < 2 ? sh0 : sh1;
            const uint32_t l0 = hmul2(e2m1_pair_h2<0>(wl[q]), scl),
                           l1 = hmul2(e2m1_pair_h2<1>(wl[q]), scl),
                           l2 = hmul2(e2m1_pair_h2<2>(wl[q]), scl),
                           l3 = hmul2(e2m1_pair_h2<3>(wl[q]), scl);
            const uint32_t h0 = hmul2(e2m1_pair_h2<0>(wh[q]), sch),
                           h1 = hmul2(e2m1_pair_h2<1>(wh[q]), sch),
                           h2 = hmul2(e2m1_pair_h2<2>(wh[q]), sch),
                           h3 = hmul2(e2m1_pair_h2<3>(wh[q]), sch);
#pragma unroll
            for (int ng = 0; ng < NG; ++ng) {
              // x elements 8q .. 8q + 7 of the lane's 32.
              const uint4 xv = x16(ng, u, c, 4 * t + q);
              // k-step 0: pairs (0,4), (1,5); k-step 1: (2,6), (3,7).
              mma_f16(acc[ng], l0, h0, l1, h1, prmt(xv.x, xv.z, 0x5410), prmt(xv.x, xv.z, 0x7632));
              mma_f16(acc[ng], l2, h2, l3, h3, prmt(xv.y, xv.w, 0x5410), prmt(xv.y, xv.w, 0x7632));
            }
          }
        }
      }
    };

    // The warp's pipeline: kMmaStages - 1 stages in flight while one is used. Every iteration
    // commits one group (possibly empty), so wait_group<kMmaStages - 2> means "stage i landed"
    // (kMmaStages = 2: wait for everything, the one stage in flight).
    __syncthreads();  // the previous pass's sums (which reuse the rings) have been read
    if constexpr (kScaleOut) {  // the zeros after each staged chunk (the sums may have used them)
      if (lane < kMmaStages * kU)
        *reinterpret_cast<uint4*>(ring + (lane / kU) * kSlot + kStage + (lane % kU) * kXChunk +
                                  T::kChunkK * 2) = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kMmaStages - 1; ++i) {
      if (i < prefetched)
        issue_x(st_begin + i, i);
      else if (i < nst)
        issue(st_begin + i, i);
      cp_async_commit();
    }
    for (int i = 0; i < nst; ++i) {
      cp_async_wait<kMmaStages - 2>();
      __syncwarp();  // every lane's copies of stage i are visible; slot (i - 1) is free
      const int next = i + kMmaStages - 1;
      if (next < prefetched)  // its weights went out before the rows were read
        issue_x(st_begin + next, next % kMmaStages);
      else if (next < nst)
        issue(st_begin + next, next % kMmaStages);
      cp_async_commit();
      compute(i % kMmaStages, (st_begin + i) * kU);
    }
    prefetched = 0;  // later passes stream the weights again, whole
    cp_async_wait<0>();
    if constexpr (kOddChain)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][j] += acc_odd[j];
    if constexpr (kScaleOut) {
      // Rows g and g + 8 over the 8 block columns (2 here, 2 in each lane of the quad), into
      // column 0, the row's (the other columns are not stored: one row per pass).
      float lo = acc[0][0] + acc[0][1], hi = acc[0][2] + acc[0][3];
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
      lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
      hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 2);
      acc[0][0] = lo, acc[0][2] = hi, acc[0][1] = 0.0f, acc[0][3] = 0.0f;
    }

    // Sum the warps' fragments in warp order; then the epilogue, one thread per (group, lane).
    __syncthreads();  // every warp is done with its ring: reuse the memory for the sums
    float* red = reinterpret_cast<float*>(smem);  // [W][NG][32][4]
#pragma unroll
    for (int ng = 0; ng < NG; ++ng)
      reinterpret_cast<float4*>(red)[(warp * NG + ng) * 32 + lane] =
          make_float4(acc[ng][0], acc[ng][1], acc[ng][2], acc[ng][3]);
    __syncthreads();
    for (int idx = threadIdx.x; idx < NG * 32; idx += blockDim.x) {  // 2-warp CTAs: 2 rounds
      const int ng = idx >> 5, ln = idx & 31;
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int w = 0; w < nwarps; ++w) {
        const float4 f = reinterpret_cast<const float4*>(red)[(w * NG + ng) * 32 + ln];
        v[0] += f.x, v[1] += f.y, v[2] += f.z, v[3] += f.w;
      }
      int64_t rid[2];
      float f[2];
      mma_fragment_tokens<F>(p, ln, ng * 8, rows_here, r0, grp, rid, f,
                             kScaleOut ? 16384.0f : 128.0f);
      mma_fragment_store(p, v, weight_row(ln >> 2), weight_row((ln >> 2) + 8), rid, f);
    }
  }
}

}  // namespace m3::cuda::gemv

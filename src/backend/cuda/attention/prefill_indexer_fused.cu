// Lightning-indexer block scores of a prefill chunk straight from the tensor cores
// (PrefillIndexerKernel::kFusedMaxPool of launch_prefill_attention, see sparse_prefill.h).
//
// Why: kGemmScores (prefill_indexer.cu) writes every token score [T·Hix, keys] in float32 and
// reads it back for the max-pool (at T = 32K and a 32K context: 16 GiB of traffic for 0.5 TFLOP
// of work), after gathering the index keys into a copy and reading the positions on the host.
// Here the max over a block's keys is taken where the scores are produced.
//
// Rows r = t·Hix + h of iq [T, Hix, Dix] (contiguous, Dix = 128). One CTA takes 128 rows (4
// warps x 2 m-tiles of 16; the A fragments of Q stay in registers) and the blocks blockIdx.y,
// blockIdx.y + gridDim.y, ... of the table. A computed block's 128 x 128 index keys go through a
// cp.async double buffer in shared memory (rows padded to 272 bytes: conflict-free ldmatrix);
// per 32-key slice each warp computes its 32 x 32 scores with mma.sync m16n8k16 (bf16 in,
// float32 accumulate), replaces keys past the row's position by -inf and folds them into a
// running row max; the max over the 128 keys is written as block_scores[r, blk]. Blocks past
// the tile's last causal block or without a page are not loaded and score -inf, as are blocks
// past a row's own b_q (all their keys are masked) — the semantics of launch_index_maxpool.
// The positions are read on the device, so there is no host synchronisation.
//
// Key rows past the tile's last position are zero-filled instead of loaded (an unwritten page
// tail may hold NaN bit patterns; those scores are masked anyway, by selection, not arithmetic).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/attention/mma_bf16.cuh"
#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/dynamic_smem.cuh"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kDix = 128;
constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kMt = 2;                       // m-tiles (16 rows) per warp
constexpr int kRows = kWarps * kMt * 16;     // 128 rows per CTA
constexpr int kPitch = kDix + 8;             // bf16 per key row in shared memory (272 bytes)
constexpr int kStageBytes = kS * kPitch * 2; // 34816
constexpr int kSmem = 2 * kStageBytes + 16;  // + the tile's last position

__global__ void __launch_bounds__(kThreads) index_block_scores_fused_kernel(
    const uint16_t* __restrict__ iq, const uint16_t* __restrict__ idx_k, int64_t num_pages,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ block_table, int64_t rows,
    int64_t hix, int64_t nb, float* __restrict__ block_scores) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t(*keys)[kS][kPitch] = reinterpret_cast<uint16_t(*)[kS][kPitch]>(smem);
  int32_t* s_pos_max = reinterpret_cast<int32_t*>(smem + 2 * kStageBytes);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gi = lane >> 2, ci = lane & 3;
  // The last tiles first: the longest (most causal blocks) start in the first wave.
  const int64_t row0 = int64_t{gridDim.x - 1 - blockIdx.x} * kRows;

  if (tid == 0) *s_pos_max = -1;
  __syncthreads();
  {
    // The tile's tokens: row0 / hix .. (last row) / hix.
    const int64_t last_row = (row0 + kRows < rows ? row0 + kRows : rows) - 1;
    const int64_t tf = row0 / hix, tl = last_row / hix;
    int m = -1;
    for (int64_t tt = tf + tid; tt <= tl; tt += kThreads) m = max(m, positions[tt]);
    atomicMax(s_pos_max, m);
  }
  // This thread's rows (g and g + 8 of each m-tile) and their positions (-1: past the chunk).
  int64_t row[kMt][2];
  int pos[kMt][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row[mt][hf] = row0 + (warp * kMt + mt) * 16 + gi + 8 * hf;
      pos[mt][hf] = row[mt][hf] < rows ? positions[row[mt][hf] / hix] : -1;
    }
  }
  // A fragments (rows past the chunk: zeros).
  uint32_t qa[kMt][8][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const uint16_t* lo = iq + row[mt][0] * kDix;
    const uint16_t* hi = iq + row[mt][1] * kDix;
    const bool ok_lo = row[mt][0] < rows, ok_hi = row[mt][1] < rows;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const int d0 = ks * 16 + 2 * ci;
      qa[mt][ks][0] = ok_lo ? *reinterpret_cast<const uint32_t*>(lo + d0) : 0u;
      qa[mt][ks][1] = ok_hi ? *reinterpret_cast<const uint32_t*>(hi + d0) : 0u;
      qa[mt][ks][2] = ok_lo ? *reinterpret_cast<const uint32_t*>(lo + d0 + 8) : 0u;
      qa[mt][ks][3] = ok_hi ? *reinterpret_cast<const uint32_t*>(hi + d0 + 8) : 0u;
    }
  }
  __syncthreads();
  const int pos_max = *s_pos_max;
  const int64_t nb_causal = pos_max / kS + 1 < nb ? pos_max / kS + 1 : nb;

  // This CTA's blocks: blockIdx.y + j·gridDim.y. Page of block j's stage, -1: not loaded.
  const int64_t n_local = (nb - blockIdx.y + gridDim.y - 1) / gridDim.y;
  auto block_of = [&](int64_t j) { return int64_t{blockIdx.y} + j * gridDim.y; };
  auto page_of = [&](int64_t blk) -> int64_t {
    if (blk >= nb_causal) return -1;
    const int64_t page = block_table[blk];
    return (page < 0 || page >= num_pages) ? -1 : page;
  };
  auto load = [&](int64_t j) {
    if (j >= n_local) return;
    const int64_t blk = block_of(j);
    const int64_t page = page_of(blk);
    if (page < 0) return;
    uint16_t(*dst)[kPitch] = keys[j & 1];
    for (int chunk = tid; chunk < kS * 16; chunk += kThreads) {
      const int r = chunk >> 4, ch = chunk & 15;
      const bool ok = blk * kS + r <= pos_max;
      const uint16_t* src = ok ? idx_k + (page * kS + r) * kDix + ch * 8 : idx_k;
      cp_async16(smem_u32(&dst[r][ch * 8]), src, ok ? 16 : 0);
    }
  };

  const int mat = lane >> 3, mrow = lane & 7;
  load(0);
  cp_async_commit();
  for (int64_t j = 0; j < n_local; ++j) {
    load(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int64_t blk = block_of(j);
    float mx[kMt][2];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) mx[mt][0] = mx[mt][1] = -INFINITY;
    if (page_of(blk) >= 0) {
      uint16_t(*kt)[kPitch] = keys[j & 1];
#pragma unroll 1
      for (int ng = 0; ng < kS / 32; ++ng) {  // 32 keys = 4 n-tiles
        float acc[kMt][4][4];
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
          }
        // ldmatrix x4 rows: keys ng·32 + pair·16 + (mat / 2)·8 + mrow, dims (mat % 2)·8 + 16·ks.
        const uint32_t a0 = smem_u32(&kt[ng * 32 + (mat >> 1) * 8 + mrow][(mat & 1) * 8]);
        const uint32_t a1 = smem_u32(&kt[ng * 32 + 16 + (mat >> 1) * 8 + mrow][(mat & 1) * 8]);
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
          uint32_t b0[4], b1[4];
          ldmatrix_x4(a0 + ks * 32, b0);
          ldmatrix_x4(a1 + ks * 32, b1);
#pragma unroll
          for (int mt = 0; mt < kMt; ++mt) {
            mma_bf16(acc[mt][0], qa[mt][ks], b0[0], b0[1]);
            mma_bf16(acc[mt][1], qa[mt][ks], b0[2], b0[3]);
            mma_bf16(acc[mt][2], qa[mt][ks], b1[0], b1[1]);
            mma_bf16(acc[mt][3], qa[mt][ks], b1[2], b1[3]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t key = blk * kS + ng * 32 + nt * 8 + 2 * ci + e;
              if (key <= pos[mt][0]) mx[mt][0] = fmaxf(mx[mt][0], acc[mt][nt][e]);
              if (key <= pos[mt][1]) mx[mt][1] = fmaxf(mx[mt][1], acc[mt][nt][2 + e]);
            }
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
          for (int off = 1; off <= 2; off <<= 1)
            mx[mt][hf] = fmaxf(mx[mt][hf], __shfl_xor_sync(0xffffffffu, mx[mt][hf], off));
    }
    if (ci == 0) {
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          if (row[mt][hf] < rows) block_scores[row[mt][hf] * nb + blk] = mx[mt][hf];
    }
    __syncthreads();  // the buffer of block j is free before load(j + 2)
  }
  cp_async_wait<0>();
}

}  // namespace

Status launch_index_block_scores_fused(const uint16_t* iq, const KvCacheView& cache,
                                       const int32_t* positions, const int32_t* block_table,
                                       int64_t t, int64_t hix, int64_t nb, float* block_scores,
                                       CUstream_st* stream) {
  if (t == 0 || nb == 0) return Status::ok();
  if (cache.index_head_dim != kDix || cache.page_size != kS || cache.idx_k == nullptr ||
      hix <= 0)
    return invalid_argument("[cuda.prefill_indexer_fused] needs Dix = 128, page 128 and index "
                            "keys");
  if ((reinterpret_cast<uintptr_t>(iq) | reinterpret_cast<uintptr_t>(cache.idx_k)) % 16 != 0)
    return invalid_argument("[cuda.prefill_indexer_fused] iq and idx_k must be 16-byte aligned");
  const int64_t rows = t * hix;
  const int64_t tiles = (rows + kRows - 1) / kRows;
  if (tiles > INT32_MAX) return invalid_argument("[cuda.prefill_indexer_fused] chunk too large");
  // Enough CTAs for ~3 waves of 3 resident CTAs per SM (132 SMs), each block in one CTA only.
  const int64_t splits = std::clamp<int64_t>((3 * 3 * 132 + tiles - 1) / tiles, 1,
                                             std::min<int64_t>(nb, 65535));
  M3_CUDA_RETURN_IF_ERROR(allow_dynamic_smem_once<index_block_scores_fused_kernel>(kSmem));
  dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  index_block_scores_fused_kernel<<<grid, kThreads, kSmem, stream>>>(
      iq, cache.idx_k, cache.num_pages, positions, block_table, rows, hix, nb, block_scores);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(index_block_scores_fused_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

// Lightning indexer of a prefill chunk on the tensor cores (PrefillIndexerKernel::kGemmScores of
// launch_prefill_attention): the chunk's index keys are gathered from their pages into one
// contiguous bf16 matrix, the token scores S[t·Hix + h, j] = <iq[t, h], idx_k[j]> come from one
// cuBLASLt bf16 GEMM (float32 accumulation; PrefillGemm with a BF16 "weight"), and this file's
// max-pool kernel reduces them to block scores with the decode indexer's semantics (keys past the
// token's position and blocks past b_q or without a page are -inf). The decode top-k kernel then
// forces the local / init blocks and selects (IndexerDecodeParams::scores_ready).
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kDix = 128;

// One CTA per block: copies its page's 128 x 128 index keys (zeros for a missing page).
__global__ void gather_index_keys_kernel(const uint16_t* __restrict__ idx_k,
                                         const int32_t* __restrict__ block_table,
                                         int64_t num_pages, uint16_t* __restrict__ out) {
  const int64_t blk = blockIdx.x;
  const int64_t page = block_table[blk];
  uint4* dst = reinterpret_cast<uint4*>(out + blk * kS * kDix);
  if (page < 0 || page >= num_pages) {
    for (int i = threadIdx.x; i < kS * kDix / 8; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(idx_k + page * kS * kDix);
  for (int i = threadIdx.x; i < kS * kDix / 8; i += blockDim.x) dst[i] = __ldg(src + i);
}

// One warp per (row = t·Hix + h, block): max over the block's keys j <= pos[t].
__global__ void index_maxpool_kernel(const float* __restrict__ scores, int64_t ld,
                                     int64_t blocks_computed, const int32_t* __restrict__ positions,
                                     const int32_t* __restrict__ block_table, int64_t num_pages,
                                     int64_t rows, int64_t hix, int64_t nb,
                                     float* __restrict__ block_scores) {
  const int64_t w = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= rows * nb) return;
  const int64_t row = w / nb, blk = w % nb, t = row / hix;
  const int64_t pos = positions[t];
  float m = -INFINITY;
  const int64_t page = blk < blocks_computed ? block_table[blk] : -1;
  if (blk <= pos / kS && page >= 0 && page < num_pages) {
    const float* s = scores + row * ld + blk * kS;
#pragma unroll
    for (int i = 0; i < kS / 32; ++i) {
      const int j = lane + 32 * i;
      if (blk * kS + j <= pos) m = fmaxf(m, s[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
  if (lane == 0) block_scores[row * nb + blk] = m;
}

}  // namespace

Status launch_gather_index_keys(const KvCacheView& cache, const int32_t* block_table,
                                int64_t num_blocks, uint16_t* out, CUstream_st* stream) {
  if (num_blocks == 0) return Status::ok();
  if (cache.index_head_dim != kDix || cache.page_size != kS || cache.idx_k == nullptr ||
      num_blocks > INT32_MAX)
    return invalid_argument("[cuda.prefill_indexer] needs Dix = 128, page 128 and index keys");
  gather_index_keys_kernel<<<static_cast<unsigned>(num_blocks), 256, 0, stream>>>(
      cache.idx_k, block_table, cache.num_pages, out);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(gather_index_keys_kernel);
  return Status::ok();
}

Status launch_index_maxpool(const float* scores, int64_t ld, int64_t blocks_computed,
                            const int32_t* positions, const int32_t* block_table,
                            int64_t num_pages, int64_t t, int64_t hix, int64_t nb,
                            float* block_scores, CUstream_st* stream) {
  const int64_t warps = t * hix * nb;
  if (warps == 0) return Status::ok();
  const int64_t ctas = (warps * 32 + 255) / 256;
  if (ctas > INT32_MAX) return invalid_argument("[cuda.prefill_indexer] chunk too large");
  index_maxpool_kernel<<<static_cast<unsigned>(ctas), 256, 0, stream>>>(
      scores, ld, blocks_computed, positions, block_table, num_pages, t * hix, hix, nb,
      block_scores);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(index_maxpool_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

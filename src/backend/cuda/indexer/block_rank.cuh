// The decode indexer's top-k rule as device pieces, shared by the top-k kernel
// (indexer_decode.cu) and the clustered split attention that selects its own blocks
// (attention/sparse_decode_mma.cu), so that both pick the same blocks in the same order:
// candidate blocks 0 .. qb of a row, the local ones (qb - local + 1 .. qb) and the init ones
// (0 .. init - 1) forced to +inf, a NaN score to -inf; a block's rank is the number of blocks
// that beat it in (score descending, id ascending) order, so the ranks are a permutation of
// 0 .. n - 1 and rank r < k fills slot r; a -inf winner (a missing page) selects -1.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace m3::cuda::block_rank {

// The first local block of a row whose last block is qb (qb + 1: none).
__device__ __forceinline__ int64_t local_first(int64_t qb, int64_t local_blocks) {
  return local_blocks >= 1 ? qb - local_blocks + 1 : qb + 1;
}

// Block i's ranking key from its score.
__device__ __forceinline__ float candidate_key(const float* scores, int64_t i, int64_t local0,
                                               int64_t init_blocks) {
  const float v = i >= local0 || i < init_blocks ? INFINITY : scores[i];
  return v == v ? v : -INFINITY;
}

// Adjacent lanes per candidate (a power of two, 1 .. 32) when `threads` threads rank `count`
// candidates in one pass where they fit.
__device__ __forceinline__ int lanes_per_candidate(int64_t count, int threads) {
  int np2 = 1;
  while (np2 < count) np2 <<= 1;
  return min(32, max(1, threads / np2));
}

// The rank of candidate i (key v) among keys[0 .. n): lane `part` of the candidate's P lanes
// counts the competitors j = part, part + P, ..., and shuffles add the P counts (integers: exact
// in any order). Every lane of the warp calls it (live: whether its candidate exists).
__device__ __forceinline__ int rank_of(const float* keys, int64_t n, int64_t i, float v,
                                       bool live, int part, int lanes) {
  int rank = 0;
  if (live)
    for (int64_t j = part; j < n; j += lanes) {
      const float u = keys[j];
      rank += (u > v) || (u == v && j < i);
    }
  for (int o = lanes / 2; o > 0; o >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
  return rank;
}

// What a winning block writes into its slot.
__device__ __forceinline__ int32_t selected_id(float v, int64_t i) {
  return v == -INFINITY ? -1 : static_cast<int32_t>(i);
}

}  // namespace m3::cuda::block_rank

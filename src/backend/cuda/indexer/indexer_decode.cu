// Lightning indexer for decode (bf16 index-key cache, float32 scores): one CTA per (block,
// sequence) loads the page's 128 index keys once and scores them against the Hix query heads,
// max-pooling to one score per (head, block); then one CTA per (sequence, head) forces the local
// and init blocks and picks the top_k blocks (descending score, ties to the lower id).
#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kS = 128, kDix = 128, kMaxHix = 8, kThreads = 128;
constexpr int kPitch = kDix / 2 + 1;
// Candidate blocks up to which the top-k is a rank count (contexts to 128K tokens); beyond, the
// slot-by-slot selection.
constexpr int kRankMax = 1024;

__global__ void __launch_bounds__(kThreads) indexer_score_kernel(IndexerDecodeParams p) {
  __shared__ uint32_t ks[kS][kPitch];
  __shared__ float qs[kMaxHix][kDix];
  __shared__ float red[kMaxHix][kThreads / 32];
  const int64_t blk = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t hix = p.num_index_heads;
  const int64_t pos = p.positions[b];
  float* out = p.block_scores + b * hix * p.max_blocks + blk;
  const int64_t row = b * (p.block_table_stride < 0 ? p.max_blocks : p.block_table_stride);
  const int64_t page = blk <= pos / kS ? p.block_tables[row + blk] : -1;
  if (page < 0 || page >= p.cache.num_pages) {
    if (tid < hix) out[tid * p.max_blocks] = -INFINITY;
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(p.cache.idx_k + page * kS * kDix);
  for (int i = tid; i < kS * kDix / 8; i += kThreads) {
    const uint4 v = __ldg(src + i);
    const int s = i / (kDix / 8), w = (i % (kDix / 8)) * 4;
    ks[s][w] = v.x, ks[s][w + 1] = v.y, ks[s][w + 2] = v.z, ks[s][w + 3] = v.w;
  }
  for (int i = tid; i < hix * kDix; i += kThreads)
    qs[i / kDix][i % kDix] = bf16_to_f32(p.iq[b * hix * kDix + i]);
  __syncthreads();
  float acc[kMaxHix];
#pragma unroll
  for (int h = 0; h < kMaxHix; ++h) acc[h] = 0.0f;
  for (int d2 = 0; d2 < kDix / 2; ++d2) {
    const uint32_t w = ks[tid][d2];
    const float k0 = __uint_as_float(w << 16), k1 = __uint_as_float(w & 0xFFFF0000u);
#pragma unroll
    for (int h = 0; h < kMaxHix; ++h)
      if (h < hix) acc[h] = fmaf(qs[h][2 * d2 + 1], k1, fmaf(qs[h][2 * d2], k0, acc[h]));
  }
  const bool valid = blk * kS + tid <= pos;
#pragma unroll
  for (int h = 0; h < kMaxHix; ++h) {
    if (h >= hix) break;
    const float m = warp_max(valid ? acc[h] : -INFINITY);
    if (lane == 0) red[h][warp] = m;
  }
  __syncthreads();
  if (tid < hix) {
    float m = red[tid][0];
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red[tid][w]);
    out[tid * p.max_blocks] = m;
  }
}

__global__ void indexer_topk_kernel(IndexerDecodeParams p) {
  const int64_t bh = blockIdx.x, b = bh / p.num_index_heads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  float* sc = p.block_scores + bh * p.max_blocks;
  const int64_t qb = min(static_cast<int64_t>(p.positions[b] / kS), p.max_blocks - 1);
  if (tid == 0) {
    for (int64_t i = 0; i < p.local_blocks; ++i) sc[qb - i > 0 ? qb - i : 0] = INFINITY;
    for (int64_t i = 0; i < min(p.init_blocks, qb + 1); ++i) sc[i] = INFINITY;
  }
  __syncthreads();
  int32_t* out = p.selected + bh * p.top_k;
  const int64_t k = min(p.top_k, qb + 1);
  const int64_t n = qb + 1;  // candidate blocks 0 .. qb
  if (n <= kRankMax) {
    // Up to kRankMax candidates: each block's rank in (score descending, id ascending) order by
    // counting the blocks that beat it (n^2 / blockDim comparisons from shared memory, one pass,
    // no barrier per slot). Rank r < k goes to slot r; the ranks are a permutation of 0 .. n-1,
    // so slots 0 .. k-1 are each written once. A -inf (missing page) or NaN score never wins:
    // its slot gets -1, as in the selection loop below.
    __shared__ float s_sc[kRankMax];
    for (int64_t i = tid; i < n; i += blockDim.x) {
      const float v = sc[i];
      s_sc[i] = v == v ? v : -INFINITY;
    }
    __syncthreads();
    for (int64_t i = tid; i < n; i += blockDim.x) {
      const float v = s_sc[i];
      int64_t rank = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float u = s_sc[j];
        rank += (u > v) || (u == v && j < i);
      }
      if (rank < k) out[rank] = v == -INFINITY ? -1 : static_cast<int32_t>(i);
    }
    for (int64_t slot = k + tid; slot < p.top_k; slot += blockDim.x) out[slot] = -1;
    return;
  }
  __shared__ float s_best[32];
  __shared__ int s_id[32];
  for (int64_t slot = 0; slot < p.top_k; ++slot) {
    if (slot >= k) {
      if (tid == 0) out[slot] = -1;
      continue;
    }
    float best = -INFINITY;
    int best_b = 0x7fffffff;
    for (int bb = tid; bb <= qb; bb += blockDim.x) {
      const float v = sc[bb];
      if (v > best || (v == best && bb < best_b)) best = v, best_b = bb;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_b, o);
      if (ob > best || (ob == best && oi < best_b)) best = ob, best_b = oi;
    }
    if (lane == 0) s_best[warp] = best, s_id[warp] = best_b;
    __syncthreads();
    if (tid == 0) {
      for (int w = 1; w < nw; ++w)
        if (s_best[w] > best || (s_best[w] == best && s_id[w] < best_b))
          best = s_best[w], best_b = s_id[w];
      const bool valid = best_b != 0x7fffffff && best != -INFINITY;
      out[slot] = valid ? best_b : -1;
      if (valid) sc[best_b] = __int_as_float(0x7fc00000);  // NaN: never wins again
    }
    __syncthreads();
  }
}

}  // namespace

Status launch_indexer_decode(const IndexerDecodeParams& p, CUstream_st* stream) {
  if (p.batch == 0) return Status::ok();
  if (p.cache.index_head_dim != kDix || p.cache.page_size != kS || p.num_index_heads <= 0 ||
      p.num_index_heads > kMaxHix || p.cache.idx_k == nullptr || p.max_blocks <= 0)
    return invalid_argument("[cuda.indexer_decode] needs Dix = 128, page 128, 1..8 index heads "
                            "and an index-key cache");
  if (!p.scores_ready) {
    dim3 grid(static_cast<unsigned>(p.max_blocks), static_cast<unsigned>(p.batch));
    indexer_score_kernel<<<grid, kThreads, 0, stream>>>(p);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(indexer_score_kernel);
  }
  indexer_topk_kernel<<<static_cast<unsigned>(p.batch * p.num_index_heads), 256, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(indexer_topk_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

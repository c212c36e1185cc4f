// Lightning-indexer block selection (float32 correctness path), same contract as the CPU:
// block scores = max over the block's keys (<= the query position) of <iq, idx_k>, forced local
// and init blocks +inf, the top min(top_k, b_q + 1) blocks in descending score order (ties to the
// lower block id), right-padded with -1.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;

// One block per (token, index head). Warps take blocks b = warp, warp + 8, ...; a warp computes
// one key's dot product at a time (lanes over Dix) and keeps the running block max.
__global__ void indexer_topk_kernel(IndexerTopkParams p, float* scores) {
  const KvLayerView& c = p.cache;
  const int64_t th = blockIdx.x;
  const int64_t t = th / p.num_index_heads;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t dix = c.index_head_dim, bs = c.page_size;
  const int64_t pos = p.positions[t];
  // Blocks past the block table cannot hold keys; the contract says the table covers pos.
  const int64_t qb = min(pos / bs, p.num_blocks - 1);
  const float* q = p.iq + th * dix;
  float* sc = scores + th * p.num_blocks;
  for (int64_t b = warp; b <= qb; b += nw) {
    float best = -INFINITY;
    const int64_t page = b < p.num_blocks ? p.block_table[b] : -1;
    if (page >= 0 && page < c.num_pages) {
      const int64_t last = min(pos, (b + 1) * bs - 1);
      for (int64_t j = b * bs; j <= last; ++j) {
        const int64_t r = j % bs;
        float acc = 0.0f;
        if (c.dtype == KvCacheDtype::kFloat32) {
          const float* k = c.idx_k + (page * bs + r) * dix;
          for (int64_t i = lane; i < dix; i += 32) acc = fmaf(q[i], k[i], acc);
        } else {  // dequantised element by element: the CPU's values exactly
          for (int64_t i = lane; i < dix; i += 32)
            acc = fmaf(q[i], kv_load_element(c.dtype, c.iq, page, bs, 1, 0, dix, r, i), acc);
        }
        best = fmaxf(best, warp_sum(acc));
      }
    }
    if (lane == 0) sc[b] = best;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < p.local_blocks; ++i) sc[qb - i > 0 ? qb - i : 0] = INFINITY;
    for (int64_t b = 0; b < min(p.init_blocks, qb + 1); ++b) sc[b] = INFINITY;
  }
  __syncthreads();
  const int64_t k = min(p.top_k, qb + 1);
  __shared__ float s_best[32];
  __shared__ int64_t s_id[32];
  int32_t* out = p.selected + th * p.top_k;
  for (int64_t slot = 0; slot < p.top_k; ++slot) {
    if (slot >= k) {
      if (threadIdx.x == 0) out[slot] = -1;
      continue;
    }
    float best = -INFINITY;
    int64_t best_b = INT64_MAX;
    for (int64_t b = threadIdx.x; b <= qb; b += blockDim.x) {
      const float v = sc[b];  // taken blocks hold NaN and never win
      if (v > best || (v == best && b < best_b)) best = v, best_b = b;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oi = __shfl_xor_sync(0xffffffffu, best_b, o);
      if (ob > best || (ob == best && oi < best_b)) best = ob, best_b = oi;
    }
    if (lane == 0) s_best[warp] = best, s_id[warp] = best_b;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < nw; ++w)
        if (s_best[w] > best || (s_best[w] == best && s_id[w] < best_b))
          best = s_best[w], best_b = s_id[w];
      const bool valid = best_b != INT64_MAX && best != -INFINITY;
      out[slot] = valid ? static_cast<int32_t>(best_b) : -1;
      if (valid) sc[best_b] = __int_as_float(0x7fc00000);
    }
    __syncthreads();
  }
}

}  // namespace

Status launch_indexer_topk(const IndexerTopkParams& p, float* block_scores, cudaStream_t s) {
  if (p.t == 0) return Status::ok();
  if (p.cache.dtype == KvCacheDtype::kFloat32 ? p.cache.idx_k == nullptr
                                               : p.cache.iq.codes == nullptr)
    return invalid_argument("[cuda.indexer_topk] layer has no index-key cache");
  indexer_topk_kernel<<<static_cast<unsigned>(p.t * p.num_index_heads), kThreads, 0, s>>>(
      p, block_scores);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(indexer_topk_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

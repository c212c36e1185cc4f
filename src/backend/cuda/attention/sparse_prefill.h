// Attention for a prefill chunk of one sequence at the real shapes (bf16 cache and activations,
// float32 math): the lightning indexer for T query tokens against the paged index-key cache
// (block max-pool, forced init/local blocks, causal, top-k per KV group), then block-sparse paged
// attention of the chunk over the selected blocks (causal within the chunk: a token sees keys at
// positions <= its own). Dense causal attention (layers without sparse attention) selects every
// block 0..b_q of each token.
//
// The chunk's K, V and index keys must already be in the cache (launch_kv_write_bf16). Each
// token is one row of the decode kernels (sparse_decode.h) with the sequence's block table shared
// by every row (block_table_stride 0), so one K/V page load serves the 16 query heads of a KV
// group, and the semantics are exactly the decode path's. Tokens are processed in sub-chunks so
// that the split-softmax scratch stays under `scratch_bytes`.
//
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

class CachingAllocator;
class PrefillGemm;

// The attention kernel of a prefill chunk.
enum class PrefillAttentionKernel : int {
  // The decode kernels per token (split over blocks + combine; CUDA cores). The tests' second
  // implementation.
  kPerTokenDecode = 0,
  // Tensor cores (mma.sync bf16): one warp per (token, KV group), online softmax over the blocks,
  // P rounded to bf16 for P·V (sparse_prefill_mma.cu); K / V fragments straight from the paged
  // cache, so every token re-reads the blocks it shares with its neighbours.
  kTensorCore = 1,
  // Tensor cores over shared-memory tiles (sparse_prefill_tiled.cu): one CTA per (8 consecutive
  // tokens, KV group) walks the union of the blocks those tokens selected, each 64-key half of a
  // block loaded once (cp.async, double-buffered) for the 8 x 16 query rows; tokens that did not
  // select a block skip it. Same numerics contract as kTensorCore (P rounded to bf16 for P·V and
  // for l); blocks in ascending order. Production (the model's call site).
  kTiled = 2,
};

// The indexer of a prefill chunk (its block scores).
enum class PrefillIndexerKernel : int {
  kPerTokenDecode = 0,  // the decode indexer kernel per token
  // One cuBLASLt GEMM per sub-chunk for the token scores (needs `gemm`) + max-pool
  // (prefill_indexer.cu). Reads the positions on the host once (one synchronisation) to bound
  // the GEMM by the chunk's causal limit.
  kGemmScores = 1,
  // Block scores straight from the tensor cores (prefill_indexer_fused.cu): a CTA takes 128
  // (token, index head) rows and walks index-key blocks through shared memory; the per-row max
  // over a block's causal keys is taken in registers, so only [T, Hix, num_blocks] block scores
  // are written (no token scores, no gathered key copy, no host synchronisation). Production
  // (the model's call site).
  kFusedMaxPool = 2,
};

struct PrefillAttentionParams {
  const uint16_t* q = nullptr;           // [T, H, D] bf16 (normed + roped)
  const uint16_t* iq = nullptr;          // [T, Hix, Dix] bf16 (normed + roped); unused if dense
  KvCacheView cache;
  const int32_t* positions = nullptr;    // [T] (device), the chunk's positions
  const int32_t* block_table = nullptr;  // [num_blocks] (device) the sequence's pages
  int64_t t = 0, num_heads = 0, num_index_heads = 0, num_blocks = 0;
  int64_t top_k = 16, local_blocks = 1, init_blocks = 0;
  bool dense = false;                    // full causal attention (no indexer)
  float scale = 0.0f;                    // 1/sqrt(D)
  int32_t* selected = nullptr;           // [T, Hix, top_k] out (sparse only); nullptr: internal
  uint16_t* out = nullptr;               // [T, H, D] bf16
  PrefillAttentionKernel kernel = PrefillAttentionKernel::kPerTokenDecode;
  PrefillIndexerKernel indexer = PrefillIndexerKernel::kPerTokenDecode;
  PrefillGemm* gemm = nullptr;
  // kTiled, sparse: an 8-token tile whose union of selected blocks exceeds this many blocks
  // reads its blocks per warp from the cache instead of staging them (same results); -1: 4·top_k.
  int64_t tiled_union_limit = -1;
};

// Requires D == Dix == 128, S == 128, H / Hkv == 16, Hix == Hkv (sparse) (checked by the decode
// kernels). `alloc` provides the scratch (freed before return, stream-ordered).
Status launch_prefill_attention(const PrefillAttentionParams& p, CachingAllocator* alloc,
                                CUstream_st* stream, int64_t scratch_bytes = int64_t{512} << 20);

// kTensorCore on a chunk whose selection is ready: `selected` [T, Hkv, top_k] (nullptr: dense,
// every block 0..b_q). p.selected, p.iq and p.dense are not read.
Status launch_prefill_attention_mma(const PrefillAttentionParams& p, const int32_t* selected,
                                    int64_t top_k, CUstream_st* stream);

// kTiled on a chunk whose selection is ready (as launch_prefill_attention_mma). Additionally
// requires top_k <= 128 (sparse) and the cache to hold every position up to the chunk's last one
// (rows past a tile's last position are never read; rows between a token's position and its
// tile's last one are read and weighted 0, so they must be finite).
Status launch_prefill_attention_tiled(const PrefillAttentionParams& p, const int32_t* selected,
                                      int64_t top_k, CUstream_st* stream);

// kFusedMaxPool: block_scores[r, blk] for the rows r = t·Hix + h of iq [t, Hix, Dix], with the
// semantics of launch_index_maxpool over blocks 0..nb-1 (max of <iq[r], idx_k[j]> over the keys
// j <= positions[t] of block blk; -inf past b_q(t) or for a missing page). Needs Dix = 128,
// page 128, iq and cache.idx_k 16-byte aligned.
Status launch_index_block_scores_fused(const uint16_t* iq, const KvCacheView& cache,
                                       const int32_t* positions, const int32_t* block_table,
                                       int64_t t, int64_t hix, int64_t nb, float* block_scores,
                                       CUstream_st* stream);

// prefill_indexer.cu: out[blk] = the 128 x 128 index keys of page block_table[blk] (zeros for
// a missing page), and block scores from token scores (see that file).
Status launch_gather_index_keys(const KvCacheView& cache, const int32_t* block_table,
                                int64_t num_blocks, uint16_t* out, CUstream_st* stream);
Status launch_index_maxpool(const float* scores, int64_t ld, int64_t blocks_computed,
                            const int32_t* positions, const int32_t* block_table,
                            int64_t num_pages, int64_t t, int64_t hix, int64_t nb,
                            float* block_scores, CUstream_st* stream);

// selected[t, g, i] = b_q(t) - i for i <= b_q(t), else -1 (every block of a dense causal row).
Status launch_dense_selection(const int32_t* positions, int64_t t, int64_t groups,
                              int64_t page_size, int64_t top_k, int32_t* selected,
                              CUstream_st* stream);

}  // namespace m3::cuda

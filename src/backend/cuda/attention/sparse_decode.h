// Block-sparse paged attention and the lightning indexer for decode at the real MiniMax-M3 shapes
// (bf16 activations, float32 arithmetic). Parameter structs in the FlashMLA style: the
// shape of every pointer in a comment, -1 as the "empty" sentinel in block tables and
// selections. This header includes no CUDA header.
//
// Cache layout of one layer (page = sparse block = 128 tokens; page ids are the scheduler's):
//   k, v   [P, S, Hkv, D] (after k_norm + RoPE)   idx_k [P, S, Dix] (after norm + RoPE)
// in bf16, or quantised (--kv-cache-dtype fp8_e4m3 / fp4_e2m1: quant/kv_quant.h's codes with a
// float32 scale per page and head, and for fp4 an E4M3 scale per 16 elements of a row).
// The kernels read a quantised cache directly: each 8-element piece is dequantised on load into
// the bf16 shared-memory tiles the bf16 cache fills (kv/kv_load.cuh), exactly, so their results
// are, bit for bit, those on a bf16 cache holding the dequantised values.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "quant/kv_quant.h"

struct CUstream_st;

namespace m3::cuda {

// The bf16 pointers and the shape come first, so that {k, v, idx_k, P, S, Hkv, D, Dix} still
// initialises a bf16 view.
struct KvCacheView {
  // bf16 (null when quantised):
  uint16_t* k = nullptr;      // [P, S, Hkv, D] bf16
  uint16_t* v = nullptr;      // [P, S, Hkv, D] bf16
  uint16_t* idx_k = nullptr;  // [P, S, Dix] bf16; nullptr on layers without an indexer
  int64_t num_pages = 0, page_size = 0, num_kv_heads = 0, head_dim = 0, index_head_dim = 0;
  KvCacheDtype dtype = KvCacheDtype::kBF16;  // kBF16, kFp8E4M3 or kFp4E2M1
  // fp8_e4m3 / fp4_e2m1 (quant/kv_quant.h's KvQuantStore: codes [P, S, heads, row bytes], page
  // scales [P, heads], fp4 block scales [P, S, heads, D / 16]); the index keys have one head and
  // iq.codes is null on layers without an indexer.
  KvQuantStore kq = {}, vq = {}, iq = {};

  M3_HOST_DEVICE bool quantised() const { return dtype != KvCacheDtype::kBF16; }
  // Whether the layer caches index keys, in either storage.
  M3_HOST_DEVICE bool has_index_keys() const {
    return quantised() ? iq.codes != nullptr : idx_k != nullptr;
  }
};

// A bf16 view of [P, S, Hkv, D] K and V and [P, S, Dix] index keys (nullptr: none).
inline KvCacheView bf16_kv_view(uint16_t* k, uint16_t* v, uint16_t* idx_k, int64_t num_pages,
                                int64_t page_size, int64_t num_kv_heads, int64_t head_dim,
                                int64_t index_head_dim) {
  KvCacheView c;
  c.k = k;
  c.v = v;
  c.idx_k = idx_k;
  c.num_pages = num_pages;
  c.page_size = page_size;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.index_head_dim = index_head_dim;
  return c;
}

// One query token per sequence (decode). Sequence b's query sits at positions[b]; its block
// table row maps logical block j to a page (-1 past the sequence's end).
struct IndexerDecodeParams {
  const uint16_t* iq = nullptr;          // [B, Hix, Dix] bf16 index queries (normed + roped)
  KvCacheView cache;                     // the index keys (idx_k or iq) hold every position
                                         // <= positions[b]
  const int32_t* positions = nullptr;    // [B]
  const int32_t* block_tables = nullptr; // [B, max_blocks] page ids, -1 = none
  int64_t batch = 0, num_index_heads = 0, max_blocks = 0;
  int64_t top_k = 16, local_blocks = 1, init_blocks = 0;
  int64_t block_table_stride = -1;       // row stride of block_tables; -1 = max_blocks, 0 = one
                                         // table shared by every row (prefill: B = tokens)
  bool scores_ready = false;             // block_scores already holds the max-pooled scores
                                         // (-inf past b_q and for missing pages): top-k only
  bool dependent_launch = true;          // the top-k as a programmatic dependent of the scoring
                                         // (false: a plain launch; same results)
  bool pdl = false;                      // the scoring itself as a programmatic dependent of the
                                         // previous kernel on the stream (it reads positions and
                                         // block tables before it waits: inputs no kernel of the
                                         // step writes); same results
  bool keys_before_wait = false;         // with pdl: the index keys of positions < positions[b]
                                         // loaded before the wait (the caller guarantees they
                                         // were written before the previous kernel started, as
                                         // in decode, one row per sequence); the position's own
                                         // row after it. Same results. Ignored for a quantised
                                         // cache: writing the position's row may raise the page
                                         // scale and re-encode the page's earlier rows
  bool skip_topk = false;                // the scoring only: the clustered split attention selects
                                         // from block_scores (SparseDecodeParams::block_scores)
  bool spread_rank = true;               // the top-k's rank count of a row over several CTAs
                                         // at small batches (indexer_decode.cu); same results
  float* block_scores = nullptr;         // [B, Hix, max_blocks] scratch
  int32_t* selected = nullptr;           // [B, Hix, top_k] out: block ids by descending score
                                         // (ties: lower id), -1 = empty slot
};

// Requires Dix == 128 and S == 128 (the real shapes), iq and a bf16 cache's idx_k 16-byte
// aligned, a quantised cache's index-key codes 8-byte aligned with their scales (checked).
Status launch_indexer_decode(const IndexerDecodeParams& p, CUstream_st* stream);

struct SparseDecodeParams {
  const uint16_t* q = nullptr;           // [B, H, D] bf16 queries (normed + roped)
  KvCacheView cache;
  const int32_t* positions = nullptr;    // [B]
  const int32_t* block_tables = nullptr; // [B, max_blocks]
  const int32_t* selected = nullptr;     // [B, Hkv, top_k] block ids, -1 = empty (from the indexer);
                                         // nullptr: every block (slot j = block j), allowed when
                                         // max_blocks <= top_k, where the indexer would select
                                         // every block of each sequence anyway
  int64_t batch = 0, num_heads = 0, max_blocks = 0, top_k = 16;
  int64_t block_table_stride = -1;       // as in IndexerDecodeParams
  // Instead of `selected`: the indexer's block scores [B, Hkv, max_blocks] (one index head per KV
  // group; launch_indexer_decode with skip_topk), from which the clustered split kernel selects
  // the blocks itself, exactly as the indexer's top-k would (the same local / init blocks
  // forced, the same order and ties). Only where sparse_decode_clusters(p) and max_blocks <=
  // 1024 (checked); `selected` is then not read.
  const float* block_scores = nullptr;
  int64_t local_blocks = 1, init_blocks = 0;
  float scale = 0.0f;                    // softmax scale (1/sqrt(D))
  // Key splits (the FMA kernel only, so not with mma unless forced): a selected block's 128
  // keys may be shared by up to max_key_splits CTAs (1, 2 or 4; chosen by the launcher for small
  // batches, where top_k · Hkv · B CTAs would leave the GPU idle). The partial buffers hold
  // top_k · max_key_splits states per head.
  int64_t max_key_splits = 1;
  bool force_key_splits = false;         // tests: use exactly max_key_splits (1, 2 or 4)
  // One split per block on the tensor cores (sparse_decode_mma.cu: P rounded to bf16, both for
  // P·V and for the sums, so the output is the weighted mean of V with weights perturbed by at
  // most 2^-8 relatively) instead of the float32-FMA kernel, at every batch; forced key splits
  // keep the FMA kernel.
  bool mma = false;
  // With mma and top_k == 16, where the split grid has at most one CTA per SM (batch 1-2 on
  // M3.1-Flash): the 16 split CTAs of a (KV group, sequence) as one thread-block cluster that
  // merges the partial states itself (sparse_decode_mma.cu; no combine launch, the partial
  // buffers unused): the same bits. H200, 8-layer steps, same call:
  // batch 1 -1.6 / -0.9 / -0.7 % at 1K / 4K / 32K, batch 8 +2.1 % (512 CTAs of 78 KB: two per
  // SM instead of three), hence the limit. Where the GPU cannot schedule the cluster, the two
  // launches. force_cluster_combine (tests): at any grid size.
  bool cluster_combine = false;
  bool force_cluster_combine = false;
  bool dependent_launch = true;          // the combine as a programmatic dependent of the split
                                         // kernel (false: a plain launch; same results)
  bool pdl = false;                      // the split kernel as a programmatic dependent of the
                                         // previous kernel on the stream (positions read before
                                         // the wait, as in IndexerDecodeParams); same results
  // The clustered split: its dependents (the o_proj GEMV, which requests its first weight stages
  // before its own wait) may launch at the split's start instead of after its wait. The model
  // sets it where the split selects from block_scores, so that those requests stream while the
  // indexer's scoring computes (HBM idle) rather than beside the split's selection and K / V
  // loads. Same results.
  bool dependents_at_start = false;
  float* o_partial = nullptr;            // [B, H, top_k · max_key_splits, D] scratch
  float* ml_partial = nullptr;           // [B, H, top_k · max_key_splits, 2] (max, sum of exp)
  uint16_t* out = nullptr;               // [B, H, D] bf16 output
};

// Requires D == 128, S == 128, H / Hkv == 16, and q, cache.k, cache.v, o_partial 16-byte aligned
// (a quantised cache: K and V codes 8-byte aligned, with their scales), ml_partial 8-byte
// aligned, max_blocks <= top_k without a selection (checked). Duplicate selected
// ids count once; ids past the query's block are skipped; a row with no allowed key outputs
// zeros. The identity selection (selected == nullptr) gives bit for bit the output of the
// selection 0, 1, ..., top_k - 1.
Status launch_sparse_decode(const SparseDecodeParams& p, CUstream_st* stream);

// Whether launch_sparse_decode(p) runs the clustered split kernel (cluster_combine or
// force_cluster_combine, mma, top_k == 16, the grid within its limit, the GPU able to schedule
// the cluster): where block_scores may be given.
bool sparse_decode_clusters(const SparseDecodeParams& p);

}  // namespace m3::cuda

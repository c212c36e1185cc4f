// Dense (full causal) paged decode attention for the layers without sparse attention (MiniMax-M3's
// full_attention layers), split over the context (flash-decoding) with bounded scratch: one CTA per
// (split, KV group, sequence) walks a contiguous run of the sequence's blocks with an online
// softmax (running maximum and sum per head, the P·V accumulator rescaled per block) and leaves
// one partial state per head; a combine launch merges the splits (decode_combine.cuh, the merge of
// sparse_decode). The number of splits does not grow with the context, so the scratch is the same
// at 1K and 1M tokens, and it depends only on (batch, KV heads, max_blocks), so a CUDA graph
// captured for a (batch, table width) replays the same launches.
//
// Same cache layout and numerics as sparse_decode.h's float32-FMA split kernel (scores and P·V as
// fmaf sequences, d then key ascending), and like it reads a bf16 or a quantised cache (fp8_e4m3 /
// fp4_e2m1 dequantised exactly on load into the same bf16 tiles: the output is, bit for bit, the
// one on a bf16 cache of the dequantised values). This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct DenseDecodeParams {
  const uint16_t* q = nullptr;            // [B, H, D] bf16 queries (normed + roped)
  KvCacheView cache;                      // K and V hold every position <= positions[b] (k, v or
                                          // kq, vq); the index keys unused
  const int32_t* positions = nullptr;     // [B]
  const int32_t* block_tables = nullptr;  // [B, max_blocks] page ids, -1 = none
  int64_t batch = 0, num_heads = 0, max_blocks = 0;
  // Capacity of the partial buffers in states per head; the launcher uses
  // dense_decode_splits(...) <= max_splits of them.
  int64_t max_splits = 1;
  float scale = 0.0f;                     // softmax scale (1/sqrt(D))
  bool pdl = false;                       // the split kernel as a programmatic dependent of the
                                          // previous kernel (positions read before the wait)
  float* o_partial = nullptr;             // [B, H, max_splits, D] scratch (16-byte aligned)
  float* ml_partial = nullptr;            // [B, H, max_splits, 2] (max, sum of exp), 8-byte aligned
  uint16_t* out = nullptr;                // [B, H, D] bf16 output
};

// Splits per (sequence, KV group): enough CTAs for about two waves of the GPU, at most one per
// block of the table and at most max_splits. Depends only on its arguments and the device.
int64_t dense_decode_splits(int64_t batch, int64_t num_kv_heads, int64_t max_blocks,
                            int64_t max_splits);

// Requires D == 128, S == 128, H / Hkv == 16, max_splits >= 1, and q, cache.k, cache.v,
// o_partial 16-byte aligned (a quantised cache: K and V codes 8-byte aligned, with their scales),
// ml_partial 8-byte aligned (checked). Row b attends the keys of positions 0 .. positions[b]
// through its block table (a -1 page contributes nothing; a row with no key outputs zeros: the
// padding rows of a decode batch).
Status launch_dense_decode(const DenseDecodeParams& p, CUstream_st* stream);

}  // namespace m3::cuda

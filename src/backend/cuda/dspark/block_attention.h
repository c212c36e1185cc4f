// The DSpark draft block's attention on the GPU (m3-architecture.md §5.2 step 4; docs/dspark.md):
// B query slots at positions p..p+B-1 attend over
//  * the context K/V of the cached positions j < p inside the slot's sliding window
//    (j >= p + k - W + 1 for slot k), read from a paged cache through one block table, and
//  * the B block K/V, bidirectionally (every slot sees every slot).
// GQA: query head n reads KV head n / (H / Hkv). Softmax in float32 with max subtraction.
//
// Two storage variants with one kernel body:
//  * float32 (the CudaBackend's float32 draft): q, block K/V, the cache (KvLayerView layout
//    [P, S, Hkv, D]) and the output in float32;
//  * bf16 (the real-shape draft): q, block K and the cache in bf16 (KvCacheView), block V as
//    the float32 projection output rounded to bf16 when read (what a cache write would store), the
//    output bf16 (the o_proj GEMV's input).
//
// Split over the keys (flash-decoding): one CTA per (sequence, KV head, split of the keys) takes
// all B x (H / Hkv) query rows of that KV head (up to 128 per CTA), so each K/V element is read
// once from memory, not once per query head and slot. Keys go through shared memory in tiles of
// 64 (float32), scores and value sums on the CUDA cores with an online softmax per row; each
// split's unnormalised sums go to a workspace that a second kernel merges in split order. The
// splits depend on the shapes and the window only, so a sequence's output is the same alone or
// batched. head_dim is 16, 32, 64, 128 or 256; the cache must be 16-byte aligned and have fewer
// than 2^31 rows (pages · page_size). A context position whose page is -1 gets no weight (the
// draft never asks for one: its cache holds the window). This header includes no CUDA header.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"  // M3_HOST_DEVICE
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// One sequence of a batched launch (device memory, an array of num_seqs).
struct DSparkBlockAttentionSeq {
  const uint16_t* cache_k_bf16 = nullptr;  // [P, S, Hkv, D]
  const uint16_t* cache_v_bf16 = nullptr;
  const int32_t* block_table = nullptr;    // [num_blocks]
  int64_t num_blocks = 0, anchor_pos = 0;
};

struct DSparkBlockAttentionParams {
  // Float32 variant.
  const float* q = nullptr;        // [B, H, D]
  const float* block_k = nullptr;  // [B, Hkv, D]
  const float* block_v = nullptr;  // [B, Hkv, D] (row stride ld_block_v)
  const float* cache_k = nullptr;  // [P, S, Hkv, D]
  const float* cache_v = nullptr;
  float* out = nullptr;            // [B, H, D]
  // bf16 variant (used when q_bf16 is set).
  const uint16_t* q_bf16 = nullptr;        // [B, H, D]
  const uint16_t* block_k_bf16 = nullptr;  // [B, Hkv, D]
  const uint16_t* cache_k_bf16 = nullptr;  // [P, S, Hkv, D]
  const uint16_t* cache_v_bf16 = nullptr;
  uint16_t* out_bf16 = nullptr;            // [B, H, D]
  // block_v above (float32) is read by both variants; floats between slots' V rows (0: Hkv·D).
  int64_t ld_block_v = 0;
  // Both.
  const int32_t* block_table = nullptr;  // device [num_blocks]: logical block -> page, -1 none
  int64_t num_blocks = 0, num_pages = 0, page_size = 128;
  int64_t anchor_pos = 0;  // p: the context holds [0, p)
  int64_t block = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, window = 0;
  float scale = 1.0f;
  // Batched, bf16 only: num_seqs sequences in one launch (grid z), sequence z's B slots at rows
  // z·B .. z·B + B - 1 of q, block K / V and out, its cache, block table, block count and anchor
  // position from seqs[z] (the fields above of those are then unused).
  const DSparkBlockAttentionSeq* seqs = nullptr;
  int64_t num_seqs = 0;
  // Device scratch of dspark_block_attention_workspace_floats(*this) floats.
  float* workspace = nullptr;
};

constexpr int kDSparkAttentionTileKeys = 64;     // keys per shared-memory tile
// The largest window: the kernel keeps positions in int32 (a window's first position, the
// block's last, anchors up to 2^30).
constexpr int64_t kDSparkAttentionMaxWindow = int64_t{1} << 28;
constexpr int kDSparkAttentionTargetCtas = 256;  // CTAs of one sequence at a full window

// Query rows (slot x head of one KV group) per CTA: 128, or 64 at head_dim 256 (shared memory).
M3_HOST_DEVICE constexpr int dspark_attention_rows_per_cta(int64_t head_dim) {
  return head_dim > 128 ? 64 : 128;
}

// How a launch divides its work: a function of the shapes and the window only (not of the
// anchor positions or the number of sequences), so a sequence's output does not depend on what
// it is batched with.
struct DSparkAttentionSplits {
  int64_t rows = 0;            // B x (H / Hkv) query rows per KV head
  int64_t chunks = 0;          // CTAs over those rows
  int64_t keys_per_split = 0;  // a multiple of the tile
  int64_t splits = 0;          // enough for the largest key count, window - 1 + B
  int64_t partial_floats = 0;  // one split's partial sums: [rows_per_cta][D + 2]
};

// About kDSparkAttentionTargetCtas CTAs for one sequence at a full window: at the released
// draft's shape (4 KV heads, window 4096, head_dim 128: one CTA per SM by shared memory) 33
// splits of 2 tiles, 132 CTAs, one wave on an H100 or H200. Shapes must be positive.
inline DSparkAttentionSplits dspark_attention_splits(const DSparkBlockAttentionParams& p) {
  DSparkAttentionSplits l;
  l.rows = p.block * (p.num_heads / p.num_kv_heads);
  const int64_t per_cta = dspark_attention_rows_per_cta(p.head_dim);
  l.chunks = (l.rows + per_cta - 1) / per_cta;
  const int64_t tile = kDSparkAttentionTileKeys;
  const int64_t tiles = (p.window - 1 + p.block + tile - 1) / tile;
  const int64_t tiles_per_split = std::max<int64_t>(
      1, (tiles * p.num_kv_heads * l.chunks + kDSparkAttentionTargetCtas - 1) / kDSparkAttentionTargetCtas);
  l.keys_per_split = tiles_per_split * tile;
  l.splits = (tiles + tiles_per_split - 1) / tiles_per_split;
  l.partial_floats = per_cta * (p.head_dim + 2);
  return l;
}

// The workspace a launch with these shapes, window and number of sequences needs (the splits'
// partial sums); 0 for shapes the launch refuses.
inline int64_t dspark_block_attention_workspace_floats(const DSparkBlockAttentionParams& p) {
  if (p.num_kv_heads <= 0 || p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 ||
      p.block <= 0 || p.window < p.block || p.head_dim <= 0)
    return 0;
  const DSparkAttentionSplits l = dspark_attention_splits(p);
  const int64_t seqs = p.seqs != nullptr ? std::max<int64_t>(p.num_seqs, 1) : 1;
  return seqs * p.num_kv_heads * l.chunks * l.splits * l.partial_floats;
}

// Checks the shapes (invalid_argument naming [cuda.dspark.block_attention]) and launches.
Status launch_dspark_block_attention(const DSparkBlockAttentionParams& p, CUstream_st* stream);

}  // namespace m3::cuda

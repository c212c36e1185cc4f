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
//  * bf16 (the real-shape draft): q, block K and the cache in bf16 (KvCacheBf16View), block V as
//    the float32 projection output rounded to bf16 when read (what a cache write would store), the
//    output bf16 (the o_proj GEMV's input).
//
// One CTA per (slot, query head): the scores of its keys in shared memory ((W - 1 + B) floats at
// most) with the cache rows of its context keys (looked up once per key, not per thread), then
// the weighted sum of the values with one warp per key as for the scores (lanes over the
// dimensions), the 8 warps' partial sums added in a fixed order. The
// cache must have fewer than 2^31 rows (pages · page_size). head_dim must divide 256 (32, 64,
// 128, 256). A context position whose page is -1 gets no weight (the draft never asks for one:
// its cache holds the window). This header includes no CUDA header.
#pragma once

#include <cstdint>

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
  // position from seqs[z] (the fields above of those are then unused). Shared memory is sized
  // for a full window.
  const DSparkBlockAttentionSeq* seqs = nullptr;
  int64_t num_seqs = 0;
};

// Shared memory of one CTA (the scores of its keys and the partial sums): what
// launch_dspark_block_attention asks for, so callers can check it against the device's limit.
int64_t dspark_block_attention_smem_bytes(const DSparkBlockAttentionParams& p);

// Checks the shapes (invalid_argument naming [cuda.dspark.block_attention]) and launches.
Status launch_dspark_block_attention(const DSparkBlockAttentionParams& p, CUstream_st* stream);

}  // namespace m3::cuda

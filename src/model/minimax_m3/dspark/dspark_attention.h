// The draft block's attention (§5.2 step 4): B query slots at positions p..p+B-1 over
//  * the context K/V of the cached positions j < p inside the slot's sliding window,
//    j >= p + k - W + 1 for slot k (the window [q_pos - W + 1, q_pos]), and
//  * the B block K/V, bidirectionally (every slot sees every slot: no causal mask in the block).
// GQA: query head n uses KV head n / (H / Hkv). Softmax in float32 with max subtraction, keys in
// ascending position order (context, then block slots), dot products in cpu::dot's order: the
// same arithmetic as the CPU backend's paged_attention.
//
// block_attention is float32 host code, so the cache and the tensors must be host memory (the CPU
// backend). It is not a Backend op (the backend's paged attention is causal and windowless): a
// draft on another backend is given a BlockAttentionFn that runs the same contract there on the
// backend's stream (the CUDA one: model/minimax_m3/cuda/cuda_dspark_f32.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace m3::minimax_m3::dspark {

struct BlockAttentionParams {
  const float* q = nullptr;              // [B, H, D] (normed + roped)
  const float* block_k = nullptr;        // [B, Hkv, D] (normed + roped)
  const float* block_v = nullptr;        // [B, Hkv, D]
  KvLayerView cache;                     // context K/V of positions < anchor_pos
  const int32_t* block_table = nullptr;  // logical block -> page (-1: not held)
  int64_t num_blocks = 0;
  int64_t anchor_pos = 0;  // p: the context holds [0, p)
  int64_t block = 0, num_heads = 0, window = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [B, H, D]
};

void block_attention(const BlockAttentionParams& p);

// The block attention of a draft on a non-CPU backend: the same contract, pointers in the
// backend's memory (block_table included), enqueued on the backend's stream.
using BlockAttentionFn = std::function<Status(const BlockAttentionParams&)>;

}  // namespace m3::minimax_m3::dspark

// Host-side plan of the real-shape CUDA DSpark draft (cuda_dspark_draft.h): which draft configs
// its kernels take, its shapes, and the bytes it needs on the GPU (weights as stored, the context
// K/V per running sequence, a propose step's and a context append's scratch). Plain C++, built
// and unit-tested without CUDA (tests/model/dspark_cuda_plan_test.cpp).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::minimax_m3 {

struct DSparkCudaPlan {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, vocab = 0;
  int64_t rank = 0, block = 0, window = 0, page_size = 0, feature_width = 0;
  int64_t q_rows = 0, kv_rows = 0, qkv_rows = 0;  // H·D, Hkv·D, H·D + 2·Hkv·D
  // The context cache of one sequence: DSparkContextCache's fixed page count (ceil(W/S) + 3), bf16
  // K and V of every layer.
  int64_t pages_per_sequence = 0;
  int64_t kv_bytes_per_page = 0;
  int64_t kv_bytes_per_sequence = 0;
  // Weights on the GPU in the released formats: the attention and MLP linears MXFP8 (one byte a
  // value and one E8M0 scale per 32), fc, the norms and the Markov tables bf16. The target's
  // embedding table and lm_head are shared, not counted.
  int64_t weight_bytes = 0;
  // A propose step's device scratch (B rows of every activation, the [B, V] float32 logits, the
  // split-K partials of the widest GEMV and the block attention's split partials).
  int64_t propose_scratch_bytes = 0;

  // Device scratch of appending `tokens` context positions in one call (features in float32 and
  // bf16, the fused context c, the K|V projection, the per-token block tables).
  int64_t append_scratch_bytes(int64_t tokens) const;
};

// The plan for `cfg` (resolved against the target) with `page_size`-position context pages, or
// unimplemented naming the field the kernels do not take: the bf16 norms scale by (1 + w) only
// (use_gemma_norm), the fused q/k norm + RoPE kernel needs head_dim 128 and rotary_dim <= 128, the
// block attention's scores of one (slot, head) must fit one SM's shared memory (window), the
// MXFP8 GEMVs need in-dimensions that are multiples of 32 and the bf16 ones of 256.
Result<DSparkCudaPlan> plan_dspark_cuda(const dspark::DSparkConfig& cfg, int64_t page_size = 128);

}  // namespace m3::minimax_m3

// A 3-layer MiniMax-M3 config small enough for the CPU reference but with the real head shapes
// the real-shape CUDA kernels need (head_dim 128, 16 query heads per KV head, index heads of 128,
// 128-token blocks): hidden 1024, 1 dense + 2 MoE layers of 8 experts (top-2), a shared expert.
// Shared by the host tests of src/model/minimax_m3/cuda and cuda_real_model_test.
#pragma once

#include <cstdint>

#include "model/minimax_m3/dummy_weights.h"

namespace m3 {

inline MiniMaxM3Config small_real_shape_config(int64_t vocab_size) {
  MiniMaxM3Config c = minimax_m3::builtin_m3_flash_config(3);
  c.hidden_size = 1024;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 2;
  c.index_n_heads = 2;
  c.vocab_size = vocab_size;
  c.intermediate_size = 1024;
  c.shared_intermediate_size = 1024;
  c.dense_intermediate_size = 2048;
  c.num_local_experts = 8;
  c.num_experts_per_tok = 2;
  c.index_topk_blocks = 3;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.mlp_layer_types = {MlpKind::kDense, MlpKind::kMoe, MlpKind::kMoe};
  return c;
}

}  // namespace m3

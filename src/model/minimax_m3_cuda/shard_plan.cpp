#include "model/minimax_m3_cuda/shard_plan.h"

#include <string>

namespace m3::minimax_m3 {

namespace {

Span part(int64_t total, int64_t world, int64_t rank) {
  const int64_t n = total / world;
  return {rank * n, (rank + 1) * n};
}

Status no_split(const std::string& field, int64_t value, int64_t world, const char* why) {
  return invalid_argument("[model.minimax_m3_cuda.shard] " + field + " = " +
                          std::to_string(value) + " cannot be split over " +
                          std::to_string(world) + " ranks: " + why);
}

}  // namespace

Status check_parallel_layout(const MiniMaxM3Config& c, const ParallelLayout& l) {
  if (l.world < 1 || l.rank < 0 || l.rank >= l.world)
    return invalid_argument("[model.minimax_m3_cuda.shard] rank " + std::to_string(l.rank) +
                            " outside a group of " + std::to_string(l.world));
  const int64_t w = l.world;
  if (c.num_key_value_heads % w != 0)
    return no_split("num_key_value_heads", c.num_key_value_heads, w,
                    "each rank keeps whole KV heads with their 16 query heads");
  if (c.num_attention_heads % w != 0)
    return no_split("num_attention_heads", c.num_attention_heads, w, "not divisible");
  if (c.index_n_heads > 0 && c.index_n_heads % w != 0)
    return no_split("index_n_heads", c.index_n_heads, w, "not divisible");
  // Row-parallel inputs (o_proj's H·D, down's intermediate) are split into whole 32-element
  // MXFP8 blocks (16 for NVFP4; 32 covers both).
  if ((c.num_attention_heads / w) * c.head_dim % 32 != 0)
    return no_split("num_attention_heads x head_dim", c.num_attention_heads * c.head_dim, w,
                    "o_proj's input slice must be whole 32-element blocks");
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) (c.is_moe_layer(i) ? any_moe : any_dense) = true;
  if (any_dense && (c.dense_intermediate_size % w != 0 || (c.dense_intermediate_size / w) % 32 != 0))
    return no_split("dense_intermediate_size", c.dense_intermediate_size, w,
                    "needs whole 32-element blocks per rank");
  if (any_moe) {
    if (c.shared_intermediate_size > 0 &&
        (c.shared_intermediate_size % w != 0 || (c.shared_intermediate_size / w) % 32 != 0))
      return no_split("shared_intermediate_size", c.shared_intermediate_size, w,
                      "needs whole 32-element blocks per rank");
    if (l.expert_parallel) {
      if (c.num_local_experts % w != 0)
        return no_split("num_local_experts", c.num_local_experts, w,
                        "expert parallel keeps whole experts per rank");
    } else if (c.intermediate_size % w != 0 || (c.intermediate_size / w) % 32 != 0) {
      return no_split("intermediate_size", c.intermediate_size, w,
                      "tensor-parallel experts need whole 32-element blocks per rank");
    }
  }
  return Status::ok();
}

RankShard shard_for_rank(const MiniMaxM3Config& c, const ParallelLayout& l) {
  RankShard s;
  s.q_heads = part(c.num_attention_heads, l.world, l.rank);
  s.kv_heads = part(c.num_key_value_heads, l.world, l.rank);
  s.index_heads = part(c.index_n_heads, l.world, l.rank);
  s.dense_inter = part(c.dense_intermediate_size, l.world, l.rank);
  s.shared_inter = part(c.shared_intermediate_size, l.world, l.rank);
  if (l.expert_parallel) {
    s.experts = part(c.num_local_experts, l.world, l.rank);
    s.expert_inter = {0, c.intermediate_size};
  } else {
    s.experts = {0, c.num_local_experts};
    s.expert_inter = part(c.intermediate_size, l.world, l.rank);
  }
  return s;
}

}  // namespace m3::minimax_m3

#include "model/minimax_m3/tensor_parallel.h"

#include <string>

namespace m3::minimax_m3 {

Status check_tensor_parallel(const MiniMaxM3Config& c, int ranks, int ep, int dp) {
  if (ranks < 1) return invalid_argument("--tp " + std::to_string(ranks) + " must be at least 1");
  const std::string tp_flag = "--tp " + std::to_string(ranks);
  const std::string ep_flag = "--ep " + std::to_string(ep);
  const std::string dp_flag = "--dp " + std::to_string(dp);
  if (ep < 1) return invalid_argument(ep_flag + " must be at least 1");
  if (dp < 1) return invalid_argument(dp_flag + " must be at least 1");
  if (ranks % dp != 0)
    return invalid_argument(dp_flag + " must divide " + tp_flag +
                            ": the attention groups are tp / dp consecutive tensor-parallel ranks "
                            "(as in SGLang's --enable-dp-attention)");
  // The heads split over one attention group's ranks.
  const int attn_ranks = ranks / dp;
  const std::string attn_flag = dp > 1 ? tp_flag + " " + dp_flag : tp_flag;
  if (ranks % ep != 0)
    return invalid_argument(ep_flag + " must divide " + tp_flag +
                            ": the expert-parallel ranks are tensor-parallel ranks (as in SGLang)");
  if (c.num_local_experts % ep != 0)
    return invalid_argument(ep_flag + ": num_local_experts (" +
                            std::to_string(c.num_local_experts) +
                            ") does not split evenly over the expert-parallel ranks");
  auto divides = [&](int64_t n, int64_t by, const std::string& flag, const char* what) -> Status {
    if (n % by != 0)
      return invalid_argument(flag + ": " + what + " (" + std::to_string(n) +
                              ") does not split evenly over " + std::to_string(by) + " ranks");
    return Status::ok();
  };
  M3_RETURN_IF_ERROR(
      divides(c.num_attention_heads, attn_ranks, attn_flag, "num_attention_heads"));
  M3_RETURN_IF_ERROR(divides(c.intermediate_size, ranks / ep,
                             ep > 1 ? tp_flag + " " + ep_flag : tp_flag, "intermediate_size"));
  M3_RETURN_IF_ERROR(divides(c.dense_intermediate_size, ranks, tp_flag, "dense_intermediate_size"));
  M3_RETURN_IF_ERROR(
      divides(c.shared_intermediate_size, ranks, tp_flag, "shared_intermediate_size"));
  const int64_t kv = c.num_key_value_heads;
  if (kv % attn_ranks != 0 && attn_ranks % kv != 0)
    return invalid_argument(attn_flag + ": num_key_value_heads (" + std::to_string(kv) +
                            ") must be a multiple of the ranks, or the ranks of it" +
                            (dp > 1 ? " (the ranks of one attention group, tp / dp)" : ""));
  return Status::ok();
}

RankSlices rank_slices(const MiniMaxM3Config& c, int rank, int ranks, int ep, int dp) {
  RankSlices s;
  ParallelLayout layout{rank, ranks, nullptr, ep};
  layout.dp = dp;
  // Attention: the rank's position in its group of ranks / dp.
  const int attn_ranks = layout.attn_tp(), attn_rank = layout.attn_tp_rank();
  s.q_count = c.num_attention_heads / attn_ranks;
  s.q_begin = attn_rank * s.q_count;
  const int64_t kv = c.num_key_value_heads;
  if (attn_ranks <= kv) {
    s.kv_count = kv / attn_ranks;
    s.kv_begin = attn_rank * s.kv_count;
  } else {  // replicated: the KV head of this rank's query heads
    s.kv_count = 1;
    s.kv_begin = s.q_begin / (c.num_attention_heads / kv);
  }
  s.expert_count = c.num_local_experts / ep;
  s.expert_begin = layout.ep_rank() * s.expert_count;
  s.inter_count = c.intermediate_size / layout.moe_tp();
  s.inter_begin = layout.moe_tp_rank() * s.inter_count;
  s.dense_count = c.dense_intermediate_size / ranks;
  s.dense_begin = rank * s.dense_count;
  s.shared_count = c.shared_intermediate_size * c.n_shared_experts / ranks;
  s.shared_begin = rank * s.shared_count;
  const VocabSlice v = vocab_slice(c.vocab_size, rank, ranks);
  s.vocab_begin = v.begin;
  s.vocab_count = v.count;
  return s;
}

MiniMaxM3Config rank_config(const MiniMaxM3Config& c, int rank, int ranks, int ep, int dp) {
  const RankSlices s = rank_slices(c, rank, ranks, ep, dp);
  MiniMaxM3Config r = c;
  r.num_attention_heads = s.q_count;
  r.num_key_value_heads = s.kv_count;
  r.index_n_heads = s.kv_count;
  r.intermediate_size = s.inter_count;
  r.dense_intermediate_size = s.dense_count;
  // n_shared_experts stays: the width is split, the shared_intermediate_size per expert with it.
  r.shared_intermediate_size = c.shared_intermediate_size / ranks;
  return r;
}

}  // namespace m3::minimax_m3

// Tensor and expert parallelism of the MiniMax-M3 model on CPU or GPU ranks, with SGLang's
// meaning of --tp and --ep: the world is the tp ranks, and the expert-parallel group lives inside
// them (ep divides tp).
//
// Tensor parallelism: rank r of T holds the query heads [r·H/T, (r+1)·H/T) with their KV and
// index heads (KV heads are replicated where T exceeds them: T/Hkv ranks share one), a 1/T slice
// of every dense MLP's and shared expert's intermediate dimension, and whole copies of the norms,
// the router, the index key projection and the embedding. The LM head is split by vocabulary rows
// (SGLang/vLLM's ParallelLMHead): rank r holds rows [vocab_begin, vocab_begin + vocab_count) (the
// first V % T ranks one more than V / T), computes those logits, and the slices are all-gathered
// into every rank's full logits in vocabulary order (model.cpp). Each rank's attention
// output projection and feed-forward block produce a partial sum of the hidden state, all-reduced
// over the ranks (backend/comm/communicator.h).
//
// Routed experts: with ep = 1 every routed expert is split by its intermediate dimension over the
// T ranks (which keeps batch 1 balanced). With ep > 1, rank r is expert-parallel rank
// r / (T/ep) and holds the experts [e·E/ep, (e+1)·E/ep) of that rank e whole, or, where T > ep,
// split by their intermediate dimension over the T/ep ranks that share them (moe-tp rank
// r % (T/ep)), as SGLang's moe_ep_rank / moe_tp_rank. Tokens reach their experts by all-to-all
// (expert_parallel_moe.h).
//
// Attention data parallelism (--enable-dp-attention --dp D, SGLang's meaning; D divides T): the T
// ranks form D attention groups of T/D consecutive ranks (group g = ranks [g·T/D, (g+1)·T/D)).
// A group runs attention tensor-parallel over its T/D ranks (the heads split T/D-way, KV heads
// replicated where T/D exceeds them) on its own requests' tokens, with its own KV pool, and
// all-reduces the attention output within the group (attn_comm). The dense MLPs and the MoE
// layers stay split over all T ranks as above and run on every group's tokens: the groups' normed
// hidden states are all-gathered, and the feed-forward partial sums all-reduced over the T ranks,
// of which each rank keeps its group's rows.
//
// A rank runs the unchanged model code on its local shapes: rank_config() is the model config
// as the rank sees it (its heads and intermediate sizes), and the loader takes the rank's slices.
#pragma once

#include <cstdint>

#include "backend/comm/communicator.h"
#include "core/status.h"
#include "loader/model_config.h"

namespace m3::minimax_m3 {

struct ParallelLayout {
  int rank = 0;
  int ranks = 1;                       // --tp: every rank of the group
  comm::Communicator* comm = nullptr;  // required when ranks > 1; not owned
  int ep = 1;                          // --ep: divides ranks
  int dp = 1;                          // --dp: attention groups; divides ranks
  // The rank's attention group (ranks / dp ranks); required when ranks / dp > 1 and dp > 1 (with
  // dp = 1 attention all-reduces over `comm`). Not owned.
  comm::Communicator* attn_comm = nullptr;
  // Rank 0 loads the whole LM head (all V rows) instead of its vocabulary slice, which it then
  // reads in place: a DSpark draft running on rank 0 computes its logits with the whole head.
  bool whole_lm_head_on_rank0 = false;

  // Ranks that share one expert-parallel rank's experts (each holding a 1/moe_tp slice of them).
  int moe_tp() const { return ranks / ep; }
  int ep_rank() const { return rank / moe_tp(); }
  int moe_tp_rank() const { return rank % moe_tp(); }
  // Ranks of one attention group, the rank's group and its position in it.
  int attn_tp() const { return ranks / dp; }
  int dp_rank() const { return rank / attn_tp(); }
  int attn_tp_rank() const { return rank % attn_tp(); }
};

// What rank `rank` holds, in units of heads, intermediate columns and experts. The heads are the
// rank's attention group's share (split over ranks / dp); the rest is split over all ranks.
struct RankSlices {
  int64_t q_begin = 0, q_count = 0;    // query heads
  int64_t kv_begin = 0, kv_count = 0;  // KV heads (= index heads: one per KV group)
  int64_t inter_begin = 0, inter_count = 0;    // routed experts' intermediate columns
  int64_t expert_begin = 0, expert_count = 0;  // routed experts held (all of them when ep = 1)
  int64_t dense_begin = 0, dense_count = 0;    // dense MLP's
  int64_t shared_begin = 0, shared_count = 0;  // the shared expert's (all of n_shared_experts)
  // LM head rows (vocabulary ids), split over all ranks: base = V / ranks, extra = V % ranks,
  // begin = rank·base + min(rank, extra), count = base + (rank < extra). V need not divide.
  int64_t vocab_begin = 0, vocab_count = 0;
};

// invalid_argument naming the flag and the size that does not divide: ep must divide ranks (the
// expert-parallel group lives inside the tensor-parallel ranks), the experts must split over ep,
// the query heads and the dense and shared intermediate sizes over `ranks`, the routed experts'
// intermediate size over ranks / ep, and the KV heads over `ranks` (or `ranks` over them). With
// dp > 1: dp must divide ranks, and the heads split over ranks / dp instead (the flags named are
// --dp and --tp).
// Rank `rank` of `ranks`' rows of a vocabulary of `vocab` ids (the LM head's split):
// [begin, begin + count) with base = vocab / ranks, the first vocab % ranks ranks one more.
struct VocabSlice {
  int64_t begin = 0, count = 0;
};
inline VocabSlice vocab_slice(int64_t vocab, int64_t rank, int64_t ranks) {
  const int64_t base = vocab / ranks, extra = vocab % ranks;
  return {rank * base + (rank < extra ? rank : extra), base + (rank < extra ? 1 : 0)};
}

Status check_tensor_parallel(const MiniMaxM3Config& cfg, int ranks, int ep = 1, int dp = 1);
RankSlices rank_slices(const MiniMaxM3Config& cfg, int rank, int ranks, int ep = 1, int dp = 1);
// The config with the rank's head counts and intermediate sizes (what its model code and KV cache
// are shaped by). num_local_experts stays the model's: the router scores all experts.
MiniMaxM3Config rank_config(const MiniMaxM3Config& cfg, int rank, int ranks, int ep = 1,
                            int dp = 1);

}  // namespace m3::minimax_m3

// Tensor parallelism of the MiniMax-M3 model on CPU or GPU ranks, as SGLang's --tp splits it:
// rank r of T holds the query heads [r·H/T, (r+1)·H/T) with their KV and index heads (KV heads
// are replicated where T exceeds them: T/Hkv ranks share one), a 1/T slice of every dense MLP's,
// shared expert's and routed expert's intermediate dimension, and whole copies of the norms, the
// router, the index key projection, the embedding and the LM head. Each rank's attention output
// projection and feed-forward block produce a partial sum of the hidden state, all-reduced over
// the ranks (backend/comm/communicator.h).
//
// A rank runs the unchanged model code on its local shapes: rank_config() is the model config
// as the rank sees it (its heads and intermediate sizes), and the loader takes the rank's slices.
#pragma once

#include <cstdint>

#include "backend/comm/communicator.h"
#include "core/status.h"
#include "loader/model_config.h"

namespace m3::minimax_m3 {

struct TensorParallel {
  int rank = 0;
  int ranks = 1;
  comm::Communicator* comm = nullptr;  // required when ranks > 1; not owned
};

// What rank `rank` of `ranks` holds, in units of heads and intermediate columns.
struct RankSlices {
  int64_t q_begin = 0, q_count = 0;    // query heads
  int64_t kv_begin = 0, kv_count = 0;  // KV heads (= index heads: one per KV group)
  int64_t inter_begin = 0, inter_count = 0;    // routed experts' intermediate columns
  int64_t dense_begin = 0, dense_count = 0;    // dense MLP's
  int64_t shared_begin = 0, shared_count = 0;  // the shared expert's (all of n_shared_experts)
};

// invalid_argument naming the size that does not divide: the query heads, the intermediate sizes
// and the KV heads (T a multiple of them or they of T) must split evenly over `ranks`.
Status check_tensor_parallel(const MiniMaxM3Config& cfg, int ranks);
RankSlices rank_slices(const MiniMaxM3Config& cfg, int rank, int ranks);
// The config with the rank's head counts and intermediate sizes (what its model code and KV cache
// are shaped by).
MiniMaxM3Config rank_config(const MiniMaxM3Config& cfg, int rank, int ranks);

}  // namespace m3::minimax_m3

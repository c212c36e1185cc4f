// The routed experts of one MoE layer under expert parallelism (tensor_parallel.h): the experts
// are placed whole (or split by intermediate over the ranks / ep ranks that share them) on the
// ep expert-parallel ranks, and tokens travel to their experts and back with all-to-all.
//
// With tensor-parallel attention every rank holds every token of the step (the attention output
// is all-reduced). Rather than every rank running its experts on every token and all-reducing,
// the tokens are partitioned: within each group of ep ranks that together hold every expert at
// the same intermediate slice (the ranks of one moe-tp rank), expert-parallel rank e takes the
// contiguous 1/ep share [T·e/ep, T·(e+1)/ep) of the step's tokens. For its tokens it
//   1. routes them (router and top-k in float32, the same on every rank for the same row);
//   2. dispatches: all_to_all_v of the per-destination pair counts, then of the local expert ids
//      and of the hidden rows, one row per (token, slot) pair, to the rank that owns the slot's
//      expert, in (token, slot) order;
//   3. the owners run their experts on what they received (the backend's moe_experts with one
//      slot of weight 1, which is exact) and send the unweighted outputs back with all_to_all_v;
//   4. combines: out[t] = Σ_slots weight · output in ascending slot order, the order of the CPU
//      backend's moe_experts, so that with whole experts (ep = ranks) a token's routed sum is the
//      unsharded one bit for bit.
// Each expert row is computed once per moe-tp slice instead of ep times, so the expert work is
// split over the ranks as it is on GPUs, and the same scheme carries over to data-parallel
// attention, where the tokens are partitioned to begin with. Rows of other ranks' tokens are
// zero in `out`; the layer's all-reduce (with the tensor-parallel shared expert) completes them.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/status.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {

struct ExpertParallelMoeParams {
  const float* x = nullptr;            // [T, Hd] the normed hidden states of every token
  const float* router = nullptr;       // [E, Hd]
  const float* router_bias = nullptr;  // [E]
  const float* const* w13 = nullptr;   // [experts held] pointers, each [2·I_local, Hd]
  const float* const* w2 = nullptr;    // [experts held] pointers, each [Hd, I_local]
  float* out = nullptr;                // [T, Hd] overwritten
  int64_t tokens = 0, hidden = 0, inter = 0;  // inter: the rank's slice of each expert
  int64_t num_experts = 0, top_k = 0;
  float routed_scaling = 1.0f, alpha = 1.702f, limit = 7.0f;
};

// A collective over layout.comm: every rank calls it for the same layer with the same tokens.
// The buffers must be memory the communicator reads (host memory on CPU ranks).
Status expert_parallel_moe(Backend* backend, const ParallelLayout& layout,
                           const ExpertParallelMoeParams& p);

}  // namespace m3::minimax_m3

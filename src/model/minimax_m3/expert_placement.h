// Where the routed experts live under expert parallelism (--ep E among --tp N ranks;
// tensor_parallel.h), as the GPU ranks use it: which rank holds which experts, the rank's local
// slot of a global expert id (its group in the loaded expert matrices), and the bytes of routed
// experts a GPU holds in the checkpoint's NVFP4 storage. Host-only arithmetic (no backend), so the
// placement is unit-tested without a GPU; the CUDA model takes the same numbers from rank_slices.
//
// Expert-parallel rank e = r / (N/E) holds the contiguous block of experts [e·X/E, (e+1)·X/E) of
// the X routed experts; the N/E ranks of one expert-parallel rank split each of those experts by
// its intermediate dimension (moe-tp rank r % (N/E)). Every expert is held by exactly one
// expert-parallel rank, so summing each rank's contribution of its own experts (and nothing for
// the others') over all ranks gives the MoE layer's output.
#pragma once

#include <cstdint>

#include "loader/model_config.h"

namespace m3::minimax_m3 {

struct ExpertPlacement {
  int64_t num_experts = 0;  // the model's routed experts (the router scores all of them)
  int ep = 1, ep_rank = 0;
  int64_t begin = 0, count = 0;              // global expert ids [begin, begin + count) held
  int64_t inter_begin = 0, inter_count = 0;  // each held expert's intermediate slice

  bool holds(int64_t expert) const { return expert >= begin && expert < begin + count; }
  // The rank's slot of a global expert id (its group in experts_gu / experts_down), or -1 where
  // another expert-parallel rank holds it: the kernels skip those slots.
  int64_t local_slot(int64_t expert) const { return holds(expert) ? expert - begin : -1; }
  // The global id of local slot `slot` (0 <= slot < count).
  int64_t global_id(int64_t slot) const { return begin + slot; }
};

// Rank `rank` of `ranks` with `ep` expert-parallel ranks (check_tensor_parallel must accept the
// layout; ep 1: every expert, split by intermediate over all ranks).
ExpertPlacement place_experts(const MiniMaxM3Config& cfg, int rank, int ranks, int ep);

// The expert-parallel rank that holds global expert `expert` (ranks [owner·N/E, (owner+1)·N/E)).
int expert_owner(const MiniMaxM3Config& cfg, int ep, int64_t expert);

// Device bytes of the routed experts one rank holds on the real-shape CUDA path in NVFP4 (the
// format M3.1-Flash stores them in; gpu_weights.h): per MoE layer and expert held, the fused
// gate|up [2·I, Hd] and the down [Hd, I] at the rank's intermediate slice I, each packed E2M1
// (half a byte per weight), an E4M3 scale per 16 weights and one float32 multiplier.
int64_t real_shape_routed_expert_bytes(const MiniMaxM3Config& cfg, const ExpertPlacement& p);

}  // namespace m3::minimax_m3

// What one rank of a tensor-parallel (and optionally expert-parallel) group holds of MiniMax-M3
// (docs/design/architecture.md, "Tensor parallelism"): attention heads and the dense /
// shared-expert intermediate dimension split by rank; routed experts either split whole by rank
// (expert parallel) or each split by its intermediate dimension (tensor parallel MoE).
// Column-parallel linears (q|k|v|index q, gate|up) keep the rank's rows, row-parallel ones
// (o_proj, down) the rank's columns; their partial outputs are summed across ranks (all-reduce,
// fused with the residual add; not wired yet: --tp above 1 is refused). The index key (one head)
// and the router are replicated.
//
// Host-only (no CUDA): the CUDA model's loader slices weights with these ranges and
// loader/raw_slice.h; one rank (the default) is the whole model.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "loader/model_config.h"

namespace m3::minimax_m3 {

struct ParallelLayout {
  int64_t world = 1;             // ranks of the tensor-parallel group (GPUs)
  int64_t rank = 0;              // this rank, 0 .. world - 1
  bool expert_parallel = false;  // routed experts split whole by rank (else by intermediate dim)
};

struct Span {  // [begin, end)
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

struct RankShard {
  Span q_heads, kv_heads, index_heads;  // attention heads (index heads follow the KV heads)
  Span dense_inter;                     // dense-MLP intermediate columns / rows
  Span shared_inter;                    // shared-expert intermediate (per shared expert)
  Span experts;                         // routed experts held (expert parallel: a slice)
  Span expert_inter;                    // intermediate of each held expert (TP MoE: a slice)
};

// invalid_argument naming the field when `world` does not divide a split shape, the rank is out
// of range, a split would break a quantisation block (MXFP8 32 / NVFP4 16 elements of the
// row-parallel inputs), or expert_parallel has fewer experts than ranks.
Status check_parallel_layout(const MiniMaxM3Config& cfg, const ParallelLayout& layout);

// The rank's ranges; call check_parallel_layout first (this assumes a valid layout).
RankShard shard_for_rank(const MiniMaxM3Config& cfg, const ParallelLayout& layout);

}  // namespace m3::minimax_m3

// Fused MoE router for decode (one launch): the router GEMV, the sigmoid top-k and the
// token-to-expert grouping of the grouped expert GEMV.
//
//   logits[r, e] = Σ_k x[r, k] · w[e, k]            (float32 products and sums, fixed order)
//                  x bf16; w bf16 (`w`) or float32 (`w_f32`, the checkpoint's router dtype)
//   topk_ids / topk_w                             = launch_router_topk on those logits, bitwise
//   group_offsets / sorted_rows / active_groups   = launch_group_by_expert on topk_ids, bitwise
//
// The router rule (f32_ops.h RouterTopkParams): choice = σ(logit) + bias, ties to the lower expert
// id; weights renormalise the unbiased σ over the chosen experts, times `scaling`; slots sorted by
// expert id. The grouping (gemm/quant_gemv.h GroupByExpertParams): routed row = token · top_k +
// slot; expert g owns sorted_rows[off[g], off[g+1]) in ascending row order; active_groups lists the
// experts with rows, ascending, padded with -1 to min(E, rows · top_k) entries.
//
// How: a grid of (E, ceil(rows / 32)) CTAs; CTA (e, b) reads weight row e once (16-byte loads; a
// float32 row is twice the bytes of a bf16 one) and computes the whole-K dot products of the rows
// of block b (no split-K partials), writes them to `logits`, then counts itself done on `counter`.
// The last CTA to arrive runs the top-k of every row and the grouping, and sets the counter back to
// zero, so the launch can be captured in a CUDA graph and replayed.
//
// Summation order (routing::kDotLanes = 512; the same for both weight dtypes, and the one
// launch_router_logits (moe/router_logits.h) reproduces bitwise for any number of rows): K is cut
// into 8-element chunks; lane t in [0, 512) sums the chunks t, t + 512, t + 1024, ... in that
// order, each as 8 fused multiply-adds in element order, starting from +0; the 32 lane sums of
// each group g of 32 lanes are added pairwise as a warp butterfly (lane j + lane j + 16, then
// + 8, + 4, + 2, + 1); the 16 group sums are added in group order. It depends only on `hidden`
// (not on rows, E or the row's position in the batch): results are deterministic and
// batch-invariant.
//
// Limits: 1 <= rows <= 256 (0: nothing is launched or written), 1 <= E <= 512, 1 <= top_k <=
// min(16, E), hidden a multiple of 8, ldx >= hidden and a multiple of 8, x and the weight 16-byte
// aligned, exactly one of w and w_f32 set.
//
// This header includes no CUDA header (cudaStream_t is forward-declared).
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct MoeRouteParams {
  const uint16_t* x = nullptr;  // [rows, ldx] bf16 activations
  int64_t ldx = 0;              // row stride of x in elements
  int64_t rows = 0;             // tokens
  int64_t hidden = 0;           // K
  // The router weight [E, hidden], row-major: bf16 (`w`) or float32 (`w_f32`), exactly one set.
  // The float32 weight routes as the float32 CPU reference does; bf16 rounding of the weight can
  // flip near-tied expert choices.
  const uint16_t* w = nullptr;
  const float* w_f32 = nullptr;
  int64_t num_experts = 0;      // E
  const float* bias = nullptr;  // [E] e_score_correction_bias, or null (= 0)
  int64_t top_k = 0;
  float scaling = 1.0f;              // routed_scaling_factor
  float* logits = nullptr;           // [rows, E] out (float32)
  int32_t* topk_ids = nullptr;       // [rows, top_k] out
  float* topk_w = nullptr;           // [rows, top_k] out
  int32_t* group_offsets = nullptr;  // [E + 1] out (E: group_experts where set)
  int32_t* sorted_rows = nullptr;    // [rows · top_k] out
  int32_t* active_groups = nullptr;  // [min(E, rows · top_k)] out
  // Expert parallelism: the grouping covers the rank's experts [group_base, group_base +
  // group_experts) only (GroupByExpertParams::expert_base: offsets and active groups are local
  // slots, the other experts' rows appear nowhere); the logits and the top-k stay over all E
  // experts with global ids. group_experts 0: every expert (group_base must then be 0).
  int64_t group_base = 0, group_experts = 0;
  uint32_t* counter = nullptr;       // one device word: zero before the first launch (cudaMemset
                                     // once); every launch leaves it zero. Launches that share a
                                     // counter must not run concurrently.
  // The logits and the top-k, not the grouping (group_offsets, sorted_rows, active_groups may be
  // null): for one token, whose expert GEMVs take their slots' experts from topk_ids directly
  // (QuantGemvParams::token_topk_ids), so that the grouping's block-wide pass is off the path.
  bool topk_only = false;
  // Programmatic dependent launch (runtime/pdl.cuh): the CTAs may start under the previous
  // kernel's tail; each prefetches its weight row into L2, then waits for that kernel before it
  // reads x or writes anything. Same results either way.
  bool pdl = false;
};

Status launch_moe_route(const MoeRouteParams& p, CUstream_st* stream);

}  // namespace m3::cuda

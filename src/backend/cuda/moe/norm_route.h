// The batch-1 post-attention norm fused with the MoE router: one launch of a cluster of 8 CTAs
// that computes, for one token,
//   residual += delta; out (+ out_f16, out_inv_scale) = the Gemma RMSNorm of the residual
//       -- bit for bit what launch_add_rms_norm's cluster kernel stores (norm/add_rms_norm.h);
//   logits, top-k ids and weights, group_offsets / sorted_rows / active_groups of `out`
//       -- bit for bit what launch_moe_route stores on that `out` (moe/moe_route.h).
//
// Why: at batch 1 the router is on the critical path between the post-attention norm and the
// routed experts, and as a separate launch it took ~14 us inside the model for 1.5 MB of weights
// (7.9 us alone): its weight rows and the norm's output come through L2 behind the shared
// expert's stream, then a fence + ticket, then the last CTA's top-k and grouping. Here each CTA
// bulk-copies its E/8 router rows into shared memory before the wait for the kernel before it,
// the 8 CTAs exchange the normed row through distributed shared memory, and CTA 0 runs the top-k
// and the grouping on logits the others stored into its shared memory: no global round trip
// between the norm and the routing.
//
// Measured (H200, M3.1-Flash): the routing is ready 11.0 us after
// o_proj ends instead of 17.7 (the CTAs, 211 KB of shared memory each, become resident only at
// o_proj's tail, so the copies do not overlap it), but the step is slower: the separate router's
// window was filled by the shared expert, which then has to share the routed experts' window.
// CudaM3Options::fused_norm_route is therefore off.
//
// Summation orders are those of the two kernels it replaces: the norm's partial sums per CTA
// (threads beyond a CTA's pieces add exact zeros), each logit as launch_moe_route's thread t of
// 512 (8-element chunks t, t + 512, ... in order, a warp butterfly, the 16 warp sums in warp
// order). Ties, NaN handling and the grouping are the shared device code (moe/routing_device.cuh).
//
// Requirements (norm_route_problem): one token (norm.t == route.rows == 1), route.x == norm.out
// with ldx == hidden, hidden a multiple of 32 and at most 8192, num_experts a multiple of 8 and at
// most 128, top_k in [1, min(16, E)], a bf16 router whose E/8 rows (plus the row) fit in one SM's
// shared memory (M3.1-Flash: 16 rows x 6144 = 192 KB), 16-byte aligned weights. route.counter and
// route.pdl are not used; norm.pdl launches it as a programmatic dependent (its router rows are
// requested before the wait). This header includes no CUDA header.
#pragma once

#include <string>

#include "backend/cuda/moe/moe_route.h"
#include "backend/cuda/norm/add_rms_norm.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct NormRouteParams {
  AddRmsNormParams norm;
  MoeRouteParams route;
};

// Why the fused kernel cannot run these parameters ("" when it can).
std::string norm_route_problem(const NormRouteParams& p);

// invalid_argument naming the reason where norm_route_problem is not empty.
Status launch_norm_route(const NormRouteParams& p, CUstream_st* stream);

}  // namespace m3::cuda

// The batch-1 MoE block of a decode step in one persistent launch (the first piece of the
// persistent decode layer, docs/design/decode-kernels.md): the router GEMV, its sigmoid top-k and
// grouping, the shared expert (MXFP8 gate|up + SwiGLU, down) and the routed experts (NVFP4
// gate|up + SwiGLU, down), from the post-attention norm's output to the outputs the next norm
// sums (the shared expert's row and one row per routed slot).
//
// Why: per kernel, every weight stream starts and stops with its launch, and the routed experts'
// stream cannot start before the router's kernel has ended. Here one CTA per SM stays resident
// for the whole block: a producer warp streams the weights of the CTA's work items, op after op,
// into a ring of shared-memory slots (bulk copies and mbarriers, as GEMV variant 6 does), without
// waiting for activations; 16 consumer warps run the items; a control warp computes the routing
// as soon as the router's logits are stored. Ops depend on each other through counters in
// global memory instead of kernel boundaries:
//   router rows -> [router_done] -> top-k in every CTA -> routed gate|up -> [experts_gu_done] ->
//   routed down;  shared gate|up -> [shared_gu_done] -> shared down.
// Each CTA's list is: its router rows, its shared gate|up tiles, its routed gate|up tiles, its
// shared down tiles, its routed down tiles: every wait is for items that come earlier in every
// list, so the lists cannot deadlock while all CTAs are resident (one per SM, grid = the SM
// count).
//
// Measured (H200, M3.1-Flash shapes): correct, but slower than the
// per-kernel path: 78.4-79.0 us per block alone against 75.3-75.9 us for the per-kernel sequence on
// one stream, and ~12 us more per MoE layer inside the model, where the per-kernel path overlaps
// the shared expert's stream with the router and the routed experts on a second stream. At one
// token the NVFP4 experts' dequantisation bounds their consumers at ~2.4-2.6 TB/s in either design,
// so removing the kernel boundaries does not shorten the block. CudaM3Options::persistent_moe is
// off by default; the kernel stays as the tested base of the persistent decode layer
// (docs/design/decode-kernels.md).
//
// Results: the logits, top-k ids and weights and the grouping are bitwise those of
// launch_moe_route (the same dot order, the same top-k device code, a warp grouping equal to
// launch_group_by_expert's for one token). The GEMVs use variant 6's arithmetic (exact f16
// products on the tensor cores, f32 sums in a fixed order; deterministic), so they match the
// per-kernel path (variants 5 and 7) within the summation bound, not bit for bit.
//
// Limits (moe_block_stream_fits): one token; router bf16 with hidden % 8 == 0 and hidden * 2 <=
// a slot (9344); 1 <= E <= 512, 1 <= top_k <= 16; the shared expert (optional: n == 0 skips it)
// MXFP8 in the mma layout (gate|up pairs, down rows of 16), K % 1024 == 0; the routed experts
// NVFP4 in the mma layout, K % 256 == 0; every N % 16 == 0; the gate|up epilogues SwiGLU to f16
// x 2^8, read by the downs (xh = that output, x_inv_const = 2^-8).
//
// This header includes no CUDA header (cudaStream_t is forward-declared).
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/moe/moe_route.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// Counter words one launch site needs (zero before its first launch; every launch leaves them
// zero). Launch sites that may overlap in time (e.g. consecutive layers under programmatic
// dependent launch) need their own words.
constexpr int kMoeBlockCounters = 8;

// Stamps of MoeBlockParams::phase_ns, per CTA (c: its consumers, p: its producer).
enum MoeBlockPhase : int {
  kPhaseStart = 0,         // c: past the wait for the previous kernel
  kPhaseRouterRows,        // c: its router rows done
  kPhaseRoutingPublished,  // c (last CTA): top-k and grouping published
  kPhaseSharedGu,          // c: its shared gate|up tiles done
  kPhaseRoutingSeen,       // c: the routing seen
  kPhaseExpertsGu,         // c: its routed gate|up tiles done
  kPhaseSharedDownReady,   // c: every shared gate|up tile done
  kPhaseSharedDown,        // c: its shared down tiles done
  kPhaseExpertsDownReady,  // c: every routed gate|up tile done
  kPhaseEnd,               // c: its routed down tiles done
  kPhaseProducerStart,     // p: started
  kPhaseProducerRouting,   // p: the routing seen (its shared gate|up issued before)
  kPhaseProducerEnd,       // p: everything issued
  kMoeBlockPhases = 16,
};

struct MoeBlockParams {
  // The router: x = the normed row (bf16), rows = 1; logits, top-k and grouping outputs as
  // launch_moe_route. route.counter is not used.
  MoeRouteParams route;
  // The shared expert: gate|up (format MXFP8, w_layout 2, one row of xh, epilogue kSwigluF16)
  // and down (w_layout 1, xh = the gate|up's act, store f32). n == 0 on both: no shared expert.
  QuantGemvParams shared_gu, shared_down;
  // The routed experts: grouped (group_offsets / sorted_rows / active_groups = the route's
  // outputs, num_rows = top_k, x_row_div = top_k on gate|up), NVFP4, w_layout 2 / 1, the same
  // epilogue rules.
  QuantGemvParams experts_gu, experts_down;
  uint32_t* counters = nullptr;  // kMoeBlockCounters words
  // Optional (benchmarks): per CTA kMoeBlockPhases %globaltimer stamps (ns) of where its
  // consumers and producer got to (MoeBlockPhase); null: none written.
  uint64_t* phase_ns = nullptr;
  // Programmatic dependent launch: the producers stream their first weights before the previous
  // kernel (the norm writing x) has finished; the consumers wait for it.
  bool pdl = false;
};

// Whether the launch can run these parameters (else *why says what stands in the way).
bool moe_block_stream_fits(const MoeBlockParams& p, std::string* why = nullptr);

Status launch_moe_block_stream(const MoeBlockParams& p, CUstream_st* stream);

}  // namespace m3::cuda

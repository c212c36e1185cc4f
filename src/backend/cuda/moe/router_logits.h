// MoE router logits for any number of rows (the prefill / general path, and decode batches above
// the fused router's row limit):
//
//   logits[r, e] = Σ_k x[r, k] · w[e, k]      x bf16, w bf16 or float32, float32 products and sums
//
// in the fused router's summation order (moe_route.h, routing::kDotLanes): the logits are bitwise
// those of launch_moe_route for the same x row and weight, whatever the number of rows, the row's
// position in the batch or the path that ran it, so launch_router_logits + launch_router_topk
// choose bitwise the experts and weights launch_moe_route chooses, and a token's routing does not
// depend on the batch it was in.
//
// How: CTAs of 8 warps own a tile of 32 rows × 8 experts, each warp 8 rows × 4 experts. For each
// group g of 32 summation lanes (16 groups), lane j of a warp computes the lane sum j of its 32
// (row, expert) pairs (the chunks 32g + j, 32g + j + 512, ... in order; 16-byte loads: 32 lanes
// read 512 contiguous bytes of an x row, 512 or 1024 of a weight row), writes them to shared
// memory, and lane o then adds the 32 lane sums of pair o in the butterfly's order and adds the
// result to its running group sum. A weight row is read from memory once per tile of 32 rows (the
// 4 row-group warps of a CTA share it through L1), an x row once per tile of 8 experts. About
// 2·rows·E·hidden float32 FLOPs on the CUDA cores, no tensor cores (the fixed order rules them
// out); small next to the experts' GEMMs.
//
// Limits: 0 <= rows < 2^31 (0: nothing is launched), 1 <= E <= 512, hidden a positive multiple of
// 8, ldx >= hidden and a multiple of 8, ld_logits >= E, x and the weight 16-byte aligned, exactly
// one of w and w_f32 set.
//
// This header includes no CUDA header (cudaStream_t is forward-declared).
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct RouterLogitsParams {
  const uint16_t* x = nullptr;  // [rows, ldx] bf16 activations
  int64_t ldx = 0;              // row stride of x in elements
  int64_t rows = 0;             // tokens
  int64_t hidden = 0;           // K
  // The router weight [E, hidden], row-major: bf16 (`w`) or float32 (`w_f32`), exactly one set
  // (as MoeRouteParams).
  const uint16_t* w = nullptr;
  const float* w_f32 = nullptr;
  int64_t num_experts = 0;  // E
  float* logits = nullptr;  // [rows, ld_logits] out (float32), columns [0, E) written
  int64_t ld_logits = 0;    // row stride of logits in elements; 0 means E
  // Programmatic dependent launch (runtime/pdl.cuh): the CTAs wait for the previous kernel
  // before they read x. Same results either way.
  bool pdl = false;
};

Status launch_router_logits(const RouterLogitsParams& p, CUstream_st* stream);

}  // namespace m3::cuda

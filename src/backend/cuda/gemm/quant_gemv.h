// Dequantising GEMV / grouped GEMV for few tokens (decode, small batches) on Hopper, which has no
// FP4 or block-scaled tensor-core instructions: weights are dequantised in registers (exactly,
// into float32 on the CUDA cores or into f16 operands on the tensor cores) and every weight byte
// is streamed from HBM once per launch (16-byte loads that bypass L1), with float32 accumulation.
//
//   y[r, n] = Σ_k x[rows[r] / x_row_div, k] · W_{g(r)}[n, k]
//
// for every routed row r, where g(r) is the group (expert) that owns r. The split-K kernels store
// partial[s, r, n] per K-slice s and launch_quant_gemv_epilogue sums the slices in a fixed order
// (deterministic); the tensor-core kernels fuse that epilogue. Either epilogue stores float32 or
// applies SwiGLU-OAI and stores bf16 (or f16 x 2^8) activations. The kernels are GemvKernel's;
// gemv_plan.h chooses one per decode matrix.
//
// Formats (m3-architecture.md §4.3-4.4):
//  * MXFP8: codes E4M3 [N, K], scales E8M0 [N, K/32]: w = e4m3 · 2^(s - 127).
//  * NVFP4: packed E2M1 [N, K/2] (element 2i in the low nibble), scales E4M3 [N, K/16], and a
//    per-matrix float multiplier: w = e2m1 · e4m3(scale) · global (for compressed-tensors
//    checkpoints global = 1 / weight_global_scale; ModelOpt: weight_scale_2).
//  * BF16 (lm_head, router, embeddings): [N, K] bf16, no scales.
// Requirements: per kernel (GemvKernel; all MiniMax-M3 in-dims qualify), 16-byte aligned weight
// rows. Arithmetic is float32 throughout (products and sums), so there is no range limit on the
// activations beyond float32 (the f16 operands carry a power of two per row, x_f16.h).
//
// This header includes no CUDA header (cudaStream_t is forward-declared).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

enum class QuantFormat : int { kMxfp8 = 0, kNvfp4 = 1, kBf16 = 2 };

// The GEMV kernels. The decode path's choice among them is gemv_plan.h's choose_decode_gemv.
enum class GemvKernel : int {
  // BF16 weights on the CUDA cores (the router above the fused router's rows, the lm_head at one
  // row): a warp owns 4 weight rows of a 256-element K-slice, activations in registers, a
  // butterfly reduction over the lanes; split-K partials summed by launch_quant_gemv_epilogue
  // (gemv_bf16.cu). K % 256.
  kBf16SplitK = 2,
  // MXFP8 / NVFP4 dequantised to float on the CUDA cores: activations in shared memory, 6-8
  // 16-byte loads in flight per lane with their scales, <= 64 registers, K-slices of 1536-4096;
  // split-K partials summed by launch_quant_gemv_epilogue (gemv_dequant_splitk.cuh). K % 32.
  kDequantSplitK = 3,
  // MXFP8 / NVFP4 on the tensor cores, the weights streamed through a 2-slot cp.async ring per
  // warp, f16 activations (xh), 1-32 rows per group, the epilogue fused (partial unused)
  // (gemv_mma.cuh, gemv_mma_ring.cu). K % 128; SwiGLU needs N % 16; NVFP4 row-major or in the mma
  // layout.
  kMmaRing = 5,
  // MXFP8 of one matrix on the tensor cores, each lane's weight bytes loaded straight into
  // registers two stages ahead, row-major or in the mma layout; reads xh (any rows, passes of up
  // to 32) or, without it, x (bf16, up to 8 rows, converted by each warp); the epilogue fused
  // (partial unused) (gemv_mma_direct.cu). K % 128, SwiGLU N % 16.
  kMmaDirect = 7,
};

// Storage order of the weights (quant/nvfp4_mma_layout.h, quant/mxfp8_mma_layout.h). The mma
// layouts are read by kMmaRing (NVFP4) and kMmaDirect (MXFP8) only, and by the prefill
// dequantisation.
enum class WeightLayout : int {
  kRowMajor = 0,        // the checkpoint's [N, K] order
  kMmaRows16 = 1,       // the mma layout in tiles of 16 rows (store epilogue)
  kMmaSwigluPairs = 2,  // the mma layout pairing gate row i with up row N/2 + i (SwiGLU epilogue)
};

enum class GemvEpilogue : int {
  kStoreF32 = 0,    // y[r, n] (+)= Σ_s partial[s, r, n]
  kSwigluBf16 = 1,  // act[r, i] = bf16(SwiGLU-OAI(gate = Σ_s partial[s, r, i],
                    //                             up = Σ_s partial[s, r, N/2 + i])), i < N/2
  kSwigluF16 = 2,   // tensor-core kernels only: act[r, i] = f16 bits of that bf16 value x 2^8
                    // (exact; the input of a following tensor-core GEMV with x_inv_const = 2^-8)
};

struct GemvEpilogueParams {
  GemvEpilogue kind = GemvEpilogue::kStoreF32;
  const float* partial = nullptr;  // [num_slices, num_rows, N]
  int64_t num_slices = 0, num_rows = 0, n = 0;
  float* y = nullptr;              // kStoreF32: [num_rows, ldy]
  int64_t ldy = 0;
  bool accumulate = false;
  uint16_t* act = nullptr;         // kSwigluBf16 / kSwigluF16: [num_rows, N/2] bf16 / f16 bits
  float alpha = 1.702f, limit = 7.0f;
  bool pdl = false;                // programmatic dependent launch (runtime/pdl.cuh)
};

struct QuantGemvParams {
  QuantFormat format = QuantFormat::kMxfp8;
  // Activations (bf16 bits; kMmaRing reads xh instead, kMmaDirect xh where given).
  const uint16_t* x = nullptr;      // [X, K], row stride ldx elements
  int64_t ldx = 0;
  // The tensor-core kernels: the activations as f16 bits times a power of two per row (x_f16.h),
  // and the inverse factors: x = xh[r] · x_inv_scale[r] (x_inv_const where x_inv_scale is null).
  const uint16_t* xh = nullptr;     // [X, K], row stride ldx
  const float* x_inv_scale = nullptr;
  float x_inv_const = 1.0f;
  int64_t x_row_div = 1;            // x row of routed row r is r / x_row_div (top_k for MoE up)
  // Weights: G matrices of one shape, stored back to back.
  const uint8_t* w = nullptr;       // [G, N, K] E4M3 (MXFP8) | [G, N, K/2] packed E2M1 (NVFP4)
                                    // | [G, N, K] bf16 (BF16)
  const uint8_t* w_scale = nullptr; // [G, N, K/32] E8M0 (MXFP8) | [G, N, K/16] E4M3 (NVFP4);
                                    // unused for BF16
  const float* w_global = nullptr;  // [G] NVFP4 multiplier; nullptr = 1; unused for MXFP8
  WeightLayout w_layout = WeightLayout::kRowMajor;
  int64_t num_groups = 1;           // G
  // Routing of rows to groups. All nullptr: one group, rows 0..num_rows-1 in order.
  const int32_t* group_offsets = nullptr;  // [G + 1]: group g owns sorted_rows[off[g], off[g+1])
  const int32_t* sorted_rows = nullptr;    // [num_rows] routed row ids, grouped by g
  const int32_t* active_groups = nullptr;  // [num_slots] groups with rows, -1 = empty slot
  int64_t num_slots = 1;                   // grid size over groups: min(G, num_rows)
  // kMmaRing, one token's routed experts (num_rows == top_k rows, one per slot): the expert of
  // slot s is token_topk_ids[s], the token's top-k as launch_router_topk writes it (ascending
  // expert ids; an id outside [0, G) leaves its slot empty), and slot s computes routed row s.
  // That is launch_group_by_expert's grouping of one token, so the router needs no grouping
  // (MoeRouteParams::topk_only) and the CTA reads one word instead of active_groups and then
  // group_offsets. group_offsets and active_groups must still be set (they mark the launch as
  // grouped) and are not read; sorted_rows must be null.
  const int32_t* token_topk_ids = nullptr;
  // Expert parallelism with token_topk_ids: the ids are global and the G groups are the experts
  // [token_group_base, token_group_base + G); other ids leave their slot empty.
  int64_t token_group_base = 0;
  int64_t num_rows = 0;                    // routed rows (the r range)
  // Grouped: an upper bound on the rows of one group (0: num_rows), e.g. the tokens of a MoE
  // step (a token picks an expert once). At one, kMmaRing stages the activations with its
  // weights (gemv_plan.h, mma_ring_form).
  int64_t max_group_rows = 0;
  // kMmaRing: read the routing and request the first stages' weights before the PDL wait (the
  // activations after it). Only where the previous kernel on the stream wrote neither: the
  // routed experts' down product after their gate|up (the routing is two kernels old, and
  // kMmaRing lets its dependents start only after its own wait, so the routing is complete).
  // Bitwise the same results; with `pdl` the first weights stream under the previous kernel's
  // tail.
  bool weights_before_wait = false;
  int64_t n = 0, k = 0;
  float* partial = nullptr;         // the split-K kernels: [num_slices(k), num_rows, N] scratch
  GemvKernel kernel = GemvKernel::kDequantSplitK;
  // The tensor-core kernels: the fused epilogue (kind, y, ldy, accumulate, act, alpha, limit).
  GemvEpilogueParams epilogue;
  // kDequantSplitK, kMmaRing and kMmaDirect: programmatic dependent launch (runtime/pdl.cuh).
  // kDequantSplitK and kMmaDirect request their first weights (dense: into registers or L2)
  // before they wait for the previous kernel on the stream, so the weight stream starts under
  // that kernel's tail; grouped kDequantSplitK launches wait first (the group ids come from the
  // previous kernel). kMmaRing waits at its start, or with weights_before_wait once its first
  // weight stages are requested, and lets its own dependents start only after that wait. Results
  // are bitwise the same either way.
  bool pdl = false;
};

// K-slices of the partial buffer of the split-K kernel of a format for K (BF16: kBf16SplitK's
// slices of 256; MXFP8 / NVFP4: kDequantSplitK's slices of 1536-4096). The epilogue's num_slices
// must come from the same call.
int64_t quant_gemv_num_slices(QuantFormat f, int64_t k);

Status launch_quant_gemv(const QuantGemvParams& p, CUstream_st* stream);

Status launch_quant_gemv_epilogue(const GemvEpilogueParams& p, CUstream_st* stream);

// Token-to-expert grouping for the grouped GEMV: from topk_ids [num_rows] (row r = token·K + slot)
// builds group_offsets [E + 1], sorted_rows [num_rows] (ascending r within an expert) and
// active_groups [min(E, num_rows)] (experts with rows, ascending, then -1). Ids outside [0, E)
// are dropped (their rows get no output).
// Expert parallelism: topk_ids hold global expert ids and the rank holds the E experts
// [expert_base, expert_base + E); id - expert_base is the group (the rank's local slot), and ids
// of other ranks' experts fall outside [0, E) and are dropped the same way.
struct GroupByExpertParams {
  const int32_t* topk_ids = nullptr;  // [num_rows]
  int64_t num_rows = 0, num_experts = 0;
  int32_t* group_offsets = nullptr;   // [E + 1]
  int32_t* sorted_rows = nullptr;     // [num_rows]
  int32_t* active_groups = nullptr;   // [min(E, num_rows)]
  int64_t expert_base = 0;
};
Status launch_group_by_expert(const GroupByExpertParams& p, CUstream_st* stream);

}  // namespace m3::cuda

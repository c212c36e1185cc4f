// Gemma RMSNorm fused with the residual add, for the bf16 real-shape path:
//   residual[t] += delta[t]            (float32 residual stream; skipped when delta is null)
//   out[t] = bf16(residual[t] / sqrt(mean(residual[t]^2) + eps) · (1 + w))
// One read of the residual and the delta, one write of each output. This header includes no CUDA
// header.
//
// The delta can also be produced here, which saves the small kernel that would write it (at batch
// 1 each such launch costs as much as its work):
//  * split-K partial sums of a GEMV (quant_gemv.h): delta[t] = Σ_s partial[s, t] summed from 0 in
//    slice order, bit for bit what the GEMV's epilogue would have stored;
//  * the MoE combine (moe_combine.h): delta[t] = Σ_s w[t, s] · contrib[t·K + s] (+ shared[t]),
//    bit for bit what launch_moe_combine would have stored.
// At most one source; the updated residual is the same as with the stored delta.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct AddRmsNormParams {
  float* residual = nullptr;        // [T, Hd] float32, updated in place
  const float* delta = nullptr;     // [T, Hd] float32 or nullptr (norm only)
  const uint16_t* weight = nullptr; // [Hd] bf16 Gemma weight (the norm scales by 1 + w)
  uint16_t* out = nullptr;          // [T, Hd] bf16
  int64_t t = 0, hidden = 0;        // hidden % 4 == 0
  float eps = 1e-6f;
  // Optional (both or neither): the same bf16 values as f16 times a power of two per row, for
  // the tensor-core GEMVs (gemm/x_f16.h has the rule): out_f16 [T, Hd] f16 bits, out_inv_scale [T].
  uint16_t* out_f16 = nullptr;
  float* out_inv_scale = nullptr;
  // Delta from split-K partials: [delta_slices, T, Hd] float32 (0: not used).
  const float* delta_partial = nullptr;
  int64_t delta_slices = 0;
  // Delta from the MoE combine (moe_contrib non-null): contrib [T·K, Hd], weights [T, K], shared
  // [T, Hd] or nullptr.
  const float* moe_contrib = nullptr;
  const float* moe_weights = nullptr;
  const float* moe_shared = nullptr;
  int64_t moe_top_k = 0;
  // Programmatic dependent launch (runtime/pdl.cuh): the CTA may start under the previous
  // kernel's tail; it requests the norm weight, then waits for that kernel before it touches the
  // residual, the delta or the outputs. Same results either way.
  bool pdl = false;
  // Up to this many rows (T <= cluster_rows), each row is spread over a cluster of 8 CTAs
  // (hidden a multiple of 32, at most 8192), which exchange their partial sums of squares and
  // f16 maxima through distributed shared memory (a row read through 8 SMs instead of one).
  // The sums then run in another order (rounding may differ in the last bits); each way is
  // deterministic. 0: always one CTA per row.
  int64_t cluster_rows = 16;
};

Status launch_add_rms_norm(const AddRmsNormParams& p, CUstream_st* stream);

}  // namespace m3::cuda

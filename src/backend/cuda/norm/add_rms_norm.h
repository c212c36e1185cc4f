// Gemma RMSNorm fused with the residual add, for the bf16 real-shape path:
//   residual[t] += delta[t]            (float32 residual stream; skipped when delta is null)
//   out[t] = bf16(residual[t] / sqrt(mean(residual[t]^2) + eps) · (1 + w))
// One read of the residual and the delta, one write of each output. This header includes no CUDA
// header.
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
  // GEMV variant 5 (gemm/x_f16.h has the rule): out_f16 [T, Hd] f16 bits, out_inv_scale [T].
  uint16_t* out_f16 = nullptr;
  float* out_inv_scale = nullptr;
};

Status launch_add_rms_norm(const AddRmsNormParams& p, CUstream_st* stream);

}  // namespace m3::cuda

// MoE output of the real-shape path: out[t] = Σ_s w[t, s] · contrib[t·K + s] (+ shared[t]), the
// slots summed in ascending order (the CPU reference's order), float32. This header includes no
// CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct MoeCombineParams {
  const float* contrib = nullptr;       // [T·K, Hd] per routed row (row t·K + s)
  const float* topk_weights = nullptr;  // [T, K]
  const float* shared = nullptr;        // [T, Hd] shared-expert output or nullptr
  float* out = nullptr;                 // [T, Hd]
  int64_t t = 0, top_k = 0, hidden = 0;
};

Status launch_moe_combine(const MoeCombineParams& p, CUstream_st* stream);

}  // namespace m3::cuda

// MoE output of the real-shape path: out[t] = Σ_s w[t, s] · contrib[t·K + s] (+ shared[t]), the
// slots summed in ascending order (the CPU reference's order), float32; under expert parallelism
// only the rank's experts' slots (a token with none of them gets 0, or its shared output). This header includes no
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
  // Expert parallelism: with topk_ids set, only slots whose expert is in [expert_begin,
  // expert_end) (the rank's) are summed; the others' contrib rows were not computed here (the
  // grouped GEMVs skip them) and count as zero. The sum over the ranks adds them back.
  const int32_t* topk_ids = nullptr;  // [T, K] global expert ids
  int64_t expert_begin = 0, expert_end = 0;
};

Status launch_moe_combine(const MoeCombineParams& p, CUstream_st* stream);

}  // namespace m3::cuda

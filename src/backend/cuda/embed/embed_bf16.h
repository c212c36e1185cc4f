// Embedding lookup from a bf16 table into the float32 residual stream of the real-shape path:
// out[t, :] = float(table[ids[t], :]) (exact), zeros for an id outside [0, vocab). This header
// includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct EmbedBf16Params {
  const uint16_t* table = nullptr;  // [V, dim] bf16 bits
  const int32_t* ids = nullptr;     // [T]
  float* out = nullptr;             // [T, dim]
  int64_t t = 0, vocab = 0, dim = 0;
};

Status launch_embed_bf16(const EmbedBf16Params& p, CUstream_st* stream);

}  // namespace m3::cuda

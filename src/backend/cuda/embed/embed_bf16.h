// Embedding lookup from a bf16 table into the float32 residual stream of the real-shape path:
// out[t, :] = float(table[ids[t] - first_id, :]) (exact), zeros for an id outside
// [first_id, first_id + vocab). A tensor-parallel rank holds the rows [first_id, first_id + vocab)
// of the table (the vocabulary split): each rank's lookup leaves the other ranks' ids zero, and
// the ranks' sum is the whole table's lookup. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct EmbedBf16Params {
  const uint16_t* table = nullptr;  // [vocab, dim] bf16 bits: ids first_id .. first_id + vocab - 1
  const int32_t* ids = nullptr;     // [T]
  float* out = nullptr;             // [T, dim]
  int64_t t = 0, vocab = 0, dim = 0;
  int64_t first_id = 0;
};

Status launch_embed_bf16(const EmbedBf16Params& p, CUstream_st* stream);

}  // namespace m3::cuda

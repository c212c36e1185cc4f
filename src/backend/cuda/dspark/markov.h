// The DSpark draft's sequential Markov correction on the GPU (m3-architecture.md §5.2 step 6):
// one slot's logits row gets the rank-r bias of the previous token,
//   logits[v] += Σ_i markov_w2[v, i] · markov_w1[prev, i]     (v < V, i < r)
// a GEMV over the [V, r] table with the looked-up row as its input, so no [V, r] product is
// materialised per step. bf16 tables (as stored), float32 products and sums (a warp per row,
// lanes over i, a butterfly sum). This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct DSparkMarkovParams {
  float* logits = nullptr;              // [num_rows, ld_logits]: one slot's row per sequence
  const uint16_t* w1 = nullptr;         // [V, r] bf16, row `prev` is the input
  const uint16_t* w2 = nullptr;         // [V, r] bf16
  // The previous token: `prev` itself (one row only), or (prev_device non-null) read from device
  // memory, row i's at prev_device[i · prev_stride] (tokens the GPU chose), so the chain can
  // stay on the device.
  int32_t prev = 0;
  const int32_t* prev_device = nullptr;
  int64_t prev_stride = 1;
  int64_t vocab = 0, rank = 0;
  // Rows corrected in one pass over markov_w2 (the same slot of several sequences), at most
  // kDSparkMarkovMaxRows; ld_logits floats between them (0: V).
  int64_t num_rows = 1, ld_logits = 0;
};

inline constexpr int64_t kDSparkMarkovMaxRows = 16;

// invalid_argument ([cuda.dspark.markov]) on bad shapes or a prev outside [0, V).
Status launch_dspark_markov(const DSparkMarkovParams& p, CUstream_st* stream);

// The greedy pick of one slot on the device: *token = the index of the largest of logits[0, V),
// the lowest such index on ties (std::max_element's choice, the host greedy picker's), so the
// next slot's Markov correction can read it (prev_device) without a host round trip. NaNs are
// never chosen (a row of NaNs gives 0). One CTA: a row is ~0.8 MB at V = 200064, a few
// microseconds, next to the Markov GEMV's 100 MB table read.
// num_rows rows at once (one CTA each): row i at logits + i · ld_logits (0: V), its token to
// token[i · token_stride].
Status launch_dspark_argmax(const float* logits, int64_t vocab, int32_t* token,
                            CUstream_st* stream, int64_t num_rows = 1, int64_t ld_logits = 0,
                            int64_t token_stride = 1);

}  // namespace m3::cuda

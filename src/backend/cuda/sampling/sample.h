// Token sampling on the GPU, per row of [B, V] float32 logits, with the semantics of the CPU
// sampler (src/sample/sampler.h), so decode copies B token ids to the host instead of B·V logits:
//
//   temperature < 1e-5: token = argmax(logits) (ties -> lowest id)
//   else: z = logits · (1 / T) (float, as the CPU); keep the top_k largest z (ties -> lower id);
//         p ∝ exp(z - max z) over the kept set; top_p keeps the smallest prefix by descending p
//         (ties -> lower id) whose mass reaches top_p (>= 1 token); min_p keeps exp(z - max) >=
//         min_p; then u = uniform01(seed, stream, counter) (the CPU's SplitMix64 scheme,
//         src/sample/rng.h) picks the first kept token, in ascending id order, whose cumulative
//         kept mass exceeds u · (kept mass).
//
// Differences from the CPU, all within float rounding: exp is float32 (the CPU uses double); the
// top_p masses are exact integer sums of exp(z - max)·2^40 (deterministic, within 1e-7 of the
// real mass); the draw sums doubles in another order. So the kept set and the token equal the
// CPU's unless a cut (top_p's cumulative mass against top_p · total, min_p's ratio, u against a
// cumulative mass) falls within ~1e-6 relative of a boundary.
//
// Method (no sort): one CTA of 1024 threads per row (greedy rows: up to kSampleGreedySplits); top_k and top_p thresholds by a 4-pass
// 8-bit radix select on an order-preserving key of z (counts for top_k, masses for top_p;
// warp-aggregated shared-memory histograms), ties at the threshold resolved by the lowest ids; the
// draw by a scan over contiguous per-warp id ranges. About 12 passes over the row (from L2 after the first); no workspace in global memory.
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct SampleRowParams {  // per row, on the device
  float temperature = 1.0f;  // < 1e-5: greedy
  int32_t top_k = 0;         // <= 0 or >= V: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0, stream = 0, counter = 0;  // RngKey of src/sample/rng.h
};

struct SampleParams {
  const float* logits = nullptr;         // [B, ld] float32
  int64_t batch = 0, vocab = 0, ld = 0;  // ld >= vocab
  const SampleRowParams* rows = nullptr; // [B]
  int32_t* out = nullptr;                // [B] token ids
  // Optional (tests): kept_mask[b, i] = 1 where token i is in row b's final kept set (0 else);
  // nullptr in decode.
  uint8_t* kept_mask = nullptr;          // [B, vocab]
  // Optional scratch that spreads each greedy row over kSampleGreedySplits CTAs (each takes the
  // argmax of a slice, the last to finish, by a ticket, reduces the slices' results; the same
  // token bit for bit: the (value, lowest id) maximum does not depend on the order). One CTA
  // scanning the 200,064 logits of a row took 21 us per decode step on the H200. All three or
  // none; tickets zero before the first launch (cudaMemset), and every
  // launch leaves them zero.
  float* greedy_value = nullptr;         // [B, kSampleGreedySplits]
  int32_t* greedy_index = nullptr;       // [B, kSampleGreedySplits]
  uint32_t* greedy_tickets = nullptr;    // [B]
};

constexpr int64_t kSampleGreedySplits = 32;

// Token ids for every row. No allocation; capturable in a CUDA graph.
Status launch_sample(const SampleParams& p, CUstream_st* stream);

}  // namespace m3::cuda

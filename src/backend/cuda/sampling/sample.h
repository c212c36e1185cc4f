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
// Two kernels (SampleKernel), the same semantics; for the same inputs the same kept set (except,
// without top_k, where a top_p cut is within ~1e-6 relative of a boundary) and the same token
// (except also where u is within rounding of a cumulative boundary). See kMultiCta:
//
// kOneCtaPerRow (sample.cu): one CTA of 1024 threads per row (greedy rows: up to
// kSampleGreedySplits); top_k and top_p thresholds by a 4-pass 8-bit radix select on an
// order-preserving key of z (counts for top_k, masses for top_p; warp-aggregated shared-memory
// histograms), ties at the threshold resolved by the lowest ids; the draw by a scan over
// contiguous per-warp id ranges. About 12 passes over the row (from L2 after the first); no
// workspace in global memory. One SM per row: ~0.67 ms per row of 200,064 at top_k 40 on the H200.
//
// kMultiCta (sample_multi_cta.cu): each row over S = sample_multi_cta_splits(B, V) CTAs (about
// 128 CTAs in all, so batch 1 uses the whole GPU). Each CTA takes the top m of its slice (m =
// top_k when 1 <= top_k <= the candidate limit, else a fixed m when top_p or min_p can bound the
// kept set) and writes them, in id order, to the workspace; the last CTA of the row (a ticket)
// runs kOneCtaPerRow's selection on the S·m candidates, which hold the row's global top m. With
// top_k the kept set is exactly kOneCtaPerRow's (the draw sums its masses in another order).
// Without top_k, every token above the highest of the CTAs' m-th tokens (the cut) is a
// candidate; top_p's target is top_p times the whole row's mass, summed per slice in double
// (within ~1e-7 of kOneCtaPerRow's fixed-point sum); if the tokens above the cut do not reach it
// (and min_p does not drop the cut token either), the last CTA falls back to kOneCtaPerRow's
// selection over the whole row. Rows with neither (top_k off or above the limit, no top_p /
// min_p) take kOneCtaPerRow's path in the slice-0 CTA. Greedy rows: the argmax over the S CTAs.
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

enum class SampleKernel : int32_t {
  kOneCtaPerRow = 0,  // sample.cu; no workspace
  kMultiCta = 1,      // sample_multi_cta.cu; needs SampleParams::multi (else kOneCtaPerRow runs)
};

// Workspace of kMultiCta for up to `batch` rows (sizes from sample_multi_cta_workspace). All or
// none; tickets zero before the first launch (cudaMemset), and every launch leaves them zero (so a
// CUDA graph replays).
struct SampleMultiCtaWorkspace {
  float* cand_z = nullptr;          // [candidates] z of each CTA's top m, in id order
  int32_t* cand_id = nullptr;       // [candidates]
  float* slice_max = nullptr;       // [slices] per CTA: max z (greedy: max logit)
  int32_t* slice_arg = nullptr;     // [slices] greedy: id of the max; else id of the cut token
  float* slice_cut = nullptr;       // [slices] z of the CTA's m-th candidate (the cut token)
  double* slice_mass = nullptr;     // [slices] sum of exp(z - slice max) over the slice
  uint32_t* tickets = nullptr;      // [rows]
  int64_t max_batch = 0;            // the batch the sizes were computed for (launch checks B <= it)
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
  SampleKernel kernel = SampleKernel::kOneCtaPerRow;
  SampleMultiCtaWorkspace multi;         // kMultiCta
};

constexpr int64_t kSampleGreedySplits = 32;

// kMultiCta's shape. CTAs in all (about one per SM of the H200's 132), the smallest slice a CTA
// takes, and the most candidates per CTA: top_k above kSampleMaxTopK (or above a slice) takes
// kOneCtaPerRow's path. Without top_k the CTAs of a row keep about kSampleFilterRowCandidates
// together (kSampleFilterRowCandidates / splits each, at most the candidate limit): a merge of
// that size stays cheap, and the union holds every token above the highest of the CTAs' cut
// tokens (their m-th), typically most of those candidates: far more than top_p 0.95 of an LLM's
// distribution keeps. A row whose kept set reaches below that cut falls back to the whole row.
constexpr int64_t kSampleTargetCtas = 128;
constexpr int64_t kSampleMinSlice = 1024;
constexpr int64_t kSampleMaxTopK = 1024;
constexpr int64_t kSampleFilterRowCandidates = 16384;

// CTAs per row (1: kMultiCta runs kOneCtaPerRow). Host arithmetic, shared with the kernel's launch.
inline int64_t sample_multi_cta_splits(int64_t batch, int64_t vocab) {
  if (batch <= 0 || vocab <= 0) return 1;
  int64_t s = kSampleTargetCtas / batch;
  if (s > vocab / kSampleMinSlice) s = vocab / kSampleMinSlice;
  return s < 2 ? 1 : s;
}
// Candidates a CTA keeps at most: every slice holds at least vocab / splits ids.
inline int64_t sample_multi_cta_candidates(int64_t batch, int64_t vocab) {
  const int64_t s = sample_multi_cta_splits(batch, vocab);
  const int64_t min_slice = vocab / s;
  return min_slice < kSampleMaxTopK ? min_slice : kSampleMaxTopK;
}
struct SampleMultiCtaSizes {
  int64_t candidates = 0;  // cand_z, cand_id elements
  int64_t slices = 0;      // slice_max, slice_arg, slice_cut, slice_mass elements
  int64_t rows = 0;        // tickets
};
// Enough for every batch 1..max_batch (a decode step's batch varies; the workspace is allocated
// once for the largest).
inline SampleMultiCtaSizes sample_multi_cta_workspace(int64_t max_batch, int64_t vocab) {
  SampleMultiCtaSizes z;
  z.rows = max_batch > 0 ? max_batch : 0;
  for (int64_t b = 1; b <= max_batch; ++b) {
    const int64_t s = sample_multi_cta_splits(b, vocab);
    if (s < 2) continue;
    const int64_t c = b * s * sample_multi_cta_candidates(b, vocab);
    const int64_t sl = b * s;
    if (c > z.candidates) z.candidates = c;
    if (sl > z.slices) z.slices = sl;
  }
  return z;
}

// Token ids for every row. No allocation; capturable in a CUDA graph. kMultiCta without a
// workspace (multi.tickets null) or with one CTA per row runs kOneCtaPerRow.
Status launch_sample(const SampleParams& p, CUstream_st* stream);

}  // namespace m3::cuda

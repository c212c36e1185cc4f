// GPU sampling, kMultiCta (see sample.h): each row over `splits` CTAs so that a batch of 1-8 rows
// reads its logits with the whole GPU instead of one SM per row.
//
// Why candidates and not a grid-wide radix select: the row's top m (in the order z desc, id asc)
// is inside the union of every slice's top m, so one pass over the row by all CTAs (each a radix
// select over its slice, from L1 after the first read) shrinks the row to S·m candidates, and the
// last CTA to finish (a ticket, as the greedy split of kOneCtaPerRow) runs kOneCtaPerRow's exact
// selection over them (sample_select.cuh): one launch, no grid barrier (which would need every CTA
// co-resident) and no second kernel. With top_k <= kSampleMaxTopK the kept set is
// kOneCtaPerRow's bit for bit: the same keys, the same tie order (candidates are stored slice by
// slice in id order, so positions order like ids), the same fixed-point masses; the draw sums the
// same float masses in another order, so the token differs only where u is within rounding of a
// cumulative boundary.
// Without top_k, top_p / min_p usually keep a few hundred tokens of an LLM's distribution: the
// CTAs keep kSampleFilterRowCandidates / splits each, plus their slice's max and mass
// (sum exp(z - slice max) in double) so the last CTA knows the whole row's mass, and their cut
// token (the m-th). Every token above the highest cut is a candidate (each slice's tokens above
// it are above that slice's cut); if the kept set can be shown to lie above it
// (sample_select.cuh, `filter`), the candidates decide, else the last CTA runs the selection over
// the whole row (a flat distribution: slower, still right).
#include <cuda_runtime.h>

#include <climits>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/sampling/sample.h"
#include "backend/cuda/sampling/sample_select.cuh"

namespace m3::cuda::sample_detail {
namespace {

__device__ __forceinline__ double block_sum_f64(double v, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  if (lane == 0) sh.dred[warp] = v;
  __syncthreads();
  v = 0.0;
  for (int w = 0; w < kWarps; ++w) v += sh.dred[w];  // fixed order: deterministic
  __syncthreads();
  return v;
}

// This CTA's ticket for row b: true in the last CTA of the row to arrive, which also resets the
// ticket for the next launch. Every thread's global writes before it are visible to that CTA.
__device__ __forceinline__ bool last_to_arrive(uint32_t* tickets, int b, int splits, Smem& sh) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(&tickets[b], 1u) == static_cast<uint32_t>(splits - 1);
    if (last) tickets[b] = 0;  // every CTA of the row has taken its ticket
    sh.last_slice = last;
  }
  __syncthreads();
  const bool last = sh.last_slice;
  if (last) __threadfence();
  return last;
}

// grid (splits, B); cand_stride: candidates per CTA the workspace holds (the row's block is
// splits · cand_stride).
__global__ void __launch_bounds__(kThreads) sample_multi_cta_kernel(SampleParams p, int cand_stride) {
  __shared__ Smem sh;
  const int slice = blockIdx.x, splits = gridDim.x, b = blockIdx.y;
  const int v = static_cast<int>(p.vocab);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* row = p.logits + static_cast<int64_t>(b) * p.ld;
  const SampleRowParams rp = p.rows[b];
  const SampleMultiCtaWorkspace& w = p.multi;
  uint8_t* mask = p.kept_mask ? p.kept_mask + static_cast<int64_t>(b) * p.vocab : nullptr;
  const int lo = static_cast<int>(int64_t{v} * slice / splits);
  const int hi = static_cast<int>(int64_t{v} * (slice + 1) / splits);
  const int64_t at = int64_t{b} * splits + slice;

  if (rp.temperature < 1e-5f) {  // greedy: argmax of the slice, the last CTA reduces the slices
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i0 = lo + tid; i0 < hi; i0 += 4 * kThreads) {
      float x[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = i0 + j * kThreads < hi ? row[i0 + j * kThreads] : 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + j * kThreads;
        if (i < hi && (x[j] > bv || (x[j] == bv && i < bi))) bv = x[j], bi = i;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oi = __shfl_xor_sync(kFull, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == 0) sh.fred[warp] = bv, sh.ired[warp] = bi;
    __syncthreads();
    if (tid == 0) {
      for (int k = 1; k < kWarps; ++k)
        if (sh.fred[k] > bv || (sh.fred[k] == bv && sh.ired[k] < bi)) bv = sh.fred[k], bi = sh.ired[k];
      w.slice_max[at] = bv;
      w.slice_arg[at] = bi;
    }
    if (!last_to_arrive(w.tickets, b, splits, sh)) return;
    if (tid == 0) {
      for (int s = 0; s < splits; ++s) {
        const float ov = __ldcg(w.slice_max + int64_t{b} * splits + s);
        const int oi = __ldcg(w.slice_arg + int64_t{b} * splits + s);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
      }
      sh.found = bi == INT_MAX ? -1 : bi;
      p.out[b] = sh.found;
    }
    __syncthreads();
    if (mask)
      for (int i = tid; i < v; i += kThreads) mask[i] = i == sh.found ? 1 : 0;
    return;
  }

  const float inv_t = 1.0f / rp.temperature;
  const bool k_on = rp.top_k > 0 && rp.top_k < v;
  int m = 0;  // candidates per CTA (0: this row takes kOneCtaPerRow's path)
  bool filter = false;
  if (k_on && rp.top_k <= cand_stride) {
    m = rp.top_k;
  } else if (!k_on && (rp.top_p < 1.0f || rp.min_p > 0.0f)) {
    const int per_cta = max(1, static_cast<int>(kSampleFilterRowCandidates) / splits);
    m = min(cand_stride, per_cta);
    filter = true;
  }
  if (m == 0) {
    if (slice == 0)
      select_and_draw(RowSource{row, inv_t, v}, rp, rp.top_k, false, 0.0, nullptr, 0, mask, p.out + b, sh);
    return;
  }

  // This slice's top m (m <= cand_stride <= the smallest slice), then its max and mass (filter).
  const int len = hi - lo;
  const RowSource mine{row + lo, inv_t, len};
  uint32_t tk = 0;
  int32_t idk = INT_MAX;
  kth_key(mine, static_cast<uint32_t>(m), tk, idk, sh);
  if (filter) {
    float mx = -INFINITY;
    for (int i = tid; i < len; i += kThreads) mx = fmaxf(mx, mine.z(i));
    mx = block_max(mx, sh);
    double mass = 0.0;
    if (mx > -INFINITY)
      for (int i = tid; i < len; i += kThreads) mass += expf(mine.z(i) - mx);
    mass = block_sum_f64(mass, sh);
    if (tid == 0) w.slice_max[at] = mx, w.slice_mass[at] = mass;
  }
  // The candidates in id order: warps own contiguous ranges of the slice, counted, then written
  // at their offsets.
  float* cz = w.cand_z + int64_t{b} * splits * cand_stride + int64_t{slice} * m;
  int32_t* ci = w.cand_id + int64_t{b} * splits * cand_stride + int64_t{slice} * m;
  auto is_cand = [&](int i, uint32_t key) { return key > tk || (key == tk && i <= idk); };
  const int wseg = (len + kWarps - 1) / kWarps;
  const int wlo = warp * wseg, whi = min(len, wlo + wseg);
  int c = 0;
  for (int i = wlo + lane; i < whi; i += 32) c += is_cand(i, key_of(mine.z(i))) ? 1 : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(kFull, c, o);
  if (lane == 0) sh.ired[warp] = c;
  __syncthreads();
  int off = 0;
  for (int k = 0; k < warp; ++k) off += sh.ired[k];
  for (int i0 = wlo; i0 < whi; i0 += 32) {
    const int i = i0 + lane;
    float z = 0.0f;
    bool keep = false;
    if (i < whi) z = mine.z(i), keep = is_cand(i, key_of(z));
    const unsigned bal = __ballot_sync(kFull, keep);
    if (keep) {
      const int at_c = off + __popc(bal & ((1u << lane) - 1u));
      cz[at_c] = z;
      ci[at_c] = lo + i;
    }
    off += __popc(bal);
  }
  if (filter) {  // the cut token: the last candidate (by id) of key tk
    if (tid == 0) sh.last_kept = -1;
    __syncthreads();
    int best = -1;
    for (int i = tid; i < len; i += kThreads) {
      const uint32_t key = key_of(mine.z(i));
      if (key == tk && is_cand(i, key)) best = i;
    }
    if (best >= 0) atomicMax(&sh.last_kept, best);
    __syncthreads();
    if (tid == 0) w.slice_cut[at] = z_of_key(tk), w.slice_arg[at] = lo + sh.last_kept;
  }
  if (mask)  // the last CTA writes the kept candidates over these zeros
    for (int i = lo + tid; i < hi; i += kThreads) mask[i] = 0;
  if (!last_to_arrive(w.tickets, b, splits, sh)) return;

  // The last CTA: the row's mass (filter), then the selection over the candidates.
  double row_total = 0.0;
  float cut_z = 0.0f;
  int32_t cut_id = 0;
  if (filter) {
    if (tid == 0) {
      float mx = -INFINITY;
      for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(w.slice_max + int64_t{b} * splits + s));
      double t = 0.0;
      if (mx > -INFINITY)
        for (int s = 0; s < splits; ++s) {
          const float ms = __ldcg(w.slice_max + int64_t{b} * splits + s);
          if (ms > -INFINITY)
            t += __ldcg(w.slice_mass + int64_t{b} * splits + s) * exp(static_cast<double>(ms) - mx);
        }
      sh.dred[0] = t;
      // The highest cut in the order (z desc, id asc): every token above it is a candidate.
      float cz_best = -INFINITY;
      int32_t cid_best = INT_MAX;
      for (int s = 0; s < splits; ++s) {
        const float cz = __ldcg(w.slice_cut + int64_t{b} * splits + s);
        const int32_t cid = __ldcg(w.slice_arg + int64_t{b} * splits + s);
        const uint32_t kc = key_of(cz), kb = key_of(cz_best);
        if (s == 0 || kc > kb || (kc == kb && cid < cid_best)) cz_best = cz, cid_best = cid;
      }
      sh.fred[0] = cz_best;
      sh.ired[0] = cid_best;
    }
    __syncthreads();
    row_total = sh.dred[0];
    cut_z = sh.fred[0];
    cut_id = sh.ired[0];
    __syncthreads();
  }
  const CandidateSource cands{w.cand_z + int64_t{b} * splits * cand_stride,
                              w.cand_id + int64_t{b} * splits * cand_stride, splits * m};
  if (select_and_draw(cands, rp, m, filter, row_total, filter ? &cut_z : nullptr, cut_id, mask,
                      p.out + b, sh))
    return;
  select_and_draw(RowSource{row, inv_t, v}, rp, rp.top_k, false, 0.0, nullptr, 0, mask, p.out + b, sh);
}

}  // namespace

Status launch_sample_multi_cta(const SampleParams& p, int64_t splits, cudaStream_t stream) {
  const int64_t cand = sample_multi_cta_candidates(p.batch, p.vocab);
  sample_multi_cta_kernel<<<dim3(static_cast<unsigned>(splits), static_cast<unsigned>(p.batch)),
                            kThreads, 0, stream>>>(p, static_cast<int>(cand));
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(sample_multi_cta_kernel);
  return Status::ok();
}

}  // namespace m3::cuda::sample_detail

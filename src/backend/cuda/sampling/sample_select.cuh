// Device-side selection shared by the two sampling kernels (sample.h): the radix selects, the
// draw and the whole per-row pipeline of kOneCtaPerRow, written over a Source of positions
// 0..n-1 whose ids ascend with the position (a whole row: position = id; kMultiCta's candidates:
// each CTA's top m in id order, CTA by CTA). Ties are cut by position, which is cutting by id.
// A Source has n(), z(j) (the temperature-scaled logit, NaN -> -inf, -0 -> +0) and id(j).
#pragma once

#include <cuda_runtime.h>

#include <climits>

#include "backend/cuda/sampling/sample.h"

namespace m3::cuda::sample_detail {

// kMultiCta's launcher (sample_multi_cta.cu); launch_sample (sample.cu) dispatches to it.
Status launch_sample_multi_cta(const SampleParams& p, int64_t splits, cudaStream_t stream);
// kOneCtaPerRow's launcher (sample.cu).
Status launch_sample_one_cta(const SampleParams& p, cudaStream_t stream);

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr uint32_t kNoBin = 0xFFFFFFFFu;

// SplitMix64 and uniform01 exactly as src/sample/rng.h (the CPU sampler's counter-based RNG), so a
// seed draws the same u on both sides.
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ double uniform01(const SampleRowParams& r) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(r.seed) ^ r.stream) ^ r.counter);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// Order-preserving key of a float (larger float -> larger key; -0 < +0, which no logit tie
// between -0 and +0 can notice after the same multiply on both sides).
__device__ __forceinline__ uint32_t key_of(float z) {
  const uint32_t u = __float_as_uint(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float z_of_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

using u64 = unsigned long long;
// Probabilities in fixed point for the top_p select: e = exp(z - max) <= 1 times 2^40 as an
// integer, so bin masses are exact, order-independent integer sums (deterministic; each term is
// within 2^-41 of e, so a sum of 200064 terms is within 1e-7 of the real mass, which is >= 1).
constexpr float kFx = 1099511627776.0f;  // 2^40

struct Smem {
  uint32_t count[256];
  u64 mass[256];
  u64 ured[kWarps];
  double dred[kWarps];
  float fred[kWarps];
  int32_t ired[kWarps];
  int32_t pick_d;
  uint32_t pick_rem;
  u64 pick_above;
  int32_t found;
  int32_t last_kept;
  bool last_slice;
};

__device__ __forceinline__ float block_max(float v, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  if (lane == 0) sh.fred[warp] = v;
  __syncthreads();
  v = sh.fred[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  return v;
}

__device__ __forceinline__ u64 block_sum_u64(u64 v, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  if (lane == 0) sh.ured[warp] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < kWarps; ++w) v += sh.ured[w];
  __syncthreads();
  return v;
}

// Warp 0: the bin d (scanning bins 255 -> 0) at which the running sum of v, started at `above`,
// first reaches `target`; writes d and the running sum before d (bins above d) to shared memory.
// If the target is not reached (top_p mass rounding), the lowest non-empty bin is taken (the CPU
// then keeps every candidate too). cnt tells which bins are non-empty.
template <typename T>
__device__ void pick_desc(const T* v, const uint32_t* cnt, T target, T above, Smem& sh) {
  const int lane = threadIdx.x & 31;
  T loc[8];
  T s = 0;
  uint32_t nonempty = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int bin = 255 - 8 * lane - j;
    loc[j] = v[bin];
    s += loc[j];
    if (cnt[bin] > 0) nonempty |= 1u << j;
  }
  T incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T t = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += t;
  }
  T excl = __shfl_up_sync(kFull, incl, 1);
  if (lane == 0) excl = 0;
  const unsigned hit = __ballot_sync(kFull, above + incl >= target);
  const unsigned any = __ballot_sync(kFull, nonempty != 0);
  const int fl = hit ? __ffs(hit) - 1 : (any ? 31 - __clz(any) : 31);
  if (lane == fl) {
    T acc = above + excl;
    int d = -1, last = -1;
    T acc_last = acc;
    for (int j = 0; j < 8; ++j) {
      if (hit && acc + loc[j] >= target) {
        d = 255 - 8 * lane - j;
        break;
      }
      if (nonempty & (1u << j)) last = 255 - 8 * lane - j, acc_last = acc;
      acc += loc[j];
    }
    if (d < 0) d = last >= 0 ? last : 255 - 8 * lane - 7, acc = acc_last;
    sh.pick_d = d;
    if constexpr (sizeof(T) == 8) {
      sh.pick_above = acc;
    } else {
      sh.pick_rem = static_cast<uint32_t>(target - acc);  // counts: rank left inside bin d
    }
  }
}

// The n-th (1-based) smallest id i < V with pred(i), or INT_MAX when fewer match. Warps own
// contiguous id ranges (coalesced 32-wide chunks inside), their counts are scanned, and the warp
// whose range holds the n-th match walks it.
template <typename Pred>
__device__ int32_t nth_id(int v, uint32_t n, Pred pred, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wseg = (v + kWarps - 1) / kWarps;
  const int lo = warp * wseg, hi = min(v, lo + wseg);
  int c = 0;
  for (int i = lo + lane; i < hi; i += 32) c += pred(i) ? 1 : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(kFull, c, o);
  if (threadIdx.x == 0) sh.found = INT_MAX;
  if (lane == 0) sh.ired[warp] = c;
  __syncthreads();
  uint32_t off = 0;
  for (int w = 0; w < warp; ++w) off += static_cast<uint32_t>(sh.ired[w]);
  if (off < n && n <= off + static_cast<uint32_t>(c)) {
    for (int i0 = lo; i0 < hi; i0 += 32) {
      const int i = i0 + lane;
      const bool m = i < hi && pred(i);
      const unsigned bal = __ballot_sync(kFull, m);
      const uint32_t cnt = static_cast<uint32_t>(__popc(bal));
      if (off + cnt >= n) {  // the (n - off)-th set bit of bal
        const uint32_t r = n - off;
        if (m && static_cast<uint32_t>(__popc(bal & ((2u << lane) - 1u))) == r) sh.found = i;
        break;
      }
      off += cnt;
    }
  }
  __syncthreads();
  const int32_t f = sh.found;
  __syncthreads();
  return f;
}


// A temperature-scaled logit as both kernels compare it: NaN is never kept; -0 becomes +0 so that
// the keys of equal floats are equal (the CPU compares floats: -0 == +0 is a tie broken by id).
__device__ __forceinline__ float norm_z(float x, float inv_t) {
  const float z = x * inv_t;
  return z != z ? -INFINITY : (z == 0.0f ? 0.0f : z);
}

// A row (or a slice of one) of logits: position = id (relative to the slice).
struct RowSource {
  const float* row;
  float inv_t;
  int len;
  __device__ __forceinline__ int n() const { return len; }
  __device__ __forceinline__ float z(int j) const { return norm_z(row[j], inv_t); }
  __device__ __forceinline__ int id(int j) const { return j; }
};

// kMultiCta's candidates, written by other CTAs of this launch: read through L2 (__ldcg).
struct CandidateSource {
  const float* zs;
  const int32_t* ids;
  int len;
  __device__ __forceinline__ int n() const { return len; }
  __device__ __forceinline__ float z(int j) const { return __ldcg(zs + j); }
  __device__ __forceinline__ int id(int j) const { return __ldcg(ids + j); }
};

// The k-th largest key over the source (1 <= k <= n; radix select by counts) and, where more
// tokens share that key than the k-th place leaves room for, the position of the last one kept
// (ties to lower positions); INT_MAX when every token of the key is kept.
template <class Src>
__device__ void kth_key(const Src& src, uint32_t k, uint32_t& tk, int32_t& idk, Smem& sh) {
  const int v = src.n();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0, pmask = 0, rem = k, cnt_eq = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int j = tid; j < 256; j += kThreads) sh.count[j] = 0;
    __syncthreads();
    // Warp-aggregated histogram: logits crowd a few bins (the first digit is the sign and the
    // exponent), where per-lane shared atomics would serialise.
    for (int base = 0; base < v; base += kThreads) {
      const int i = base + tid;
      uint32_t bin = kNoBin;
      if (i < v) {
        const uint32_t key = key_of(src.z(i));
        if ((key & pmask) == prefix) bin = (key >> shift) & 255u;
      }
      const unsigned grp = __match_any_sync(kFull, bin);
      if (bin != kNoBin && lane == __ffs(grp) - 1) atomicAdd(&sh.count[bin], __popc(grp));
    }
    __syncthreads();
    if (warp == 0) pick_desc<uint32_t>(sh.count, sh.count, rem, 0u, sh);
    __syncthreads();
    const uint32_t d = static_cast<uint32_t>(sh.pick_d);
    rem = sh.pick_rem;
    cnt_eq = sh.count[d];
    prefix |= d << shift;
    pmask |= 255u << shift;
    __syncthreads();
  }
  tk = prefix;
  idk = INT_MAX;
  if (cnt_eq > rem) idk = nth_id(v, rem, [&](int i) { return key_of(src.z(i)) == prefix; }, sh);
}

// The whole selection and draw of one row over `src` by the calling CTA (sample.h's semantics):
// max, top_k (k: the count to keep, <= 0 or >= n: all), top_p, min_p, the draw; writes *out (an
// id) and, with a mask, mask[id] for every position of the source.
//
// filter (kMultiCta without top_k): the source holds every token of the row above `cut` (and
// more), `row_total` is the whole row's mass sum exp(z - max), and top_p's target is top_p times
// it. The result is the row's only if the kept set lies above the cut: top_p's target is reached
// there, or min_p drops the cut token. Otherwise nothing is written and false is returned (the
// caller then runs this over the whole row). Uniform over the CTA.
// cut (filter only, else nullptr): top_k's threshold given instead of k, as the token (z, id)
// cut[0], cut_id: the kept set is every token above it in the order (z desc, id asc) and itself.
template <class Src>
__device__ bool select_and_draw(const Src& src, const SampleRowParams& rp, int32_t k, bool filter,
                                double row_total, const float* cut, int32_t cut_id, uint8_t* mask,
                                int32_t* out, Smem& sh) {
  const int v = src.n();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float mx = -INFINITY;
  for (int i = tid; i < v; i += kThreads) mx = fmaxf(mx, src.z(i));
  mx = block_max(mx, sh);
  if (mx == -INFINITY) {  // every logit -inf or NaN: no token
    if (tid == 0) *out = -1;
    if (mask)
      for (int i = tid; i < v; i += kThreads) mask[src.id(i)] = 0;
    return true;
  }
  auto e_of = [&](float z) { return expf(z - mx); };
  auto fx_of = [&](float z) { return __float2ull_rn(e_of(z) * kFx); };

  // top_k: the k-th largest key (radix select by counts), ties at it cut by position.
  const bool use_k = cut != nullptr || (k > 0 && k < v);
  uint32_t tk = 0;
  int32_t idk = INT_MAX;
  if (cut != nullptr) {
    // The given cut as a position: the last one of its key with an id at most cut_id (the cut
    // token itself is in the source).
    tk = key_of(*cut);
    int best = -1;
    for (int i = tid; i < v; i += kThreads)
      if (key_of(src.z(i)) == tk && src.id(i) <= cut_id) best = i;
    if (tid == 0) sh.last_kept = -1;
    __syncthreads();
    if (best >= 0) atomicMax(&sh.last_kept, best);
    __syncthreads();
    idk = sh.last_kept < 0 ? INT_MAX : sh.last_kept;
    __syncthreads();
  } else if (use_k) {
    kth_key(src, static_cast<uint32_t>(k), tk, idk, sh);
  }
  auto kept_k = [&](int i, uint32_t key) {
    return !use_k || key > tk || (key == tk && i <= idk);
  };
  const float min_ratio = rp.min_p > 0.0f ? rp.min_p : 0.0f;
  // filter: min_p alone bounds the kept set when the k-th token is below it (every token outside
  // the top k is at most as large).
  const bool min_p_bounds = use_k && e_of(z_of_key(tk)) < min_ratio;

  // top_p: the key where the descending cumulative mass of the top_k set reaches top_p · total
  // (radix select by masses), ties at it cut by position.
  const bool use_p = rp.top_p < 1.0f;
  if (filter && !use_p && !min_p_bounds) return false;
  uint32_t tp = 0;
  int32_t idp = INT_MAX;
  if (use_p) {
    u64 tot = 0;
    for (int i = tid; i < v; i += kThreads) {
      const float z = src.z(i);
      if (kept_k(i, key_of(z))) tot += fx_of(z);
    }
    tot = block_sum_u64(tot, sh);
    const double total = filter ? row_total * static_cast<double>(kFx) : static_cast<double>(tot);
    const u64 target = static_cast<u64>(ceil(static_cast<double>(rp.top_p) * total));
    // filter: the top k's mass short of the target puts the cut outside them; still right when
    // min_p drops the k-th token (the select then keeps every one of the top k, as the cut past
    // them would, and min_p cuts inside).
    if (filter && tot < target && !min_p_bounds) return false;
    u64 above = 0;
    uint32_t prefix = 0, pmask = 0, cnt_eq = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int j = tid; j < 256; j += kThreads) sh.count[j] = 0, sh.mass[j] = 0;
      __syncthreads();
      // Warp-aggregated: one pair of shared atomics per distinct bin in a warp's 32 elements.
      for (int base = 0; base < v; base += kThreads) {
        const int i = base + tid;
        uint32_t bin = kNoBin;
        u64 fx = 0;
        if (i < v) {
          const float z = src.z(i);
          const uint32_t key = key_of(z);
          if ((key & pmask) == prefix && kept_k(i, key)) bin = (key >> shift) & 255u, fx = fx_of(z);
        }
        unsigned todo = __ballot_sync(kFull, bin != kNoBin);
        while (todo) {
          const int leader = __ffs(todo) - 1;
          const uint32_t lb = __shfl_sync(kFull, bin, leader);
          const bool mine = bin == lb;
          const unsigned m = __ballot_sync(kFull, mine);
          u64 sum = mine ? fx : 0;
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
          if (lane == leader) {
            atomicAdd(&sh.count[lb], static_cast<uint32_t>(__popc(m)));
            atomicAdd(&sh.mass[lb], sum);
          }
          todo &= ~m;
        }
      }
      __syncthreads();
      if (warp == 0) pick_desc<u64>(sh.mass, sh.count, target, above, sh);
      __syncthreads();
      const uint32_t d = static_cast<uint32_t>(sh.pick_d);
      above = sh.pick_above;
      cnt_eq = sh.count[d];
      prefix |= d << shift;
      pmask |= 255u << shift;
      __syncthreads();
    }
    tp = prefix;
    // Tokens of the threshold key (equal z, equal mass e) in ascending position order: the first
    // j whose running mass reaches the target.
    const u64 e_tau = fx_of(z_of_key(tp));
    u64 need = cnt_eq;
    if (e_tau > 0) need = target > above ? (target - above + e_tau - 1) / e_tau : 1;
    need = need < 1 ? 1 : need > cnt_eq ? cnt_eq : need;
    const uint32_t j = static_cast<uint32_t>(need);
    if (cnt_eq > j)
      idp = nth_id(
          v, j,
          [&](int i) { const uint32_t key = key_of(src.z(i)); return key == tp && kept_k(i, key); },
          sh);
  }
  // Final kept set: mass e (0 when dropped).
  auto kept_e = [&](int i) -> float {
    const float z = src.z(i);
    const uint32_t key = key_of(z);
    if (!kept_k(i, key)) return 0.0f;
    if (use_p && !(key > tp || (key == tp && i <= idp))) return 0.0f;
    const float e = e_of(z);
    return e >= min_ratio ? e : 0.0f;
  };

  // The draw: warps own contiguous position ranges; the warp whose range holds u walks it in
  // 32-wide chunks with a warp inclusive scan.
  const int wseg = (v + kWarps - 1) / kWarps;
  const int lo = warp * wseg, hi = min(v, lo + wseg);
  double s = 0.0;
  int last = -1;
  for (int i = lo + lane; i < hi; i += 32) {
    const float e = kept_e(i);
    if (mask) mask[src.id(i)] = e > 0.0f ? 1 : 0;
    if (e > 0.0f) s += e, last = i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(kFull, s, o);
    last = max(last, __shfl_xor_sync(kFull, last, o));
  }
  if (tid == 0) sh.found = INT_MAX, sh.last_kept = -1;
  if (lane == 0) sh.dred[warp] = s;
  __syncthreads();
  if (lane == 0 && last >= 0) atomicMax(&sh.last_kept, last);
  double off = 0.0, total = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) off += sh.dred[w];
    total += sh.dred[w];
  }
  const double u = uniform01(rp) * total;
  if (s > 0.0 && off <= u && u < off + s) {
    bool found = false;
    for (int i0 = lo; i0 < hi; i0 += 32) {
      const int i = i0 + lane;
      const float e = i < hi ? kept_e(i) : 0.0f;
      double incl = e;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += t;
      }
      const unsigned hit = __ballot_sync(kFull, e > 0.0f && off + incl > u);
      if (hit) {
        if (lane == __ffs(hit) - 1) atomicMin(&sh.found, i);
        found = true;
        break;
      }
      off += __shfl_sync(kFull, incl, 31);
    }
    // The walk's sums round differently from s: u past them means this range's last kept token.
    if (!found && lane == 0) atomicMin(&sh.found, last);
  }
  __syncthreads();
  if (tid == 0) {
    // u at or past the summed mass (rounding between the two sums): the last kept token, as the
    // CPU's walk ends there too.
    const int32_t t = sh.found != INT_MAX ? sh.found : sh.last_kept;
    *out = t >= 0 ? src.id(t) : -1;
  }
  __syncthreads();  // sh is reused by the caller (kMultiCta's fallback)
  return true;
}

}  // namespace
}  // namespace m3::cuda::sample_detail

// Device code shared by the routing kernels: the sigmoid top-k of one token row (router_topk.cu,
// moe_route.cu) and the block-wide token-to-expert grouping (gemm/quant_gemv.cu's
// group_by_expert_kernel, moe_route.cu). One copy of each rule, so the fused router
// (launch_moe_route) gives bitwise the outputs of launch_router_topk + launch_group_by_expert.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace m3::cuda::routing {

constexpr int kMaxExperts = 512;  // router_topk / moe_route

// The router logits' summation order (moe_route.h): kDotLanes lanes own the 8-element chunks of K
// round robin; the lane sums are added by a butterfly within each group of 32 lanes, and the
// group sums in group order. moe_route.cu (one lane per thread of a 512-thread CTA) and
// router_logits.cu (one warp per group at a time, the butterfly through shared memory) both
// follow it, so their logits are bitwise equal.
constexpr int kDotLanes = 512;
constexpr int kDotGroups = kDotLanes / 32;

// The router's dot products (moe_route.cu, router_logits.cu). bf16 halves of a 32-bit word as
// float (exact):
__device__ __forceinline__ float bf_lo(uint32_t u) {
  return __uint_as_float(u << 16);
}
__device__ __forceinline__ float bf_hi(uint32_t u) {
  return __uint_as_float(u & 0xffff0000u);
}
__device__ __forceinline__ void unpack8(const uint4 v, float (&f)[8]) {
  f[0] = bf_lo(v.x), f[1] = bf_hi(v.x), f[2] = bf_lo(v.y), f[3] = bf_hi(v.y);
  f[4] = bf_lo(v.z), f[5] = bf_hi(v.z), f[6] = bf_lo(v.w), f[7] = bf_hi(v.w);
}
// acc += Σ_j x[j] · w[j], j = 0..7 in order (fused multiply-adds; x: 8 bf16, w: unpacked).
__device__ __forceinline__ float dot8(float acc, const uint4 x, const float (&w)[8]) {
  acc = fmaf(bf_lo(x.x), w[0], acc);
  acc = fmaf(bf_hi(x.x), w[1], acc);
  acc = fmaf(bf_lo(x.y), w[2], acc);
  acc = fmaf(bf_hi(x.y), w[3], acc);
  acc = fmaf(bf_lo(x.z), w[4], acc);
  acc = fmaf(bf_hi(x.z), w[5], acc);
  acc = fmaf(bf_lo(x.w), w[6], acc);
  acc = fmaf(bf_hi(x.w), w[7], acc);
  return acc;
}

// One 8-element chunk of a router weight row, as loaded (16-byte loads through the read-only
// path), for the bf16 and the float32 weight; unpack_w gives its 8 values as float (exact).
template <typename W>
struct WeightChunk;
template <>
struct WeightChunk<uint16_t> {
  uint4 v;
};
template <>
struct WeightChunk<float> {
  float4 lo, hi;
};
__device__ __forceinline__ WeightChunk<uint16_t> load_w_chunk(const uint16_t* row, int64_t c) {
  return {__ldg(reinterpret_cast<const uint4*>(row + c * 8))};
}
__device__ __forceinline__ WeightChunk<float> load_w_chunk(const float* row, int64_t c) {
  const float4* q = reinterpret_cast<const float4*>(row + c * 8);
  return {__ldg(q), __ldg(q + 1)};
}
__device__ __forceinline__ void unpack_w(const WeightChunk<uint16_t>& w, float (&f)[8]) {
  unpack8(w.v, f);
}
__device__ __forceinline__ void unpack_w(const WeightChunk<float>& w, float (&f)[8]) {
  f[0] = w.lo.x, f[1] = w.lo.y, f[2] = w.lo.z, f[3] = w.lo.w;
  f[4] = w.hi.x, f[5] = w.hi.y, f[6] = w.hi.z, f[7] = w.hi.w;
}

constexpr int kMaxTopK = 16;

// Experts per lane (kPer · 32 >= E) of the smallest top-k instantiation that holds E experts.
// The result does not depend on kPer (experts >= E never compete).
inline constexpr int experts_per_lane(int64_t num_experts) {
  return num_experts <= 128 ? 4 : num_experts <= 256 ? 8 : 16;
}

// Sigmoid top-k of one token row, by one full warp (all 32 lanes call it with the same arguments).
// choice = σ(logit) + bias (bias may be null = 0), k rounds of a warp argmax with ties to the lower
// expert id (NaN never wins); weights renormalise the unbiased σ over the chosen experts in
// selection order, times `scaling`; slots sorted by expert id. `logit_at(e)` reads logit e of the
// row. Lane 0 writes ids[0..top_k), weights[0..top_k) and, when ids_copy is not null, ids_copy too.
template <int kPer, typename LogitAt>
__device__ __forceinline__ void router_topk_row(LogitAt logit_at, const float* bias,
                                                int64_t num_experts, int64_t top_k, float scaling,
                                                int32_t* ids_out, float* weights_out,
                                                int32_t* ids_copy) {
  const int lane = threadIdx.x & 31;
  float sig[kPer], choice[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    if (e < num_experts) {
      sig[j] = 1.0f / __fadd_rn(1.0f, expf(-logit_at(e)));
      choice[j] = bias != nullptr ? __fadd_rn(sig[j], bias[e]) : sig[j];
    } else {
      sig[j] = 0.0f;
      choice[j] = -INFINITY;
    }
  }
  int ids[kMaxTopK];
  float sel_sig[kMaxTopK];
  float denom = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    // Lane-local best (lower id wins ties: ids grow with j), then warp argmax.
    float best = -INFINITY;
    int best_e = 0x7fffffff;
    float best_sig = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = lane + 32 * j;
      if (e < num_experts && (choice[j] > best || (choice[j] == best && e < best_e))) {
        best = choice[j];
        best_e = e;
        best_sig = sig[j];
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      const float os = __shfl_xor_sync(0xffffffffu, best_sig, o);
      if (ob > best || (ob == best && oe < best_e)) {
        best = ob;
        best_e = oe;
        best_sig = os;
      }
    }
    ids[k] = best_e;
    sel_sig[k] = best_sig;
    denom = __fadd_rn(denom, best_sig);
    // The owner lane removes the chosen expert (NaN never wins a comparison).
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (lane + 32 * j == best_e) choice[j] = __int_as_float(0x7fc00000);
  }
  if (lane != 0) return;
  // Insertion sort of the chosen slots by expert id.
  for (int a = 1; a < top_k; ++a) {
    const int e = ids[a];
    const float sg = sel_sig[a];
    int b = a - 1;
    while (b >= 0 && ids[b] > e) {
      ids[b + 1] = ids[b];
      sel_sig[b + 1] = sel_sig[b];
      --b;
    }
    ids[b + 1] = e;
    sel_sig[b + 1] = sg;
  }
  for (int k = 0; k < top_k; ++k) {
    ids_out[k] = ids[k];
    weights_out[k] = __fmul_rn(sel_sig[k] / denom, scaling);
    if (ids_copy != nullptr) ids_copy[k] = ids[k];
  }
}

// Exclusive prefix sums over the block of a pair of ints per thread (thread order), and the block
// totals. Every thread of the block calls it (it holds __syncthreads); blockDim.x is a multiple of
// 32. `warp_sums`: shared scratch of 32 entries, free again when it returns.
__device__ __forceinline__ int2 block_exclusive_scan2(int2 v, int2* warp_sums, int2* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int2 inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, inc.x, o);
    const int b = __shfl_up_sync(0xffffffffu, inc.y, o);
    if (lane >= o) inc.x += a, inc.y += b;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int2 s = lane < nw ? warp_sums[lane] : make_int2(0, 0);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, s.x, o);
      const int b = __shfl_up_sync(0xffffffffu, s.y, o);
      if (lane >= o) s.x += a, s.y += b;
    }
    warp_sums[lane] = s;  // inclusive over warps
  }
  __syncthreads();
  const int2 before = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
  *total = warp_sums[nw - 1];
  __syncthreads();  // warp_sums is free for the caller
  return make_int2(before.x + inc.x - v.x, before.y + inc.y - v.y);
}

// Token-to-expert grouping by one whole block (every thread calls it; blockDim.x a multiple of 32,
// at most 1024): from ids[num_rows] (routed row r = token · K + slot; a generic pointer, global or
// shared, written before the call and visible to the block) builds
//   group_offsets[E + 1]  group g owns sorted_rows[off[g], off[g+1]),
//   sorted_rows[...]      the rows of each expert, ascending,
//   active_groups[min(E, num_rows)]  the experts with rows, ascending, then -1.
// Ids outside [0, E) are dropped (their rows appear nowhere). Under expert parallelism the ids
// are global and the rank holds experts [expert_base, expert_base + E): id - expert_base is the
// group, so a rank groups only its own experts (0 without expert parallelism). Counts are shared-memory atomics
// (integers: the result does not depend on their order), the offsets a block-wide scan, the
// placement a ballot per 32 rows by one warp per expert (ascending rows within an expert).
// `offs`: shared scratch of E + 1 ints; `warp_sums`: shared scratch of 32 int2.
__device__ __forceinline__ void group_by_expert_block(const int32_t* ids, int64_t num_rows,
                                                      int64_t num_experts, int32_t* offs,
                                                      int2* warp_sums, int32_t* group_offsets,
                                                      int32_t* sorted_rows,
                                                      int32_t* active_groups,
                                                      int64_t expert_base = 0) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  for (int64_t e = tid; e <= num_experts; e += nt) offs[e] = 0;
  __syncthreads();
  for (int64_t r = tid; r < num_rows; r += nt) {
    const int64_t e = ids[r] - expert_base;
    if (e >= 0 && e < num_experts) atomicAdd(&offs[e], 1);
  }
  __syncthreads();
  // Each thread scans a contiguous run of experts: (rows, active experts) before it.
  const int64_t per = (num_experts + nt - 1) / nt;
  const int64_t e0 = tid * per < num_experts ? tid * per : num_experts;
  const int64_t e1 = e0 + per < num_experts ? e0 + per : num_experts;
  int2 local = make_int2(0, 0);
  for (int64_t e = e0; e < e1; ++e) {
    local.x += offs[e];
    local.y += offs[e] > 0 ? 1 : 0;
  }
  int2 total;
  const int2 before = block_exclusive_scan2(local, warp_sums, &total);
  int32_t off = before.x, slot = before.y;
  for (int64_t e = e0; e < e1; ++e) {
    const int32_t c = offs[e];
    group_offsets[e] = off;
    offs[e] = off;
    if (c > 0) active_groups[slot++] = static_cast<int32_t>(e);
    off += c;
  }
  if (tid == 0) {
    group_offsets[num_experts] = total.x;
    offs[num_experts] = total.x;
  }
  const int64_t slots = num_experts < num_rows ? num_experts : num_rows;
  for (int64_t i = total.y + tid; i < slots; i += nt) active_groups[i] = -1;
  __syncthreads();
  for (int64_t e = warp; e < num_experts; e += nw) {
    int32_t base = offs[e];
    const int32_t end = offs[e + 1];
    for (int64_t r0 = 0; r0 < num_rows && base < end; r0 += 32) {
      const bool hit = r0 + lane < num_rows && ids[r0 + lane] - expert_base == e;
      const uint32_t mask = __ballot_sync(0xffffffffu, hit);
      if (hit)
        sorted_rows[base + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(r0 + lane);
      base += __popc(mask);
    }
  }
}

}  // namespace m3::cuda::routing

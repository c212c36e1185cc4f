// The merge of a head's partial decode-attention states, shared by the combine kernel
// (sparse_decode.cu: states from global memory) and the clustered tensor-core split kernel
// (sparse_decode_mma.cu: states pushed into the head's CTA by the cluster), so that both give
// the same bits. CUDA translation units only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/runtime/reduce.cuh"
#include "core/dtype.h"

namespace m3::cuda::decode_combine {

constexpr int kThreads = 128, kD = 128;
constexpr int kCombineChunk = 1024;
constexpr int kPreSlots = 64;

// Maximum over the CTA (kThreads), every thread gets it; `red` holds kThreads / 32 floats.
__device__ __forceinline__ float cta_max(float v, float* red) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, red[w]);
  return v;
}

// One CTA of kThreads merges a head's `slots` partial states (ml_at(i): float2 (max m_i, sum
// l_i); o_at(i): the float4 of the unnormalised P·V at dims 4·lane .. 4·lane + 3) into out[tid]
// (bf16): the maximum over the slots, each slot's weight exp(m_i - m) once into shared memory (a
// chunk at a time), then warp w sums slots w, w + 4, ... for 4 dims per lane (16-byte loads, 8 in
// flight), and the four warp sums are added in a fixed order. Skipped slots (m_i = -inf, weight
// 0) are read only where their row is requested early (up to kPreSlots slots) and then replaced
// by 0; a head with no allowed key in any slot outputs zeros.
template <typename MlAt, typename OAt>
__device__ __forceinline__ void combine_head(int64_t slots, MlAt ml_at, OAt o_at, uint16_t* out) {
  __shared__ float s_w[kCombineChunk];
  __shared__ __align__(16) float s_num[kThreads / 32][kD];
  __shared__ float s_red[32], s_mred[kThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Up to kPreSlots states (batch 1-4 with 4 key splits: 64): this warp's o rows are requested
  // now, with the statistics, instead of after the maximum and the weights (one memory latency
  // less). A skipped state's row was never written: it is loaded but replaced by 0 below.
  constexpr int kPre = kPreSlots / (kThreads / 32);
  float4 pre[kPre];
  const bool preloaded = slots <= kPreSlots;
  if (preloaded) {
#pragma unroll
    for (int j = 0; j < kPre; ++j) {
      const int64_t i = warp + j * (kThreads / 32);
      pre[j] = i < slots ? o_at(i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  float m = -INFINITY;
  for (int64_t i = tid; i < slots; i += kThreads) m = fmaxf(m, ml_at(i).x);
  m = cta_max(m, s_mred);
  if (m == -INFINITY) {  // uniform: no allowed key in any slot
    out[tid] = 0;
    return;
  }
  float den = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int64_t c0 = 0; c0 < slots; c0 += kCombineChunk) {
    const int n = static_cast<int>(slots - c0 < kCombineChunk ? slots - c0 : kCombineChunk);
    for (int i = tid; i < n; i += kThreads) {
      const float2 x = ml_at(c0 + i);
      const float w = x.x == -INFINITY ? 0.0f : expf(x.x - m);
      s_w[i] = w;
      den = fmaf(x.y, w, den);
    }
    __syncthreads();
    if (preloaded) {  // one chunk (slots <= kPreSlots < kCombineChunk): the same sums in order
#pragma unroll
      for (int j = 0; j < kPre; ++j) {
        const int i = warp + j * (kThreads / 32);
        if (i < n) {
          const float w = s_w[i];
          const float4 x = w != 0.0f ? pre[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          acc.x = fmaf(x.x, w, acc.x), acc.y = fmaf(x.y, w, acc.y);
          acc.z = fmaf(x.z, w, acc.z), acc.w = fmaf(x.w, w, acc.w);
        }
      }
      continue;  // no second chunk: n == slots
    }
#pragma unroll 8
    for (int i = warp; i < n; i += kThreads / 32) {
      // w = 0: a skipped slot (never written) or an underflowed weight (adds nothing).
      const float w = s_w[i];
      const float4 x = w != 0.0f ? o_at(c0 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      acc.x = fmaf(x.x, w, acc.x), acc.y = fmaf(x.y, w, acc.y);
      acc.z = fmaf(x.z, w, acc.z), acc.w = fmaf(x.w, w, acc.w);
    }
    __syncthreads();  // s_w is rewritten by the next chunk
  }
  *reinterpret_cast<float4*>(&s_num[warp][4 * lane]) = acc;
  den = block_sum(den, s_red);  // synchronises: s_num is complete
  float num = s_num[0][tid];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) num += s_num[w][tid];
  out[tid] = f32_to_bf16(num / den);
}

}  // namespace m3::cuda::decode_combine

#include "backend/cuda/dspark/markov.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerCta = kThreads / 32;

__global__ void __launch_bounds__(kThreads) dspark_markov_kernel(DSparkMarkovParams p) {
  extern __shared__ float w1_row[];  // [r]
  const int64_t prev = p.prev_device != nullptr ? *p.prev_device : p.prev;
  if (prev < 0 || prev >= p.vocab) return;  // checked on the host for a host prev
  for (int64_t i = threadIdx.x; i < p.rank; i += kThreads) w1_row[i] = bf16_to_f32(p.w1[prev * p.rank + i]);
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (v >= p.vocab) return;
  const uint16_t* row = p.w2 + v * p.rank;
  float acc = 0.0f;
  for (int64_t i = lane; i < p.rank; i += 32) acc += bf16_to_f32(row[i]) * w1_row[i];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) p.logits[v] += acc;
}

constexpr int kArgmaxThreads = 1024;

// (value, index) with the larger value first, the lower index on equal values.
__device__ inline bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kArgmaxThreads)
    dspark_argmax_kernel(const float* logits, int64_t vocab, int32_t* token) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int64_t si[kArgmaxThreads / 32];
  float bv = -INFINITY;
  int64_t bi = vocab;  // none yet: loses every tie against a real index
  for (int64_t i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
    const float v = logits[i];
    if (better(v, i, bv, bi)) {  // false for NaN
      bv = v;
      bi = i;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      if (better(sv[w], si[w], bv, bi)) {
        bv = sv[w];
        bi = si[w];
      }
    }
    *token = static_cast<int32_t>(bi < vocab ? bi : 0);
  }
}

}  // namespace

Status launch_dspark_argmax(const float* logits, int64_t vocab, int32_t* token,
                            CUstream_st* stream) {
  if (logits == nullptr || token == nullptr || vocab <= 0 || vocab > INT32_MAX)
    return invalid_argument("[cuda.dspark.markov] argmax: logits, a token and a vocabulary in "
                            "[1, 2^31) are needed, got " + std::to_string(vocab));
  dspark_argmax_kernel<<<1, kArgmaxThreads, 0, stream>>>(logits, vocab, token);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_argmax_kernel);
  return Status::ok();
}

Status launch_dspark_markov(const DSparkMarkovParams& p, CUstream_st* stream) {
  const std::string who = "[cuda.dspark.markov] ";
  if (p.logits == nullptr || p.w1 == nullptr || p.w2 == nullptr || p.vocab <= 0 || p.rank <= 0)
    return invalid_argument(who + "logits, both tables, a positive vocabulary and rank are needed");
  if (p.prev_device == nullptr && (p.prev < 0 || p.prev >= p.vocab))
    return invalid_argument(who + "previous token " + std::to_string(p.prev) +
                            " outside the vocabulary [0, " + std::to_string(p.vocab) + ")");
  const int64_t smem = p.rank * static_cast<int64_t>(sizeof(float));
  if (smem > 48 * 1024) return invalid_argument(who + "rank " + std::to_string(p.rank) + " above 12288");
  const auto blocks = static_cast<unsigned>((p.vocab + kRowsPerCta - 1) / kRowsPerCta);
  dspark_markov_kernel<<<blocks, kThreads, static_cast<size_t>(smem), stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_markov_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

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

// Row v of markov_w2 is read once for all num_rows sequences: each warp keeps a sum per row.
__global__ void __launch_bounds__(kThreads) dspark_markov_kernel(DSparkMarkovParams p) {
  extern __shared__ float w1_rows[];  // [num_rows, r]
  const int64_t nr = p.num_rows, ld = p.ld_logits > 0 ? p.ld_logits : p.vocab;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t prev = p.prev_device != nullptr ? p.prev_device[r * p.prev_stride] : p.prev;
    // Checked on the host for a host prev; a device prev outside [0, V) (never an argmax's)
    // leaves its row uncorrected.
    const bool ok = prev >= 0 && prev < p.vocab;
    for (int64_t i = threadIdx.x; i < p.rank; i += kThreads)
      w1_rows[r * p.rank + i] = ok ? bf16_to_f32(p.w1[prev * p.rank + i]) : 0.0f;
  }
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (v >= p.vocab) return;
  const uint16_t* row = p.w2 + v * p.rank;
  float acc[kDSparkMarkovMaxRows];
#pragma unroll
  for (int r = 0; r < kDSparkMarkovMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t i = lane; i < p.rank; i += 32) {
    const float w = bf16_to_f32(row[i]);
#pragma unroll
    for (int r = 0; r < kDSparkMarkovMaxRows; ++r) {
      if (r < nr) acc[r] += w * w1_rows[r * p.rank + i];
    }
  }
#pragma unroll
  for (int r = 0; r < kDSparkMarkovMaxRows; ++r) {
    if (r < nr) {
      float a = acc[r];
      for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0) p.logits[r * ld + v] += a;
    }
  }
}

constexpr int kArgmaxThreads = 1024;

// (value, index) with the larger value first, the lower index on equal values.
__device__ inline bool better(float v, int64_t i, float bv, int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void __launch_bounds__(kArgmaxThreads)
    dspark_argmax_kernel(const float* logits, int64_t vocab, int64_t ld, int32_t* token,
                         int64_t token_stride) {
  logits += static_cast<int64_t>(blockIdx.x) * ld;
  token += static_cast<int64_t>(blockIdx.x) * token_stride;
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
                            CUstream_st* stream, int64_t num_rows, int64_t ld_logits,
                            int64_t token_stride) {
  if (logits == nullptr || token == nullptr || vocab <= 0 || vocab > INT32_MAX ||
      num_rows <= 0 || num_rows > 65535 || ld_logits < 0)
    return invalid_argument("[cuda.dspark.markov] argmax: logits, a token, a vocabulary in "
                            "[1, 2^31) and 1..65535 rows are needed, got vocabulary " +
                            std::to_string(vocab) + ", " + std::to_string(num_rows) + " rows");
  dspark_argmax_kernel<<<static_cast<unsigned>(num_rows), kArgmaxThreads, 0, stream>>>(
      logits, vocab, ld_logits > 0 ? ld_logits : vocab, token, token_stride);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_argmax_kernel);
  return Status::ok();
}

Status launch_dspark_markov(const DSparkMarkovParams& p, CUstream_st* stream) {
  const std::string who = "[cuda.dspark.markov] ";
  if (p.logits == nullptr || p.w1 == nullptr || p.w2 == nullptr || p.vocab <= 0 || p.rank <= 0)
    return invalid_argument(who + "logits, both tables, a positive vocabulary and rank are needed");
  if (p.num_rows < 1 || p.num_rows > kDSparkMarkovMaxRows || p.ld_logits < 0)
    return invalid_argument(who + std::to_string(p.num_rows) + " rows: 1.." +
                            std::to_string(kDSparkMarkovMaxRows) + " per launch");
  if (p.prev_device == nullptr && p.num_rows != 1)
    return invalid_argument(who + "several rows need their previous tokens on the device");
  if (p.prev_device == nullptr && (p.prev < 0 || p.prev >= p.vocab))
    return invalid_argument(who + "previous token " + std::to_string(p.prev) +
                            " outside the vocabulary [0, " + std::to_string(p.vocab) + ")");
  const int64_t smem = p.num_rows * p.rank * static_cast<int64_t>(sizeof(float));
  if (smem > 48 * 1024)
    return invalid_argument(who + "rank " + std::to_string(p.rank) + " at " +
                            std::to_string(p.num_rows) + " rows is above 48 KB of shared memory");
  const auto blocks = static_cast<unsigned>((p.vocab + kRowsPerCta - 1) / kRowsPerCta);
  dspark_markov_kernel<<<blocks, kThreads, static_cast<size_t>(smem), stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(dspark_markov_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

#include "backend/cuda/dspark/markov.h"

#include <algorithm>
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

}  // namespace

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

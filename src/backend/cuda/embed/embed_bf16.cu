#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/embed/embed_bf16.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 4;  // 16-byte pieces per thread whose loads are in flight together

// One CTA per token. With vec (dim % 8 == 0, table and out 16-byte aligned) each thread loads up
// to kBatch pieces of 8 bf16 before it stores any: one memory latency per 8K elements. The plain
// per-element loop paid one latency per element per thread (its stores may alias the table for
// the compiler): 10 us for one 6144-wide row at the start of every decode step (H200 CUPTI
// trace).
__global__ void __launch_bounds__(kThreads) embed_bf16_kernel(EmbedBf16Params p, bool vec) {
  const int64_t row = blockIdx.x;
  const int64_t id = static_cast<int64_t>(p.ids[row]) - p.first_id;
  float* __restrict__ out = p.out + row * p.dim;
  if (id < 0 || id >= p.vocab) {
    for (int64_t i = threadIdx.x; i < p.dim; i += kThreads) out[i] = 0.0f;
    return;
  }
  const uint16_t* __restrict__ src = p.table + id * p.dim;
  if (!vec) {
    for (int64_t i = threadIdx.x; i < p.dim; i += kThreads)
      out[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
    return;
  }
  const uint4* __restrict__ src8 = reinterpret_cast<const uint4*>(src);
  float4* __restrict__ out4 = reinterpret_cast<float4*>(out);
  const int64_t pieces = p.dim / 8;
  for (int64_t base = threadIdx.x; base < pieces; base += int64_t{kThreads} * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      if (base + j * kThreads < pieces) v[j] = __ldg(src8 + base + j * kThreads);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = base + j * kThreads;
      if (i >= pieces) break;
      const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
      float f[8];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        f[2 * e] = __uint_as_float(w[e] << 16), f[2 * e + 1] = __uint_as_float(w[e] & 0xFFFF0000u);
      out4[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      out4[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
  }
}

}  // namespace

Status launch_embed_bf16(const EmbedBf16Params& p, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  if (p.t < 0 || p.t > INT_MAX || p.dim <= 0 || p.vocab <= 0 || p.first_id < 0 || !p.table ||
      !p.ids || !p.out)
    return invalid_argument("[cuda.embed_bf16] bad shape: t " + std::to_string(p.t) +
                            ", dim " + std::to_string(p.dim) + ", ids " +
                            std::to_string(p.first_id) + " + " + std::to_string(p.vocab));
  const bool vec = p.dim % 8 == 0 && (reinterpret_cast<uintptr_t>(p.table) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(p.out) & 15) == 0;
  embed_bf16_kernel<<<static_cast<unsigned>(p.t), kThreads, 0, stream>>>(p, vec);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(embed_bf16_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "backend/cuda/runtime/cuda_check.h"
#include "model/minimax_m3_cuda/embed_bf16.h"

namespace m3::minimax_m3 {
namespace {

__global__ void embed_bf16_kernel(EmbedBf16Params p) {
  const int64_t row = blockIdx.x;
  const int32_t id = p.ids[row];
  float* out = p.out + row * p.dim;
  if (id < 0 || id >= p.vocab) {
    for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) out[i] = 0.0f;
    return;
  }
  const uint16_t* src = p.table + static_cast<int64_t>(id) * p.dim;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x)
    out[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

}  // namespace

Status launch_embed_bf16(const EmbedBf16Params& p, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  if (p.t < 0 || p.t > INT_MAX || p.dim <= 0 || p.vocab <= 0 || !p.table || !p.ids || !p.out)
    return invalid_argument("[model.minimax_m3_cuda.embed] bad shape: t " + std::to_string(p.t) +
                            ", dim " + std::to_string(p.dim));
  embed_bf16_kernel<<<static_cast<unsigned>(p.t), 256, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(embed_bf16_kernel);
  return Status::ok();
}

}  // namespace m3::minimax_m3

// SwiGLU-OAI (float32): out = min(g, L)·σ(α·min(g, L))·(clamp(u, -L, L) + 1).
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

__global__ void swiglu_oai_kernel(SwigluOaiParams p) {
  const int64_t n = p.m * p.inter;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / p.inter, c = i % p.inter;
    const float g = p.gate_up[r * 2 * p.inter + c];
    const float u = p.gate_up[r * 2 * p.inter + p.inter + c];
    const float gc = fminf(g, p.limit);
    const float uc = fminf(fmaxf(u, -p.limit), p.limit);
    const float sig = 1.0f / __fadd_rn(1.0f, expf(-__fmul_rn(gc, p.alpha)));
    p.out[i] = __fmul_rn(__fadd_rn(uc, 1.0f), __fmul_rn(gc, sig));
  }
}

}  // namespace

Status launch_swiglu_oai(const SwigluOaiParams& p, cudaStream_t s) {
  const int64_t n = p.m * p.inter;
  if (n == 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  swiglu_oai_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(swiglu_oai_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

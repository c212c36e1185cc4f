// Gemma RMSNorm (float32) and the residual add of the correctness path.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

// One block per row. The sum of squares is accumulated in float32 (the CPU reference uses
// double; the op test's tolerance accounts for the difference).
__global__ void rms_norm_kernel(RmsNormParams p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.dim;
  float* y = p.y + r * p.dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float scale = p.unit_offset ? __fadd_rn(1.0f, p.w[i]) : p.w[i];
    y[i] = __fmul_rn(__fmul_rn(x[i], inv), scale);
  }
}

__global__ void add_kernel(AddParams p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < p.n;
       i += int64_t{gridDim.x} * blockDim.x)
    p.y[i] = __fadd_rn(p.a[i], p.b[i]);
}

}  // namespace

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t s) {
  if (p.rows == 0) return Status::ok();
  const int threads = p.dim >= 1024 ? 256 : 128;
  rms_norm_kernel<<<static_cast<unsigned>(p.rows), threads, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(rms_norm_kernel);
  return Status::ok();
}

Status launch_add(const AddParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((p.n + 255) / 256, 4096);
  add_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(add_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

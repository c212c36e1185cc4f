// The vision tower's LayerNorm and GEMM epilogues (bias, exact GELU, bf16 rounding).
#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"
#include "backend/cuda/vision/vision_kernels.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

// One block per row; mean, then the variance around it (the CPU tower's two passes).
__global__ void layer_norm_kernel(VisionLayerNormParams p) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.dim;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) s += x[i];
  const float mean = block_sum(s, red) / static_cast<float>(p.dim);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float d = x[i] - mean;
    v = fmaf(d, d, v);
  }
  const float var = block_sum(v, red) / static_cast<float>(p.dim);
  const float inv = 1.0f / sqrtf(var + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    const float y = (x[i] - mean) * inv * p.w[i] + p.b[i];
    if (p.y_bf16 != nullptr) p.y_bf16[r * p.dim + i] = f32_to_bf16(y);
    if (p.y_f32 != nullptr) p.y_f32[r * p.dim + i] = y;
  }
}

__global__ void bias_act_kernel(const float* y, const float* bias, int64_t rows, int64_t cols,
                                bool gelu, uint16_t* out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = y[i] + bias[i % cols];
    if (gelu) v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    out[i] = f32_to_bf16(v);
  }
}

__global__ void add_bias_kernel(float* x, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] += bias[i % cols];
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

}  // namespace

Status launch_vision_layer_norm(const VisionLayerNormParams& p, CUstream_st* stream) {
  if (p.rows == 0) return Status::ok();
  if (p.x == nullptr || p.w == nullptr || p.b == nullptr || p.dim < 1)
    return invalid_argument("[cuda.vision_layer_norm] null input or empty row");
  layer_norm_kernel<<<static_cast<unsigned>(p.rows), p.dim >= 1024 ? 256 : 128, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(layer_norm_kernel);
  return Status::ok();
}

Status launch_vision_bias_act_bf16(const float* y, const float* bias, int64_t rows, int64_t cols,
                                   bool gelu, uint16_t* out, CUstream_st* stream) {
  if (rows * cols == 0) return Status::ok();
  bias_act_kernel<<<grid_for(rows * cols), 256, 0, stream>>>(y, bias, rows, cols, gelu, out);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(bias_act_kernel);
  return Status::ok();
}

Status launch_vision_add_bias(float* x, const float* bias, int64_t rows, int64_t cols,
                              CUstream_st* stream) {
  if (rows * cols == 0) return Status::ok();
  add_bias_kernel<<<grid_for(rows * cols), 256, 0, stream>>>(x, bias, rows, cols);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(add_bias_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

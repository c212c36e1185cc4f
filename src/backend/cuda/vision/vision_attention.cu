// The vision tower's attention inputs (bias + 3-D RoPE + the per-image K / V^T layouts) and the
// row softmax between its two GEMMs (S = Q · K^T, O = P · V, both cuBLASLt bf16).
#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"
#include "backend/cuda/vision/vision_kernels.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

// One block per (patch, head), one thread per head dim. RoPE as the CPU tower: for i < half,
// out[i] = a·cos - b·sin and out[i + half] = b·cos + a·sin with a = x[i], b = x[i + half].
__global__ void qkv_kernel(VisionQkvParams p) {
  const int64_t row = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int64_t d = threadIdx.x, D = p.head_dim, H = p.heads * D, half = p.rope_half;
  if (d >= D) return;
  const float* src = p.qkv + row * 3 * H + h * D;
  const float* bias = p.bias + h * D;
  auto rotated = [&](int64_t part) {  // part 0 = q, 1 = k
    const float* x = src + part * H;
    const float* bx = bias + part * H;
    const float v = x[d] + bx[d];
    if (d < half) {
      const float b = x[d + half] + bx[d + half];
      return v * p.rope_cos[row * half + d] - b * p.rope_sin[row * half + d];
    }
    if (d < 2 * half) {
      const int64_t i = d - half;
      const float a = x[i] + bx[i];
      return v * p.rope_cos[row * half + i] + a * p.rope_sin[row * half + i];
    }
    return v;
  };
  const int32_t img = p.patch_image[row];
  const int64_t j = row - p.image_start[img], keys = p.image_keys[img], kv = p.image_kv[img];
  p.q[row * H + h * D + d] = f32_to_bf16(rotated(0));
  p.k[kv + (h * keys + j) * D + d] = f32_to_bf16(rotated(1));
  p.vt[kv + (h * D + d) * keys + j] = f32_to_bf16(src[2 * H + d] + bias[2 * H + d]);
}

// One block per row: max, sum of exponentials, then the probabilities (the CPU tower's order:
// e_j = exp(scale·s_j - max), p_j = e_j / sum).
__global__ void softmax_kernel(const float* s, int64_t cols, int64_t ld, float scale,
                               uint16_t* p) {
  __shared__ float red[32];
  const float* row = s + blockIdx.x * ld;
  uint16_t* out = p + blockIdx.x * ld;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, row[j] * scale);
  mx = block_max(mx, red);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(row[j] * scale - mx);
  sum = block_sum(sum, red);
  for (int64_t j = threadIdx.x; j < ld; j += blockDim.x)
    out[j] = j < cols ? f32_to_bf16(expf(row[j] * scale - mx) / sum) : uint16_t{0};
}

}  // namespace

Status launch_vision_qkv(const VisionQkvParams& p, CUstream_st* stream) {
  if (p.n == 0) return Status::ok();
  if (p.head_dim < 1 || p.head_dim > 1024 || 2 * p.rope_half > p.head_dim)
    return invalid_argument("[cuda.vision_qkv] head_dim " + std::to_string(p.head_dim) +
                            " with rope_half " + std::to_string(p.rope_half));
  const unsigned threads = static_cast<unsigned>((p.head_dim + 31) / 32 * 32);
  qkv_kernel<<<static_cast<unsigned>(p.n * p.heads), threads, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(qkv_kernel);
  return Status::ok();
}

Status launch_vision_softmax_bf16(const float* s, int64_t rows, int64_t cols, int64_t ld,
                                  float scale, uint16_t* p, CUstream_st* stream) {
  if (rows == 0) return Status::ok();
  if (cols < 1 || ld < cols)
    return invalid_argument("[cuda.vision_softmax] cols " + std::to_string(cols) + ", ld " +
                            std::to_string(ld));
  softmax_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(s, cols, ld, scale, p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(softmax_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

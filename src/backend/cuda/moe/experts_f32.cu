// Routed experts (float32 correctness path): per (token, slot) row, act = SwiGLU-OAI(x·W13[e]^T),
// contrib = act·W2[e]^T, then out[t] = Σ_slots weight·contrib in ascending slot order (the CPU
// reference's order). One warp per output element; the real-shape path uses the quantised
// grouped kernels instead (gemm/).
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/reduce.cuh"

namespace m3::cuda {
namespace {

__device__ __forceinline__ float warp_dot(const float* a, const float* b, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t i = lane; i < n; i += 32) acc = fmaf(a[i], b[i], acc);
  return warp_sum(acc);
}

// grid.x = M·K rows, grid.y covers I with 8 warps per block.
__global__ void experts_up_kernel(MoeExpertsParams p, const float* const* w13, float* act) {
  const int64_t row = blockIdx.x;  // t·K + slot
  const int64_t i = blockIdx.y * int64_t{8} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= p.inter) return;
  const int32_t e = p.topk_ids[row];
  if (e < 0 || e >= p.num_experts) return;
  const float* x = p.x + (row / p.top_k) * p.hidden;
  const float* w = w13[e];
  const float g = warp_dot(x, w + i * p.hidden, p.hidden, lane);
  const float u = warp_dot(x, w + (p.inter + i) * p.hidden, p.hidden, lane);
  if (lane == 0) {
    const float gc = fminf(g, p.limit);
    const float uc = fminf(fmaxf(u, -p.limit), p.limit);
    const float sig = 1.0f / __fadd_rn(1.0f, expf(-__fmul_rn(gc, p.alpha)));
    act[row * p.inter + i] = __fmul_rn(__fadd_rn(uc, 1.0f), __fmul_rn(gc, sig));
  }
}

__global__ void experts_down_kernel(MoeExpertsParams p, const float* const* w2, const float* act,
                                    float* contrib) {
  const int64_t row = blockIdx.x;
  const int64_t j = blockIdx.y * int64_t{8} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (j >= p.hidden) return;
  const int32_t e = p.topk_ids[row];
  if (e < 0 || e >= p.num_experts) return;
  const float y = warp_dot(act + row * p.inter, w2[e] + j * p.inter, p.inter, lane);
  if (lane == 0) contrib[row * p.hidden + j] = y;
}

__global__ void experts_combine_kernel(MoeExpertsParams p, const float* contrib) {
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    float o = 0.0f;
    for (int64_t s = 0; s < p.top_k; ++s) {
      const float c = __fmul_rn(contrib[(t * p.top_k + s) * p.hidden + j],
                                p.topk_weights[t * p.top_k + s]);
      o = s == 0 ? c : __fadd_rn(o, c);
    }
    p.out[t * p.hidden + j] = o;
  }
}

}  // namespace

Status launch_moe_experts(const MoeExpertsParams& p, const float* const* w13_dev,
                          const float* const* w2_dev, float* act, float* contrib,
                          cudaStream_t s) {
  if (p.m == 0) return Status::ok();
  const int64_t rows = p.m * p.top_k;
  dim3 up(static_cast<unsigned>(rows), static_cast<unsigned>((p.inter + 7) / 8));
  experts_up_kernel<<<up, 256, 0, s>>>(p, w13_dev, act);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(experts_up_kernel);
  dim3 down(static_cast<unsigned>(rows), static_cast<unsigned>((p.hidden + 7) / 8));
  experts_down_kernel<<<down, 256, 0, s>>>(p, w2_dev, act, contrib);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(experts_down_kernel);
  experts_combine_kernel<<<static_cast<unsigned>(p.m), 256, 0, s>>>(p, contrib);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(experts_combine_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

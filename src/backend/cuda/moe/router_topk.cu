// Sigmoid top-k router (float32): the same selection rule, tie-break and weight formula as the
// CPU reference (choice = σ(logit) + bias, ties to the lower expert id; weights renormalise the
// unbiased σ over the chosen experts in selection order, times the scaling factor; slots sorted
// by expert id). The rule itself is routing::router_topk_row (moe/routing_device.cuh), shared
// with the fused router launch_moe_route.
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

// One warp per token row: each lane owns experts lane, lane + 32, ... (kPer of them).
template <int kPer>
__global__ void router_topk_kernel(RouterTopkParams p) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (r >= p.m) return;
  const float* l = p.logits + r * p.num_experts;
  routing::router_topk_row<kPer>([l](int e) { return l[e]; }, p.bias, p.num_experts, p.top_k,
                                 p.scaling, p.topk_ids + r * p.top_k, p.topk_weights + r * p.top_k,
                                 nullptr);
}

}  // namespace

Status launch_router_topk(const RouterTopkParams& p, cudaStream_t s) {
  if (p.m == 0) return Status::ok();
  if (p.num_experts <= 0 || p.num_experts > routing::kMaxExperts || p.top_k <= 0 ||
      p.top_k > routing::kMaxTopK || p.top_k > p.num_experts)
    return invalid_argument("[cuda.router_topk] unsupported num_experts " +
                            std::to_string(p.num_experts) + " / top_k " + std::to_string(p.top_k));
  constexpr int kWarps = 4;
  const dim3 grid(static_cast<unsigned>((p.m + kWarps - 1) / kWarps));
  switch (routing::experts_per_lane(p.num_experts)) {
    case 4:
      router_topk_kernel<4><<<grid, 32 * kWarps, 0, s>>>(p);
      break;
    case 8:
      router_topk_kernel<8><<<grid, 32 * kWarps, 0, s>>>(p);
      break;
    default:
      router_topk_kernel<16><<<grid, 32 * kWarps, 0, s>>>(p);
      break;
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(router_topk_kernel<16>);
  return Status::ok();
}

}  // namespace m3::cuda

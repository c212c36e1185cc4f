#include "backend/cuda/moe/moe_combine.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

__global__ void moe_combine_kernel(MoeCombineParams p) {
  const int64_t t = blockIdx.y;
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= p.hidden) return;
  float o = 0.0f;
  bool first = true;
  for (int64_t s = 0; s < p.top_k; ++s) {
    if (p.topk_ids != nullptr) {
      const int64_t e = p.topk_ids[t * p.top_k + s];
      if (e < p.expert_begin || e >= p.expert_end) continue;  // another rank's expert
    }
    const float c = __fmul_rn(p.contrib[(t * p.top_k + s) * p.hidden + j],
                              p.topk_weights[t * p.top_k + s]);
    o = first ? c : __fadd_rn(o, c);
    first = false;
  }
  if (p.shared != nullptr) {
    const float sh = p.shared[t * p.hidden + j];
    o = first ? sh : __fadd_rn(o, sh);
  }
  p.out[t * p.hidden + j] = o;
}

}  // namespace

Status launch_moe_combine(const MoeCombineParams& p, CUstream_st* stream) {
  if (p.t == 0) return Status::ok();
  dim3 grid(static_cast<unsigned>((p.hidden + 255) / 256), static_cast<unsigned>(p.t));
  moe_combine_kernel<<<grid, 256, 0, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(moe_combine_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

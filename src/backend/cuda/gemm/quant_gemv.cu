// Dispatch of the decode GEMV kernels, their split-K epilogue (fixed-order slice sum; float32
// store or SwiGLU-OAI to bf16) and the token-to-expert grouping.
#include "backend/cuda/gemm/gemv_plan.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "core/dtype.h"

#include <algorithm>
#include <cmath>

namespace m3::cuda {

Status launch_quant_gemv(const QuantGemvParams& p, CUstream_st* stream) {
  if (p.num_rows == 0 || p.n == 0) return Status::ok();
  if (p.kernel == GemvKernel::kMmaRing) return gemv::launch_mma_ring(p, stream);
  if (p.token_topk_ids != nullptr)
    return invalid_argument("[cuda.quant_gemv] token_topk_ids is read by kMmaRing only");
  if (p.kernel == GemvKernel::kMmaDirect) return gemv::launch_mma_direct(p, stream);
  if (p.w_layout != WeightLayout::kRowMajor)
    return invalid_argument(
        "[cuda.quant_gemv] an mma layout is read by kMmaRing (NVFP4) and kMmaDirect (MXFP8) only");
  if (p.kernel == GemvKernel::kDequantSplitK && p.format != QuantFormat::kBf16) {
    if (p.k <= 0 || p.k % 32 != 0)
      return invalid_argument("[cuda.quant_gemv] K = " + std::to_string(p.k) +
                              " must be a positive multiple of 32 (kDequantSplitK)");
    if (p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.w_scale) & 1) != 0)
      return invalid_argument("[cuda.quant_gemv] x rows and weights must be 16-byte aligned");
    if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
      return invalid_argument("[cuda.quant_gemv] group_offsets and active_groups go together");
    const DequantSplitKPlan plan = plan_dequant_splitk(p);
    return p.format == QuantFormat::kMxfp8 ? gemv::launch_dequant_splitk_mxfp8(p, plan, stream)
                                           : gemv::launch_dequant_splitk_nvfp4(p, plan, stream);
  }
  if (p.format != QuantFormat::kBf16 || p.kernel != GemvKernel::kBf16SplitK)
    return invalid_argument("[cuda.quant_gemv] kernel " +
                            std::to_string(static_cast<int>(p.kernel)) +
                            " for this format: BF16 takes kBf16SplitK, MXFP8 / NVFP4 "
                            "kDequantSplitK, kMmaRing and kMmaDirect");
  const int64_t slice = 256;
  if (p.k <= 0 || p.k % slice != 0)
    return invalid_argument("[cuda.quant_gemv] K = " + std::to_string(p.k) +
                            " must be a positive multiple of " + std::to_string(slice));
  if (p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w) & 15) != 0)
    return invalid_argument("[cuda.quant_gemv] x rows and weights must be 16-byte aligned");
  if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
    return invalid_argument("[cuda.quant_gemv] group_offsets and active_groups go together");
  // Activation rows per pass: as many as a group is likely to own (the whole batch for a dense
  // linear), capped by the registers the activations take.
  const int64_t per_group =
      p.group_offsets ? (p.num_rows + p.num_slots - 1) / std::max<int64_t>(1, p.num_slots)
                      : p.num_rows;
  const int mt = per_group <= 1 ? 1 : per_group <= 2 ? 2 : 4;
  return gemv::launch_bf16_splitk(p, mt, stream);
}

namespace {

__global__ void gemv_epilogue_kernel(GemvEpilogueParams p) {
  pdl_launch_dependents();
  pdl_wait();  // reads the GEMV's partial sums
  const int64_t r = blockIdx.y;
  const int64_t width = p.kind == GemvEpilogue::kSwigluBf16 ? p.n / 2 : p.n;
  const int64_t plane = p.num_rows * p.n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < width;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float* src = p.partial + r * p.n + i;
    float a = 0.0f;
    for (int64_t s = 0; s < p.num_slices; ++s) a += src[s * plane];
    if (p.kind == GemvEpilogue::kStoreF32) {
      float* y = p.y + r * p.ldy + i;
      *y = p.accumulate ? *y + a : a;
    } else {
      float u = 0.0f;
      for (int64_t s = 0; s < p.num_slices; ++s) u += src[s * plane + width];
      const float gc = fminf(a, p.limit);
      const float uc = fminf(fmaxf(u, -p.limit), p.limit);
      const float sig = 1.0f / (1.0f + expf(-gc * p.alpha));
      p.act[r * width + i] = f32_to_bf16((uc + 1.0f) * (gc * sig));
    }
  }
}

// One block; the grouping itself is routing::group_by_expert_block (moe/routing_device.cuh),
// shared with the fused router launch_moe_route.
__global__ void group_by_expert_kernel(GroupByExpertParams p) {
  pdl_launch_dependents();
  extern __shared__ int32_t offs[];  // [E + 1]
  __shared__ int2 warp_sums[32];
  routing::group_by_expert_block(p.topk_ids, p.num_rows, p.num_experts, offs, warp_sums,
                                 p.group_offsets, p.sorted_rows, p.active_groups, p.expert_base);
}

}  // namespace

Status launch_quant_gemv_epilogue(const GemvEpilogueParams& p, CUstream_st* stream) {
  if (p.num_rows == 0) return Status::ok();
  const int64_t width = p.kind == GemvEpilogue::kSwigluBf16 ? p.n / 2 : p.n;
  dim3 grid(static_cast<unsigned>((width + 255) / 256), static_cast<unsigned>(p.num_rows));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, gemv_epilogue_kernel, grid, dim3(256), 0, stream, p));
  return Status::ok();
}

Status launch_group_by_expert(const GroupByExpertParams& p, CUstream_st* stream) {
  if (p.num_experts <= 0 || p.num_experts > 4096)
    return invalid_argument("[cuda.group_by_expert] num_experts " +
                            std::to_string(p.num_experts) + " outside [1, 4096]");
  if (p.expert_base < 0 || p.expert_base > INT32_MAX)
    return invalid_argument("[cuda.group_by_expert] expert_base " +
                            std::to_string(p.expert_base) + " outside [0, 2^31)");
  const size_t smem = sizeof(int32_t) * static_cast<size_t>(p.num_experts + 1);
  group_by_expert_kernel<<<1, 1024, smem, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(group_by_expert_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

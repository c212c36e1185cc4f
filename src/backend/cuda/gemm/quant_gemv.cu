// Dispatch of the dequantising GEMV, its epilogue (fixed-order slice sum; float32 store or
// SwiGLU-OAI to bf16) and the token-to-expert grouping.
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "core/dtype.h"

#include <algorithm>
#include <cmath>

namespace m3::cuda {

namespace gemv {

constexpr int kWarpsPerBlock = 8;
dim3 grid_for(const QuantGemvParams& p, int64_t slice, int64_t rows_per_warp) {
  const int64_t warps = (p.n + rows_per_warp - 1) / rows_per_warp * (p.k / slice);
  return dim3(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock),
              static_cast<unsigned>(p.group_offsets ? p.num_slots : 1));
}

}  // namespace gemv

namespace gemv {

namespace {
// Chunks per K-slice of variant 3 (one 16-byte load per lane each, all issued together): the
// spill-free configurations under the 64-register cap (ptxas -v), with slices that divide K where
// possible. A function of (format, K) only, so callers size the partial buffer without the rows.
// MXFP8: 4 (K % 2048 == 0) or 3 (K % 1536 == 0) or 4; NVFP4: 4 (one activation row per register
// pass; more rows loop over the weights held in registers: 2+ rows per pass spill).
int v3_chunks(QuantFormat f, int64_t k) {
  if (f == QuantFormat::kMxfp8) return k % 2048 == 0 ? 4 : k % 1536 == 0 ? 3 : 4;
  return 4;
}
int v3_mt(QuantFormat f, int64_t per_group) {
  if (f == QuantFormat::kNvfp4) return 1;  // NVFP4 with 2+ rows per register pass spills
  return per_group <= 1 ? 1 : per_group <= 2 ? 2 : 4;
}
int64_t v3_per_group(const QuantGemvParams& p) {
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  return p.group_offsets ? (p.num_rows + slots - 1) / slots : p.num_rows;
}
int64_t v3_chunk_elems(QuantFormat f) { return f == QuantFormat::kMxfp8 ? 512 : 1024; }
bool uses_v3(QuantFormat f, int variant) { return variant == 3 && f != QuantFormat::kBf16; }
}  // namespace

V3Plan plan_v3(const QuantGemvParams& p) {
  V3Plan pl;
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  const int64_t per_group = v3_per_group(p);
  pl.mt = v3_mt(p.format, per_group);
  pl.rw = 1;  // 2 rows per warp step spill under 64 registers
  pl.kc = v3_chunks(p.format, p.k);
  const int64_t slice_k = pl.kc * v3_chunk_elems(p.format);
  pl.slices = (p.k + slice_k - 1) / slice_k;
  // Activation rows in shared memory: up to 8 within 96 KB, a multiple of mt. Grouped rows are
  // uneven across experts: room for twice the average (more rows take another pass).
  const int64_t row_bytes = slice_k * 4;
  int64_t cap = std::min<int64_t>(8, 98304 / row_bytes);
  cap = std::max<int64_t>(pl.mt, cap / pl.mt * pl.mt);
  const int64_t want = p.group_offsets ? 2 * per_group : per_group;
  pl.p_rows = static_cast<int>(std::min<int64_t>(cap, (want + pl.mt - 1) / pl.mt * pl.mt));
  pl.smem = static_cast<size_t>(pl.p_rows) * static_cast<size_t>(row_bytes);
  // Warp steps per CTA: at least ~2 CTAs per resident slot (132 SMs x 4) before growing tiles,
  // so the activation fill is amortised only where the grid is large anyway.
  const int64_t row_tiles = (p.n + 8 * pl.rw - 1) / (8 * pl.rw);
  const int64_t ctas1 = row_tiles * pl.slices * slots;
  pl.iters = static_cast<int>(std::clamp<int64_t>(ctas1 / 1056, 1, 16));
  const int64_t rows_per_cta = int64_t{8} * pl.rw * pl.iters;
  pl.grid = dim3(static_cast<unsigned>((p.n + rows_per_cta - 1) / rows_per_cta * pl.slices),
                 static_cast<unsigned>(slots));
  return pl;
}

void choose_iters_v3(const QuantGemvParams& p, int resident, V3Plan* plan) {
  const int64_t slots = plan->grid.y;
  const double slice_k = static_cast<double>(plan->kc * v3_chunk_elems(p.format));
  const double w_bytes_per_row = slice_k * (p.format == QuantFormat::kMxfp8 ? 1.0 : 0.5);
  const double x_bytes = plan->p_rows * slice_k * 2.0;
  double best = 1e300;
  int best_iters = plan->iters;
  for (int it = 1; it <= 16; ++it) {
    const int64_t rows = int64_t{8} * plan->rw * it;
    const int64_t ctas = (p.n + rows - 1) / rows * plan->slices * slots;
    const double waves = static_cast<double>(ctas) / std::max(1, resident);
    const double eff = waves / std::ceil(waves);
    const double cost = (1.0 + x_bytes / (rows * w_bytes_per_row) / 3.0) / eff;
    if (cost < best - 1e-9) best = cost, best_iters = it;
  }
  plan->iters = best_iters;
  const int64_t rows = int64_t{8} * plan->rw * best_iters;
  plan->grid.x = static_cast<unsigned>((p.n + rows - 1) / rows * plan->slices);
}

}  // namespace gemv

int64_t quant_gemv_num_slices(QuantFormat f, int64_t k) {
  if (f == QuantFormat::kBf16) return k / 256;
  const int64_t slice_k = gemv::v3_chunks(f, k) * gemv::v3_chunk_elems(f);
  return (k + slice_k - 1) / slice_k;
}

Status launch_quant_gemv(const QuantGemvParams& p, CUstream_st* stream) {
  if (p.num_rows == 0 || p.n == 0) return Status::ok();
  if (p.variant == 5) return gemv::launch_mma(p, stream);
  if (p.token_topk_ids != nullptr)
    return invalid_argument("[cuda.quant_gemv] token_topk_ids is read by variant 5 only");
  if (p.variant == 7) return gemv::launch_direct(p, stream);
  if (p.w_layout != 0)
    return invalid_argument(
        "[cuda.quant_gemv] an mma layout is read by variants 5 (NVFP4) and 7 (MXFP8) only");
  if (gemv::uses_v3(p.format, p.variant)) {
    if (p.k <= 0 || p.k % 32 != 0)
      return invalid_argument("[cuda.quant_gemv] K = " + std::to_string(p.k) +
                              " must be a positive multiple of 32 (variant 3)");
    if (p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(p.w_scale) & 1) != 0)
      return invalid_argument("[cuda.quant_gemv] x rows and weights must be 16-byte aligned");
    if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
      return invalid_argument("[cuda.quant_gemv] group_offsets and active_groups go together");
    const gemv::V3Plan plan = gemv::plan_v3(p);
    return p.format == QuantFormat::kMxfp8 ? gemv::launch_mxfp8_v3(p, plan, stream)
                                           : gemv::launch_nvfp4_v3(p, plan, stream);
  }
  if (p.format != QuantFormat::kBf16 || p.variant != 2)
    return invalid_argument("[cuda.quant_gemv] variant " + std::to_string(p.variant) +
                            " for this format: BF16 takes variant 2, MXFP8 / NVFP4 variants 3, 5 "
                            "and 7");
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
  return gemv::launch_bf16(p, mt, stream);
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
                                 p.group_offsets, p.sorted_rows, p.active_groups);
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
  const size_t smem = sizeof(int32_t) * static_cast<size_t>(p.num_experts + 1);
  group_by_expert_kernel<<<1, 1024, smem, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(group_by_expert_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

// Launcher of kMmaRing (gemv_mma.cuh): checks, the instantiation (rows per pass, storage order,
// staged activations and output scales: gemv_plan.h) and the CTA width from the kernel's
// occupancy.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/gemm/gemv_mma.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda::gemv {

namespace {

static_assert(kMmaStages * mma_stage_bytes<QuantFormat::kMxfp8>() >= 4 * 32 * 16,
              "the cross-warp sums fit in a warp's ring");

// Resident CTAs per SM for each width (1, 2, 4, 6, 8), computed once per instantiation.
template <QuantFormat F, int NG, bool kPacked, bool kStageX, bool kScaleOut>
const int (&occupancy_table(int* sms_out))[9] {
  static int occ[9] = {};
  static int sms = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    auto* kernel = gemv_mma_ring_kernel<F, NG, kPacked, kStageX, kScaleOut>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         mma_smem_bytes<F, kStageX>(8));
    for (int w : {1, 2, 4, 6, 8}) {
      int o = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, 32 * w,
                                                        mma_smem_bytes<F, kStageX>(w)) !=
          cudaSuccess)
        o = 1;
      occ[w] = std::max(o, 1);
    }
  });
  *sms_out = std::max(sms, 1);
  return occ;
}

template <QuantFormat F, int NG, bool kPacked, bool kStageX = false, bool kScaleOut = false>
Status launch_one(const QuantGemvParams& p, dim3 grid, cudaStream_t s) {
  auto* kernel = gemv_mma_ring_kernel<F, NG, kPacked, kStageX, kScaleOut>;
  int sms = 1;
  const int(&occ)[9] = occupancy_table<F, NG, kPacked, kStageX, kScaleOut>(&sms);
  const int64_t stages = (p.k / MmaTraits<F>::kChunkK + MmaTraits<F>::kU - 1) / MmaTraits<F>::kU;
  const int w = mma_ring_warps(int64_t{grid.x} * grid.y, stages, occ, sms,
                               kPacked && p.group_offsets != nullptr);
  M3_CUDA_RETURN_IF_ERROR(
      launch_kernel(p.pdl, kernel, grid, dim3(32 * w), mma_smem_bytes<F, kStageX>(w), s, p));
  return Status::ok();
}

template <QuantFormat F, bool kPacked>
Status launch_format(const QuantGemvParams& p, dim3 grid, cudaStream_t s) {
  switch (mma_ring_row_groups(p)) {
    case 1:
      if constexpr (F == QuantFormat::kNvfp4) {
        const MmaRingForm form = mma_ring_form(p);
        if (form.stage_x) {
          if constexpr (kPacked)
            if (form.scale_out) return launch_one<F, 1, true, true, true>(p, grid, s);
          return launch_one<F, 1, kPacked, true>(p, grid, s);
        }
      }
      return launch_one<F, 1, kPacked>(p, grid, s);
    case 2: return launch_one<F, 2, kPacked>(p, grid, s);
    default: return launch_one<F, 4, kPacked>(p, grid, s);
  }
}

}  // namespace

std::string mma_ring_params_problem(const QuantGemvParams& p) {
  if (p.xh == nullptr || p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.xh) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w) & 15) != 0)
    return "xh (f16 activations) rows and weights must be 16-byte aligned";
  if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
    return "group_offsets and active_groups go together";
  const GemvEpilogue kind = p.epilogue.kind;
  const bool swiglu = kind != GemvEpilogue::kStoreF32;
  if (!swiglu && p.epilogue.y == nullptr) return "epilogue.y is null";
  if (swiglu && p.epilogue.act == nullptr) return "epilogue.act is null";
  if (kind == GemvEpilogue::kSwigluF16 &&
      !(p.epilogue.limit * (p.epilogue.limit + 1.0f) * kActF16Scale < 65504.0f))
    return "the f16 SwiGLU output would overflow f16 at limit " + std::to_string(p.epilogue.limit);
  const int layout = static_cast<int>(p.w_layout);
  if (layout != 0 && layout != 1 && layout != 2)
    return "w_layout " + std::to_string(layout) + " is not a WeightLayout";
  if (p.w_layout != WeightLayout::kRowMajor &&
      (p.w_layout == WeightLayout::kMmaSwigluPairs) != swiglu)
    return "the pair tiling (kMmaSwigluPairs) goes with a SwiGLU epilogue, kMmaRows16 with a store";
  return "";
}

Status launch_mma_ring(const QuantGemvParams& p, cudaStream_t s) {
  const auto bad = [](const std::string& m) { return invalid_argument("[cuda.quant_gemv] " + m); };
  if (p.format != QuantFormat::kMxfp8 && p.format != QuantFormat::kNvfp4)
    return bad("kMmaRing takes MXFP8 or NVFP4 weights");
  const int64_t chunk = 128;  // MXFP8: 4-byte scale copies per 4 blocks; NVFP4: one chunk
  if (p.k <= 0 || p.k % chunk != 0 || p.k > (int64_t{1} << 30))
    return bad("kMmaRing: K = " + std::to_string(p.k) + " must be a positive multiple of " +
               std::to_string(chunk));
  if (p.n > (int64_t{1} << 30)) return bad("kMmaRing: N too large");
  if ((reinterpret_cast<uintptr_t>(p.w_scale) & 7) != 0)
    return bad("kMmaRing: scales must be 8-byte aligned");
  if (const std::string why = mma_ring_params_problem(p); !why.empty())
    return bad("kMmaRing: " + why);
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  if (swiglu && p.n % 16 != 0)
    return bad("kMmaRing SwiGLU: needs N % 16 == 0 (N = " + std::to_string(p.n) + ")");
  if (p.w_layout != WeightLayout::kRowMajor && (p.format != QuantFormat::kNvfp4 || p.n % 16 != 0))
    return bad("kMmaRing: the mma layout (w_layout " +
               std::to_string(static_cast<int>(p.w_layout)) +
               ") needs NVFP4 weights and N % 16 == 0 (N = " + std::to_string(p.n) + ")");
  if (p.token_topk_ids != nullptr &&
      (p.group_offsets == nullptr || p.sorted_rows != nullptr || p.num_slots > p.num_rows))
    return bad("kMmaRing: token_topk_ids (one row per slot, routed row = slot) needs a grouped "
               "launch (group_offsets, active_groups set), sorted_rows null and num_slots <= "
               "num_rows");
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  const int64_t tiles = swiglu ? p.n / 16 : (p.n + 15) / 16;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slots));
  if (p.format == QuantFormat::kMxfp8) return launch_format<QuantFormat::kMxfp8, false>(p, grid, s);
  return p.w_layout != WeightLayout::kRowMajor
             ? launch_format<QuantFormat::kNvfp4, true>(p, grid, s)
             : launch_format<QuantFormat::kNvfp4, false>(p, grid, s);
}

}  // namespace m3::cuda::gemv

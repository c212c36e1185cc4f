// Launcher of GEMV variant 5 (quant_gemv_mma.cuh): checks, the rows-per-pass instantiation and
// the CTA width.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_mma.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda::gemv {

int64_t rows_per_group(const QuantGemvParams& p) {
  if (p.group_offsets == nullptr) return p.num_rows;
  return p.max_group_rows > 0 ? std::min(p.max_group_rows, p.num_rows) : p.num_rows;
}

namespace {

constexpr int kWidths[] = {2, 4, 6, 8};  // warps per CTA the launcher chooses from (<= 256 threads)

static_assert(kMmaStages * mma_stage_bytes<QuantFormat::kMxfp8>() >= 4 * 32 * 16,
              "the cross-warp sums fit in a warp's ring");

// Resident CTAs per SM for each width (1, 2, 4, 6, 8), computed once per instantiation.
template <QuantFormat F, int NG, bool kPacked, bool kStageX, bool kScaleOut>
const int* occupancy_table(int* sms_out) {
  static int occ[9] = {};
  static int sms = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    auto* kernel = quant_gemv_mma_kernel<F, NG, kPacked, kStageX, kScaleOut>;
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

// Warps per CTA. Every CTA pays one pipeline fill (a memory latency) before it streams, so the
// grid should be resident in one wave where it can: the widest width whose grid fits on the SMs
// at once. Grids of several waves (many experts) take 2 warps per CTA (NVFP4 experts in the mma
// layout: 1): finer pieces balance the SMs better (H200, NVFP4 experts at batch 32: 1037 against
// 1404 us with 4 warps). Else the width whose last wave is fullest. M3_GEMV5_WIDTH (1, 2, 4, 6 or
// 8) overrides it, for benchmarks.
int choose_width(int64_t ctas, int64_t stages, const int* occ, int sms, bool packed_grouped) {
  static const int forced = [] {
    const char* e = std::getenv("M3_GEMV5_WIDTH");
    return e ? std::atoi(e) : 0;
  }();
  if (forced == 1 || forced == 2 || forced == 4 || forced == 6 || forced == 8) return forced;
  int best = 4;
  for (int w : kWidths)
    if (w <= stages && ctas <= int64_t{occ[w]} * sms) best = w;
  if (ctas <= int64_t{occ[best]} * sms) return best;
  // NVFP4 experts in the mma layout over several waves: one warp per CTA, the most warps per SM
  // (H200, cuda_decode_bench: 2 / 8 / 32 / 128 tokens 82.6 / 255.6 / 693.2 / 1221.8 us against
  // 87.2 / 257.1 / 722.3 / 1276.2 with 2 warps). One wave (a token)
  // keeps 2: 56.0 against 51.4 us.
  if (packed_grouped) return 1;
  if (ctas >= 4 * int64_t{occ[4]} * sms) return 2;
  double best_eff = -1.0;
  for (int w : kWidths) {
    const double waves = double(ctas) / (double(occ[w]) * sms);
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 1e-6) best_eff = eff, best = w;
  }
  return best;
}

template <QuantFormat F, int NG, bool kPacked, bool kStageX = false, bool kScaleOut = false>
Status launch_one(const QuantGemvParams& p, dim3 grid, cudaStream_t s) {
  auto* kernel = quant_gemv_mma_kernel<F, NG, kPacked, kStageX, kScaleOut>;
  int sms = 1;
  const int* occ = occupancy_table<F, NG, kPacked, kStageX, kScaleOut>(&sms);
  const int64_t stages = (p.k / MmaTraits<F>::kChunkK + MmaTraits<F>::kU - 1) / MmaTraits<F>::kU;
  const int w = choose_width(int64_t{grid.x} * grid.y, stages, occ, sms,
                             kPacked && p.group_offsets != nullptr);
  M3_CUDA_RETURN_IF_ERROR(
      launch_kernel(p.pdl, kernel, grid, dim3(32 * w), mma_smem_bytes<F, kStageX>(w), s, p));
  return Status::ok();
}

// Whether the NVFP4 activations go through the weight ring (the kernel's kStageX): where every
// group has at most one row and p.stage_x. H200: the NVFP4
// experts at one token 53.0 -> 49.2 us. Not MXFP8: at one row it was slower so (shared gate|up
// 18.1 -> 19.2 us, down 11.3 -> 12.0; its 256-byte slices per stage are L1 hits).
// M3_GEMV5_STAGE_X=0 turns it off, for benchmarks.
bool stage_x(const QuantGemvParams& p) {
  static const bool off = [] {
    const char* e = std::getenv("M3_GEMV5_STAGE_X");
    return e != nullptr && std::atoi(e) == 0;
  }();
  return p.stage_x && !off && rows_per_group(p) <= 1;
}

// Whether staged NVFP4 weights in the mma layout take their block scales on the mma's outputs
// (the kernel's kScaleOut): p.scale_out, unless M3_GEMV5_SCALE_OUT=0 (for benchmarks).
bool scale_out(const QuantGemvParams& p) {
  static const bool off = [] {
    const char* e = std::getenv("M3_GEMV5_SCALE_OUT");
    return e != nullptr && std::atoi(e) == 0;
  }();
  return p.scale_out && !off;
}

// Whether staged activations go through L1 (QuantGemvParams::stage_x_l1), unless
// M3_GEMV5_X_L1=0 (for benchmarks).
bool stage_x_l1(const QuantGemvParams& p) {
  static const bool off = [] {
    const char* e = std::getenv("M3_GEMV5_X_L1");
    return e != nullptr && std::atoi(e) == 0;
  }();
  return p.stage_x_l1 && !off;
}

template <QuantFormat F, bool kPacked>
Status launch_format(const QuantGemvParams& p_in, int ng, dim3 grid, cudaStream_t s) {
  QuantGemvParams p = p_in;
  p.stage_x_l1 = stage_x_l1(p_in);
  switch (ng) {
    case 1:
      if constexpr (F == QuantFormat::kNvfp4)
        if (stage_x(p)) {
          if constexpr (kPacked)
            if (scale_out(p)) return launch_one<F, 1, true, true, true>(p, grid, s);
          return launch_one<F, 1, kPacked, true>(p, grid, s);
        }
      return launch_one<F, 1, kPacked>(p, grid, s);
    case 2: return launch_one<F, 2, kPacked>(p, grid, s);
    default: return launch_one<F, 4, kPacked>(p, grid, s);
  }
}

}  // namespace

std::string tensor_core_params_problem(const QuantGemvParams& p) {
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
  if (p.w_layout != 0 && p.w_layout != 1 && p.w_layout != 2)
    return "w_layout " + std::to_string(p.w_layout) + " is not 0, 1 or 2";
  if (p.w_layout != 0 && (p.w_layout == 2) != swiglu)
    return "w_layout 2 (gate/up row pairs) goes with a SwiGLU epilogue, w_layout 1 with a store";
  return "";
}

Status launch_mma(const QuantGemvParams& p, cudaStream_t s) {
  const auto bad = [](const std::string& m) { return invalid_argument("[cuda.quant_gemv] " + m); };
  if (p.format != QuantFormat::kMxfp8 && p.format != QuantFormat::kNvfp4)
    return bad("variant 5 takes MXFP8 or NVFP4 weights");
  const int64_t chunk = 128;  // MXFP8: 4-byte scale copies per 4 blocks; NVFP4: one chunk
  if (p.k <= 0 || p.k % chunk != 0 || p.k > (int64_t{1} << 30))
    return bad("variant 5: K = " + std::to_string(p.k) + " must be a positive multiple of " +
               std::to_string(chunk));
  if (p.n > (int64_t{1} << 30)) return bad("variant 5: N too large");
  if ((reinterpret_cast<uintptr_t>(p.w_scale) & 7) != 0)
    return bad("variant 5: scales must be 8-byte aligned");
  if (const std::string why = tensor_core_params_problem(p); !why.empty())
    return bad("variant 5: " + why);
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  if (swiglu && p.n % 16 != 0)
    return bad("variant 5 SwiGLU: needs N % 16 == 0 (N = " + std::to_string(p.n) + ")");
  if (p.w_layout != 0 && (p.format != QuantFormat::kNvfp4 || p.n % 16 != 0))
    return bad("variant 5: the mma layout (w_layout " + std::to_string(p.w_layout) +
               ") needs NVFP4 weights and N % 16 == 0 (N = " + std::to_string(p.n) + ")");
  if (p.token_topk_ids != nullptr &&
      (p.group_offsets == nullptr || p.sorted_rows != nullptr || p.num_slots > p.num_rows))
    return bad("variant 5: token_topk_ids (one row per slot, routed row = slot) needs a grouped "
               "launch (group_offsets, active_groups set), sorted_rows null and num_slots <= "
               "num_rows");
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  // Rows per pass: a dense linear's batch; for experts twice the average rows per expert
  // (more take another pass over the weights).
  const int64_t want = p.group_offsets ? 2 * ((p.num_rows + slots - 1) / slots) : p.num_rows;
  const int ng = want <= 8 ? 1 : want <= 16 ? 2 : 4;
  const int64_t tiles = swiglu ? p.n / 16 : (p.n + 15) / 16;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slots));
  if (p.format == QuantFormat::kMxfp8) return launch_format<QuantFormat::kMxfp8, false>(p, ng, grid, s);
  return p.w_layout != 0 ? launch_format<QuantFormat::kNvfp4, true>(p, ng, grid, s)
                         : launch_format<QuantFormat::kNvfp4, false>(p, ng, grid, s);
}

}  // namespace m3::cuda::gemv

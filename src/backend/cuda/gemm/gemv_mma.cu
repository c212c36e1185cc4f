// Launcher of GEMV variant 5 (quant_gemv_mma.cuh): checks, the rows-per-pass instantiation and
// the CTA width.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_mma.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

constexpr int kWidths[] = {4, 6, 8, 12, 16};  // warps per CTA the launcher chooses from

size_t smem_bytes(int warps, int ng) { return size_t(warps) * ng * 32 * sizeof(float4); }

// Resident CTAs per SM for each width, computed once per instantiation.
template <QuantFormat F, int NG>
const int* occupancy_table(int* sms_out) {
  static int occ[17] = {};
  static int sms = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    auto* kernel = quant_gemv_mma_kernel<F, NG>;
    for (int w : kWidths) {
      int o = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, 32 * w, smem_bytes(w, NG)) !=
          cudaSuccess)
        o = 1;
      occ[w] = std::max(o, 1);
    }
  });
  *sms_out = std::max(sms, 1);
  return occ;
}

// The width whose grid fills the last wave best, among widths that keep the SMs fed
// (>= 24 resident warps per SM where the grid allows it) and give every warp a chunk.
int choose_width(int64_t ctas, int64_t chunks, const int* occ, int sms) {
  int best = 4;
  double best_score = -1.0;
  for (int w : kWidths) {
    if (w > chunks && w != 4) continue;
    const double slots = double(occ[w]) * sms;
    const double waves = double(ctas) / slots;
    const double eff = waves / std::ceil(waves);
    const double warps_per_sm = std::min(double(ctas), slots) * w / sms;
    const double fill = std::min(1.0, warps_per_sm / 24.0);
    const double score = eff * fill;
    if (score > best_score + 1e-6) best_score = score, best = w;
  }
  return best;
}

template <QuantFormat F, int NG>
Status launch_one(const QuantGemvParams& p, dim3 grid, cudaStream_t s) {
  auto* kernel = quant_gemv_mma_kernel<F, NG>;
  int sms = 1;
  const int* occ = occupancy_table<F, NG>(&sms);
  const int64_t chunks = p.k / MmaTraits<F>::kChunkK;
  const int w = choose_width(int64_t{grid.x} * grid.y, chunks, occ, sms);
  kernel<<<grid, 32 * w, smem_bytes(w, NG), s>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(kernel);
  return Status::ok();
}

template <QuantFormat F>
Status launch_format(const QuantGemvParams& p, int ng, dim3 grid, cudaStream_t s) {
  switch (ng) {
    case 1: return launch_one<F, 1>(p, grid, s);
    case 2: return launch_one<F, 2>(p, grid, s);
    default: return launch_one<F, 4>(p, grid, s);
  }
}

}  // namespace

Status launch_mma(const QuantGemvParams& p, cudaStream_t s) {
  const auto bad = [](const std::string& m) { return invalid_argument("[cuda.quant_gemv] " + m); };
  if (p.format != QuantFormat::kMxfp8 && p.format != QuantFormat::kNvfp4)
    return bad("variant 5 takes MXFP8 or NVFP4 weights");
  const int64_t chunk = p.format == QuantFormat::kMxfp8 ? 32 : 128;
  if (p.k <= 0 || p.k % chunk != 0 || p.k > (int64_t{1} << 30))
    return bad("variant 5: K = " + std::to_string(p.k) + " must be a positive multiple of " +
               std::to_string(chunk));
  if (p.n > (int64_t{1} << 30)) return bad("variant 5: N too large");
  if (p.xh == nullptr || p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.xh) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w_scale) & 1) != 0)
    return bad("variant 5: xh (f16 activations) rows and weights must be 16-byte aligned");
  if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
    return bad("group_offsets and active_groups go together");
  const GemvEpilogue kind = p.epilogue.kind;
  const bool swiglu = kind != GemvEpilogue::kStoreF32;
  if (!swiglu && p.epilogue.y == nullptr) return bad("variant 5: epilogue.y is null");
  if (swiglu && (p.epilogue.act == nullptr || p.n % 16 != 0))
    return bad("variant 5 SwiGLU: needs epilogue.act and N % 16 == 0 (N = " +
               std::to_string(p.n) + ")");
  if (kind == GemvEpilogue::kSwigluF16 &&
      !(p.epilogue.limit * (p.epilogue.limit + 1.0f) * kActF16Scale < 65504.0f))
    return bad("variant 5 f16 SwiGLU output: limit " + std::to_string(p.epilogue.limit) +
               " would overflow f16");
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  // Rows per pass: a dense linear's batch; for experts twice the average rows per expert
  // (more take another pass over the weights).
  const int64_t want = p.group_offsets ? 2 * ((p.num_rows + slots - 1) / slots) : p.num_rows;
  const int ng = want <= 8 ? 1 : want <= 16 ? 2 : 4;
  const int64_t tiles = swiglu ? p.n / 16 : (p.n + 15) / 16;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(slots));
  return p.format == QuantFormat::kMxfp8 ? launch_format<QuantFormat::kMxfp8>(p, ng, grid, s)
                                         : launch_format<QuantFormat::kNvfp4>(p, ng, grid, s);
}

}  // namespace m3::cuda::gemv

#include "backend/cuda/gemm/gemv_plan.h"

#include <algorithm>
#include <cmath>

namespace m3::cuda {

namespace {

// MXFP8 matrices of at least this many elements run the split-K kernel at one row unless they are
// in the mma layout (decode_gemv_on_tensor_cores): between the shared expert's gate|up (37.7M)
// and the dense gate|up / q|k|v (50.3M+).
constexpr int64_t kLargeAtOneRow = int64_t{44} << 20;

// Chunks per K-slice of kDequantSplitK (one 16-byte load per lane each, all issued together): the
// spill-free configurations under the 64-register cap (ptxas -v), with slices that divide K where
// possible. A function of (format, K) only, so callers size the partial buffer without the rows.
// MXFP8: 4 (K % 2048 == 0) or 3 (K % 1536 == 0) or 4; NVFP4: 4 (one activation row per register
// pass; more rows loop over the weights held in registers: 2+ rows per pass spill).
int splitk_chunks(QuantFormat f, int64_t k) {
  if (f == QuantFormat::kMxfp8) return k % 2048 == 0 ? 4 : k % 1536 == 0 ? 3 : 4;
  return 4;
}
int splitk_rows_per_pass(QuantFormat f, int64_t per_group) {
  if (f == QuantFormat::kNvfp4) return 1;  // NVFP4 with 2+ rows per register pass spills
  return per_group <= 1 ? 1 : per_group <= 2 ? 2 : 4;
}
int64_t splitk_rows_per_group(const QuantGemvParams& p) {
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  return p.group_offsets ? (p.num_rows + slots - 1) / slots : p.num_rows;
}
int64_t splitk_chunk_elems(QuantFormat f) { return f == QuantFormat::kMxfp8 ? 512 : 1024; }

constexpr int kRingWidths[] = {2, 4, 6, 8};  // warps per CTA the ring launcher chooses from
constexpr int kDirectMaxWarps = 8;

}  // namespace

bool decode_gemv_on_tensor_cores(QuantFormat format, WeightLayout layout, int64_t rows,
                                 int64_t n, int64_t k) {
  if (format == QuantFormat::kMxfp8 && layout != WeightLayout::kRowMajor) return true;
  return format == QuantFormat::kNvfp4 ||
         (format == QuantFormat::kMxfp8 && (rows >= 2 || n * k < kLargeAtOneRow));
}

GemvKernel choose_decode_gemv(QuantFormat format, WeightLayout layout, int64_t rows, int64_t n,
                              int64_t k, bool f16_input) {
  if (format == QuantFormat::kMxfp8 && layout != WeightLayout::kRowMajor)
    return GemvKernel::kMmaDirect;
  if (f16_input && decode_gemv_on_tensor_cores(format, layout, rows, n, k))
    return GemvKernel::kMmaRing;
  return format == QuantFormat::kBf16 ? GemvKernel::kBf16SplitK : GemvKernel::kDequantSplitK;
}

int64_t quant_gemv_num_slices(QuantFormat f, int64_t k) {
  if (f == QuantFormat::kBf16) return k / 256;
  const int64_t slice_k = splitk_chunks(f, k) * splitk_chunk_elems(f);
  return (k + slice_k - 1) / slice_k;
}

DequantSplitKPlan plan_dequant_splitk(const QuantGemvParams& p) {
  DequantSplitKPlan pl;
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  const int64_t per_group = splitk_rows_per_group(p);
  pl.mt = splitk_rows_per_pass(p.format, per_group);
  pl.rw = 1;  // 2 rows per warp step spill under 64 registers
  pl.kc = splitk_chunks(p.format, p.k);
  const int64_t slice_k = pl.kc * splitk_chunk_elems(p.format);
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
  pl.grid_x = static_cast<uint32_t>((p.n + rows_per_cta - 1) / rows_per_cta * pl.slices);
  pl.grid_y = static_cast<uint32_t>(slots);
  return pl;
}

void choose_dequant_splitk_iters(const QuantGemvParams& p, int resident,
                                 DequantSplitKPlan* plan) {
  const int64_t slots = plan->grid_y;
  const double slice_k = static_cast<double>(plan->kc * splitk_chunk_elems(p.format));
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
  plan->grid_x = static_cast<uint32_t>((p.n + rows - 1) / rows * plan->slices);
}

int64_t rows_per_group(const QuantGemvParams& p) {
  if (p.group_offsets == nullptr) return p.num_rows;
  return p.max_group_rows > 0 ? std::min(p.max_group_rows, p.num_rows) : p.num_rows;
}

int mma_ring_row_groups(const QuantGemvParams& p) {
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  const int64_t want = p.group_offsets ? 2 * ((p.num_rows + slots - 1) / slots) : p.num_rows;
  return want <= 8 ? 1 : want <= 16 ? 2 : 4;
}

MmaRingForm mma_ring_form(const QuantGemvParams& p) {
  MmaRingForm f;
  f.stage_x = p.format == QuantFormat::kNvfp4 && mma_ring_row_groups(p) == 1 &&
              rows_per_group(p) <= 1;
  f.scale_out = f.stage_x && p.w_layout != WeightLayout::kRowMajor;
  return f;
}

int mma_ring_warps(int64_t ctas, int64_t stages, const int (&occupancy)[9], int sms,
                   bool packed_grouped) {
  int best = 4;
  for (int w : kRingWidths)
    if (w <= stages && ctas <= int64_t{occupancy[w]} * sms) best = w;
  if (ctas <= int64_t{occupancy[best]} * sms) return best;
  // (A one-wave grid, one token, returned above: one warp per CTA was slower there, 56.0 against
  // 51.4 us.)
  if (packed_grouped) return 1;
  if (ctas >= 4 * int64_t{occupancy[4]} * sms) return 2;
  double best_eff = -1.0;
  for (int w : kRingWidths) {
    const double waves = double(ctas) / (double(occupancy[w]) * sms);
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 1e-6) best_eff = eff, best = w;
  }
  return best;
}

int mma_direct_row_groups(const QuantGemvParams& p) {
  if (p.xh == nullptr) return 1;
  const int64_t per_pass = std::min<int64_t>(p.num_rows, 32);
  return per_pass <= 8 ? 1 : per_pass <= 16 ? 2 : 4;
}

int mma_direct_warps(int64_t tiles, int64_t stages, const int (&occupancy)[9], int sms) {
  int warps = 1;
  for (int w = 1; w <= kDirectMaxWarps; ++w)
    if (tiles * w <= int64_t{24} * sms && tiles <= int64_t{occupancy[w]} * sms) warps = w;
  return static_cast<int>(std::min<int64_t>(warps, stages));
}

}  // namespace m3::cuda

// The tensor-core GEMVs kMmaRing and kMmaDirect (f16 operands, f32 accumulation, epilogue fused;
// see gemv_mma.cuh, gemv_mma_direct.cu) and their f16 activations (x_f16.h) against the CPU
// backend's float32 linear
// on the reference-dequantised weights, dense and grouped by expert, at the real MiniMax-M3.1-Flash
// shapes, at odd ones, with 1..40 activation rows (several rows-per-pass instantiations and
// passes) and with block scales spread over 20 binades (E4M3 subnormal scales, f16 subnormals).
//
// Bound: the f16 operands are exact (the activations are bf16 values times a power of two, the
// weights E4M3 / E2M1 x E4M3 x 2^-7 values; x_to_f16 is checked to be exact below) and their
// products are exact in f32, so the GPU's error is the f32 summation: the tensor core's
// accumulation order and rounding are unspecified, so each addition is allowed 2u (truncation),
// giving 2·gamma_{K+2}; the CPU's sum is within gamma_{K+2}; the NVFP4 global multiplier is a
// rounded reciprocal (4u as in quant_gemv_test). |gpu - cpu| <= (3·gamma_{K+2} + 4u)·Σ|x||w|.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/mxfp8_repack.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/x_f16.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "quant/mxfp8_mma_layout.h"
#include "quant/nvfp4_mma_layout.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant_matrix.h"

namespace m3::cuda_test {
namespace {

using cuda::GemvKernel;
using cuda::WeightLayout;

double bound_factor(int64_t k) { return (3 * gamma(k + 2) + 4 * kU) * 1.01; }

// Random bf16 activations, row r scaled by 2^(5·(r % 7) - 15) (the per-row f16 factor varies).
void make_x(int64_t m, int64_t k, uint32_t seed, std::vector<float>* xf,
            std::vector<uint16_t>* xb) {
  *xf = randn(m * k, seed, 1.0f);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) (*xf)[r * k + i] *= std::ldexp(1.0f, 5 * int(r % 7) - 15);
  *xb = to_bf16(xf);
}

// The f16 activations on the device, checked exact: xh[i] · inv[r] == x[i] for every element.
struct XF16 {
  Dev<uint16_t> xh;
  Dev<float> inv;
  XF16(Dev<uint16_t>& xb_dev, const std::vector<float>& xf, int64_t m, int64_t k)
      : xh(Dev<uint16_t>::poisoned(m * k)), inv(Dev<float>::poisoned(m)) {
    cuda::XToF16Params p{xb_dev.ptr(), k, m, k, xh.ptr(), k, inv.ptr()};
    EXPECT_TRUE(cuda::launch_x_to_f16(p, stream()).is_ok());
    const auto h = xh.host();
    const auto s = inv.host();
    int64_t inexact = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < k; ++i)
        if (f16_to_f32(h[r * k + i]) * s[r] != xf[r * k + i]) ++inexact;
    EXPECT_EQ(inexact, 0) << "x_to_f16 is not exact";
  }
};

// The prefill path's bf16 dequantisation of rows 16.. (a range that does not start at 0) of a
// matrix stored in `layout`.
std::vector<uint16_t> prefill_dequant(QuantFormat f, const uint8_t* w, const uint8_t* scales,
                                      int64_t n, int64_t k, WeightLayout layout) {
  cuda::DequantBf16Params d;
  d.w.format = f;
  d.w.w = w;
  d.w.w_scale = scales;
  d.w.n = n;
  d.w.k = k;
  d.w.layout = layout;
  d.row0 = n > 16 ? 16 : 0;
  d.rows = n - d.row0;
  auto out = Dev<uint16_t>::poisoned(d.rows * k);
  d.out = out.ptr();
  EXPECT_TRUE(cuda::launch_dequant_bf16(d, stream()).is_ok());
  return out.host();
}

struct Case {
  QuantFormat f;
  int64_t m, n, k;
  int spread;
};
class QuantGemvMma : public ::testing::TestWithParam<Case> {};

// p (storing into y) once more gives the same bits y0 (deterministic), and with `accumulate` adds
// exactly y0 to known values (the same result added, bitwise).
void check_repeat_and_accumulate(cuda::QuantGemvParams p, Dev<float>& y,
                                 const std::vector<float>& y0, const std::string& name) {
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  EXPECT_EQ(y.host(), y0) << name << ": second launch differs";
  std::vector<float> base(y0.size());
  for (size_t i = 0; i < base.size(); ++i) base[i] = 0.25f * float(i % 97) - 3.0f;
  Dev<float> ya(base);
  p.epilogue.y = ya.ptr();
  p.epilogue.accumulate = true;
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  const auto y1 = ya.host();
  for (size_t i = 0; i < y1.size(); ++i)
    ASSERT_EQ(y1[i], base[i] + y0[i]) << name << ": accumulate differs at " << i;
}

TEST_P(QuantGemvMma, DenseMatchesCpuOnDequantisedWeights) {
  const Case c = GetParam();
  const QMatrix w = make_matrix(c.f, c.n, c.k, 31, c.spread);
  std::vector<float> xf, want(c.m * c.n), mag(c.m * c.n);
  std::vector<uint16_t> xb;
  make_x(c.m, c.k, 32, &xf, &xb);
  cpu()->linear({xf.data(), w.deq.data(), want.data(), c.m, c.n, c.k, false});
  const auto ax = abs_of(xf), aw = abs_of(w.deq);
  cpu()->linear({ax.data(), aw.data(), mag.data(), c.m, c.n, c.k, false});
  std::vector<double> bound(want.size());
  for (size_t i = 0; i < want.size(); ++i) bound[i] = bound_factor(c.k) * mag[i] + 1e-30;

  Dev<uint16_t> dx(xb);
  XF16 x16(dx, xf, c.m, c.k);
  Dev<uint8_t> dw(w.data), ds(w.scale);
  Dev<float> dg(std::vector<float>{w.global});
  auto y = Dev<float>::poisoned(c.m * c.n);
  cuda::QuantGemvParams p;
  p.format = c.f;
  p.xh = x16.xh.ptr();
  p.x_inv_scale = x16.inv.ptr();
  p.ldx = c.k;
  p.w = dw.ptr();
  p.w_scale = ds.ptr();
  p.w_global = dg.ptr();
  p.num_rows = c.m;
  p.n = c.n;
  p.k = c.k;
  p.kernel = GemvKernel::kMmaRing;
  p.epilogue.y = y.ptr();
  p.epilogue.ldy = c.n;
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  const auto y0 = y.host();
  const std::string name = std::string(c.f == QuantFormat::kMxfp8 ? "mxfp8" : "nvfp4") +
                           " gemv M" + std::to_string(c.m) + " N" + std::to_string(c.n) +
                           " K" + std::to_string(c.k) + (c.spread ? " spread" : "");
  expect_close(y0, want, bound, name + " ring");
  check_repeat_and_accumulate(p, y, y0, name + " ring");

  // kMmaDirect (MXFP8, 1..8 rows, K % 128) reads the bf16 rows itself: the same bound,
  // deterministic, accumulate bitwise; refused elsewhere.
  if (c.f == QuantFormat::kMxfp8) {
    cuda::QuantGemvParams q = p;
    q.kernel = GemvKernel::kMmaDirect;
    q.x = dx.ptr();
    q.xh = nullptr;
    q.x_inv_scale = nullptr;
    auto y7 = Dev<float>::poisoned(c.m * c.n);
    q.epilogue.y = y7.ptr();
    q.epilogue.accumulate = false;
    if (c.m <= 8 && c.k % 128 == 0) {
      ASSERT_TRUE(cuda::launch_quant_gemv(q, stream()).is_ok()) << name;
      const auto y70 = y7.host();
      expect_close(y70, want, bound, name + " direct");
      check_repeat_and_accumulate(q, y7, y70, name + " direct");
    } else {
      EXPECT_FALSE(cuda::launch_quant_gemv(q, stream()).is_ok()) << name << " direct";
    }
    // With the f16 rows (any number of rows: passes of up to 32).
    if (c.k % 128 == 0) {
      q.xh = x16.xh.ptr();
      q.x_inv_scale = x16.inv.ptr();
      ASSERT_TRUE(cuda::launch_quant_gemv(q, stream()).is_ok()) << name;
      const auto y7h = y7.host();
      expect_close(y7h, want, bound, name + " direct f16 rows");
      check_repeat_and_accumulate(q, y7, y7h, name + " direct f16 rows");
    }
    // The mma layout (quant/mxfp8_mma_layout.h) where it fits: the GPU repack equals the host
    // reference byte for byte, kMmaDirect meets the bound on it with bf16 rows (up to 8) and f16
    // rows, the other kernels refuse it, and the prefill dequantisation of the packed matrix
    // equals that of the row-major one bit for bit.
    if (mxfp8_mma::fits(c.n, c.k, mxfp8_mma::Tiling::kRows16)) {
      auto dwp = Dev<uint8_t>::poisoned(static_cast<int64_t>(w.data.size()));
      ASSERT_TRUE(cuda::launch_mxfp8_mma_repack(dw.ptr(), dwp.ptr(), 1, c.n, c.k,
                                                mxfp8_mma::Tiling::kRows16, stream()).is_ok());
      ASSERT_EQ(dwp.host(), mxfp8_mma::pack_matrix(w.data.data(), 1, c.n, c.k,
                                                   mxfp8_mma::Tiling::kRows16))
          << name << ": GPU repack differs from the host reference";
      q.w = dwp.ptr();
      q.w_layout = WeightLayout::kMmaRows16;
      for (const bool f16_rows : {false, true}) {
        if (!f16_rows && c.m > 8) continue;
        q.xh = f16_rows ? x16.xh.ptr() : nullptr;
        q.x_inv_scale = f16_rows ? x16.inv.ptr() : nullptr;
        const std::string nm = name + " direct mma layout" + (f16_rows ? " f16 rows" : "");
        ASSERT_TRUE(cuda::launch_quant_gemv(q, stream()).is_ok()) << nm;
        const auto yp = y7.host();
        expect_close(yp, want, bound, nm);
        check_repeat_and_accumulate(q, y7, yp, nm);
      }
      q.w_layout = WeightLayout::kMmaSwigluPairs;  // the pair tiling goes with SwiGLU only
      EXPECT_FALSE(cuda::launch_quant_gemv(q, stream()).is_ok()) << name;
      q.w_layout = WeightLayout::kMmaRows16;
      for (GemvKernel v : {GemvKernel::kDequantSplitK, GemvKernel::kMmaRing}) {
        q.kernel = v;
        EXPECT_FALSE(cuda::launch_quant_gemv(q, stream()).is_ok())
            << name << " kernel " << static_cast<int>(v);
      }
      EXPECT_EQ(prefill_dequant(c.f, dwp.ptr(), ds.ptr(), c.n, c.k, WeightLayout::kMmaRows16),
                prefill_dequant(c.f, dw.ptr(), ds.ptr(), c.n, c.k, WeightLayout::kRowMajor))
          << name << ": packed prefill dequantisation";
    }
  }

  // NVFP4 in the mma layout (quant/nvfp4_mma_layout.h), where it fits: the GPU repack equals the
  // host reference byte for byte, the GEMV meets the same bound, and the prefill dequantisation
  // of the packed matrix equals that of the row-major one bit for bit.
  if (c.f != QuantFormat::kNvfp4 || !nvfp4_mma::fits(c.n, c.k, nvfp4_mma::Tiling::kRows16)) return;
  auto dwp = Dev<uint8_t>::poisoned(static_cast<int64_t>(w.data.size()));
  ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dw.ptr(), dwp.ptr(), 1, c.n, c.k,
                                            nvfp4_mma::Tiling::kRows16, stream()).is_ok());
  ASSERT_EQ(dwp.host(), nvfp4_mma::pack_matrix(w.data.data(), 1, c.n, c.k,
                                               nvfp4_mma::Tiling::kRows16))
      << name << ": GPU repack differs from the host reference";
  p.w = dwp.ptr();
  p.w_layout = WeightLayout::kMmaRows16;
  p.epilogue.y = y.ptr();
  p.epilogue.accumulate = false;
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  const auto yp = y.host();
  expect_close(yp, want, bound, name + " ring mma layout");
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  EXPECT_EQ(y.host(), yp) << name << ": mma layout, second launch differs";
  p.w_layout = WeightLayout::kMmaSwigluPairs;  // the pair tiling goes with SwiGLU only
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  p.w_layout = WeightLayout::kMmaRows16;
  p.kernel = GemvKernel::kDequantSplitK;  // the other kernels read row-major weights only
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  EXPECT_EQ(prefill_dequant(c.f, dwp.ptr(), ds.ptr(), c.n, c.k, WeightLayout::kMmaRows16),
            prefill_dequant(c.f, dw.ptr(), ds.ptr(), c.n, c.k, WeightLayout::kRowMajor))
      << name << ": packed prefill dequantisation";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantGemvMma,
    ::testing::Values(Case{QuantFormat::kMxfp8, 1, 9856, 6144, 0},   // q|k|v|index
                      Case{QuantFormat::kMxfp8, 8, 6144, 8192, 0},   // o_proj, batch 8
                      Case{QuantFormat::kMxfp8, 3, 6144, 3072, 0},   // shared down
                      Case{QuantFormat::kMxfp8, 2, 1000, 12288, 0},  // dense down (K)
                      Case{QuantFormat::kMxfp8, 20, 1000, 1536, 0},  // 32 rows per pass
                      Case{QuantFormat::kMxfp8, 40, 77, 384, 0},     // two passes, odd N
                      Case{QuantFormat::kMxfp8, 12, 13, 128, 0},     // one stage, 16 per pass
                      Case{QuantFormat::kMxfp8, 3, 40, 640, 0},      // a partial last stage
                      Case{QuantFormat::kMxfp8, 5, 512, 2048, 20},   // scales over 20 binades
                      Case{QuantFormat::kNvfp4, 1, 6144, 6144, 0},   // expert w1|w3
                      Case{QuantFormat::kNvfp4, 1, 6144, 3072, 0},   // expert w2
                      Case{QuantFormat::kNvfp4, 2, 160, 384, 20},    // 8-byte scales, a partial stage
                      Case{QuantFormat::kNvfp4, 8, 1000, 3072, 0},
                      Case{QuantFormat::kNvfp4, 12, 77, 128, 0},     // one chunk, odd N
                      Case{QuantFormat::kNvfp4, 33, 100, 256, 0},    // two passes
                      Case{QuantFormat::kNvfp4, 5, 300, 640, 0},     // 8-byte scale copies
                      Case{QuantFormat::kNvfp4, 7, 48, 384, 0},      // mma layout, 8-byte scales
                      Case{QuantFormat::kNvfp4, 3, 512, 2048, 20},
                      Case{QuantFormat::kNvfp4, 1, 48, 384, 0},      // staged x, a partial stage
                      Case{QuantFormat::kNvfp4, 1, 160, 640, 20},    // staged x, 8-byte scales
                      Case{QuantFormat::kNvfp4, 8, 2048, 1024, 0},   // 128 tiles, 8 stages
                      Case{QuantFormat::kMxfp8, 7, 160, 512, 0},     // 10 tiles
                      Case{QuantFormat::kMxfp8, 4, 4096, 1536, 0}));  // 12 stages

struct Routing {
  int64_t tokens;
  std::vector<int32_t> ids;  // [tokens * 3]
  int64_t experts = 8;
};

// One routing through gate|up (+ SwiGLU) and down; NVFP4 optionally in the mma layout (gate/up
// row pairs, rows of 16), repacked on the GPU and checked against the host repack first.
void run_grouped(const Routing& routing, QuantFormat f, bool packed) {
  const int64_t experts = routing.experts, tokens = routing.tokens, top_k = 3, inter = 1024,
                hidden = 2048;
  const int64_t rows = tokens * top_k;
  const std::string name = std::string(f == QuantFormat::kMxfp8 ? "mxfp8" : "nvfp4") +
                           " ring grouped T" +
                           std::to_string(tokens) + " E" + std::to_string(experts) +
                           (packed ? " mma layout" : "");
  const ExpertSet ex = make_experts(f, experts, inter, hidden, 300, 400);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  make_x(tokens, hidden, 33, &xf, &xb);
  Dev<uint16_t> dx(xb);
  XF16 x16(dx, xf, tokens, hidden);
  DevRouting route(routing.ids, experts);
  DevExperts dev(ex);
  auto up_p = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.up_w.size()));
  auto down_p = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.down_w.size()));
  if (packed) {
    ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.up_w.ptr(), up_p.ptr(), experts, 2 * inter,
                                              hidden, nvfp4_mma::Tiling::kSwigluPairs,
                                              stream()).is_ok());
    ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.down_w.ptr(), down_p.ptr(), experts, hidden,
                                              inter, nvfp4_mma::Tiling::kRows16,
                                              stream()).is_ok());
    ASSERT_EQ(up_p.host(), nvfp4_mma::pack_matrix(ex.up_w.data(), experts, 2 * inter, hidden,
                                                  nvfp4_mma::Tiling::kSwigluPairs));
  }
  auto use_packed = [&](cuda::QuantGemvParams& q, bool up) {
    if (!packed) return;
    q.w = up ? up_p.ptr() : down_p.ptr();
    q.w_layout = up ? WeightLayout::kMmaSwigluPairs : WeightLayout::kMmaRows16;
  };

  cuda::QuantGemvParams p = grouped_params(f, dev, route, true, inter, hidden);
  use_packed(p, true);
  p.xh = x16.xh.ptr();
  p.x_inv_scale = x16.inv.ptr();
  p.x_row_div = top_k;
  p.kernel = GemvKernel::kMmaRing;
  p.max_group_rows = tokens;
  p.epilogue.kind = cuda::GemvEpilogue::kSwigluBf16;
  auto act = Dev<uint16_t>::poisoned(rows * inter);
  p.epilogue.act = act.ptr();
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  const auto act_h = act.host();
  p.epilogue.kind = cuda::GemvEpilogue::kSwigluF16;
  auto act16 = Dev<uint16_t>::poisoned(rows * inter);
  p.epilogue.act = act16.ptr();
  const cuda::QuantGemvParams up16 = p;
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  const auto act16_h = act16.host();
  // The f16 copy is the bf16 value x 2^8, exact down to the f16 subnormal step (2^-24, so
  // within 2^-33 after the 2^-8).
  for (int64_t i = 0; i < rows * inter; ++i)
    ASSERT_LE(std::abs(double(f16_to_f32(act16_h[i])) / 256.0 - bf16_to_f32(act_h[i])),
              std::ldexp(1.0, -33))
        << name << ": f16 activation " << i << " is not the bf16 one x 2^8";

  // CPU gate|up + SwiGLU per routed row with this kernel's summation bound (quant_matrix.h).
  std::vector<float> act_got(rows * inter), act_want(rows * inter);
  std::vector<double> act_bound(rows * inter);
  for (int64_t r = 0; r < rows; ++r) {
    swiglu_row_reference(xf.data() + (r / top_k) * hidden, ex.up[routing.ids[r]], inter,
                         hidden, bound_factor(hidden), act_want.data() + r * inter,
                         act_bound.data() + r * inter);
    for (int64_t i = 0; i < inter; ++i)
      act_got[r * inter + i] = bf16_to_f32(act_h[r * inter + i]);
  }
  expect_close(act_got, act_want, act_bound, name + " gate|up + swiglu");

  // Down: the f16 activations (x 2^8), float32 rows per routed row; the CPU gets exactly the
  // values the GPU reads.
  for (int64_t i = 0; i < rows * inter; ++i) act_got[i] = f16_to_f32(act16_h[i]) / 256.0f;
  p = grouped_params(f, dev, route, false, inter, hidden);
  use_packed(p, false);
  p.xh = act16.ptr();
  p.x_inv_const = 1.0f / 256.0f;
  p.kernel = GemvKernel::kMmaRing;
  p.max_group_rows = tokens;
  auto y = Dev<float>::poisoned(rows * hidden);
  p.epilogue.y = y.ptr();
  p.epilogue.ldy = hidden;
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  std::vector<float> yw;
  std::vector<double> yb;
  down_rows_reference(act_got, routing.ids, ex, inter, hidden, bound_factor(inter), &yw, &yb);
  const auto y0 = y.host();
  expect_close(y0, yw, yb, name + " down (f16 activations)");
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  EXPECT_EQ(y.host(), y0) << name << ": second launch differs";
  {
    // The down product as the model runs it: a programmatic dependent of a fresh gate|up, its
    // routing and first weights read before its wait. Bitwise the plain launch; had it read its
    // activations before the gate|up wrote them, it would have read the poison.
    auto act16_pdl = Dev<uint16_t>::poisoned(rows * inter);
    cuda::QuantGemvParams up = up16;
    up.epilogue.act = act16_pdl.ptr();
    cuda::QuantGemvParams down = p;
    down.xh = act16_pdl.ptr();
    down.pdl = down.weights_before_wait = true;
    auto y_pdl = Dev<float>::poisoned(rows * hidden);
    down.epilogue.y = y_pdl.ptr();
    ASSERT_TRUE(cuda::launch_quant_gemv(up, stream()).is_ok());
    ASSERT_TRUE(cuda::launch_quant_gemv(down, stream()).is_ok());
    EXPECT_EQ(y_pdl.host(), y0) << name << ": down with its weights before the wait differs";
  }
}

// Experts: tokens x top_k routed rows through their expert's gate|up with the fused SwiGLU
// (bf16 and f16 x 2^8 outputs), then the down product reading the f16 activations.
TEST(QuantGemvMmaGrouped, ExpertsWithSwigluAndDown) {
  std::vector<Routing> routings;
  routings.push_back({5, {0, 3, 7, 3, 5, 7, 1, 3, 4, 0, 2, 5, 1, 2, 3}});
  routings.push_back({1, {2, 5, 6}});  // batch 1
  routings.push_back({2, {2, 5, 6, 5, 0, 2}});  // batch 2: two rows of experts 2 and 5
  Routing heavy{40, {}};  // expert 3 takes all 40 tokens: two passes of 32 rows
  for (int32_t t = 0; t < 40; ++t)
    for (int32_t v : {3, (t % 3) + 4, t % 3}) heavy.ids.push_back(v);
  routings.push_back(heavy);
  Routing staged{8, {}};  // expert 3 takes 8 of 24 rows: two passes of staged activation rows
  for (int32_t t = 0; t < 8; ++t)
    for (int32_t v : {3, (t % 3) + 4, t % 3}) staged.ids.push_back(v);
  routings.push_back(staged);
  // 32 experts, 16 tokens: 32 slots x 128 tiles, several waves of CTAs (the launcher's narrow
  // widths: 1 warp per CTA in the mma layout, 2 otherwise).
  Routing wide{16, {}, 32};
  for (int32_t t = 0; t < 16; ++t)
    for (int32_t s = 0; s < 3; ++s) wide.ids.push_back((7 * t + 11 * s) % 32);
  routings.push_back(wide);
  for (const Routing& routing : routings)
    for (QuantFormat f : {QuantFormat::kNvfp4, QuantFormat::kMxfp8})
      for (bool packed : {false, true})
        if (!packed || f == QuantFormat::kNvfp4) run_grouped(routing, f, packed);
}

// One token's experts reading their slots' experts from the token's top-k
// (QuantGemvParams::token_topk_ids) against the same GEMVs reading launch_group_by_expert's
// grouping of that top-k: the gate|up's activations and the down's rows are the same bits, also
// as the model chains them (the down a programmatic dependent reading its slot before its wait).
// Top-k from launch_router_topk on crafted logits: 128 experts with a bias; 37 experts with tied
// logits; 8 experts of which 6 are NaN (two slots stay empty: those rows keep their poison); 20
// experts all tied (the lowest ids win).
struct TokenSlotsCase {
  int32_t experts, top_k;
  std::vector<float> logits;
  bool bias;
};
void run_token_slots(const TokenSlotsCase& c, QuantFormat f, bool packed) {
  const int64_t inter = 128, hidden = 256, e = c.experts, k = c.top_k;
  const std::string name = std::string(f == QuantFormat::kNvfp4 ? "NVFP4" : "MXFP8") +
                           (packed ? " mma layout" : "") + ", " + std::to_string(e) +
                           " experts, top " + std::to_string(k);
  Dev<float> logits(c.logits);
  Dev<float> bias(randn(e, 77, 0.05f));
  auto ids = Dev<int32_t>::poisoned(k);
  auto wts = Dev<float>::poisoned(k);
  RouterTopkParams rp{logits.ptr(), c.bias ? bias.ptr() : nullptr, ids.ptr(), wts.ptr(), 1, e, k,
                      2.5f};
  ASSERT_TRUE(cuda::launch_router_topk(rp, stream()).is_ok());
  const std::vector<int32_t> ids_h = ids.host();
  DevRouting route(ids_h, e);

  const ExpertSet ex = make_experts(f, e, inter, hidden, 500, 600);
  DevExperts dev(ex);
  auto up_p = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.up_w.size()));
  auto down_p = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.down_w.size()));
  if (packed) {
    ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.up_w.ptr(), up_p.ptr(), e, 2 * inter, hidden,
                                              nvfp4_mma::Tiling::kSwigluPairs, stream()).is_ok());
    ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.down_w.ptr(), down_p.ptr(), e, hidden, inter,
                                              nvfp4_mma::Tiling::kRows16, stream()).is_ok());
  }
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  make_x(1, hidden, 41, &xf, &xb);
  Dev<uint16_t> dx(xb);
  XF16 x16(dx, xf, 1, hidden);

  cuda::QuantGemvParams up = grouped_params(f, dev, route, true, inter, hidden);
  cuda::QuantGemvParams down = grouped_params(f, dev, route, false, inter, hidden);
  if (packed) {
    up.w = up_p.ptr(), up.w_layout = WeightLayout::kMmaSwigluPairs;
    down.w = down_p.ptr(), down.w_layout = WeightLayout::kMmaRows16;
  }
  up.xh = x16.xh.ptr();
  up.x_inv_scale = x16.inv.ptr();
  up.x_row_div = k;
  up.kernel = down.kernel = GemvKernel::kMmaRing;
  up.max_group_rows = down.max_group_rows = 1;
  up.epilogue.kind = cuda::GemvEpilogue::kSwigluF16;
  down.x_inv_const = 1.0f / 256.0f;
  down.epilogue.ldy = hidden;
  auto run = [&](bool token, bool pdl, std::vector<uint16_t>* act_h, std::vector<float>* y_h) {
    auto act = Dev<uint16_t>::poisoned(k * inter);
    auto y = Dev<float>::poisoned(k * hidden);
    cuda::QuantGemvParams u = up, d = down;
    u.epilogue.act = act.ptr();
    d.xh = act.ptr();
    d.epilogue.y = y.ptr();
    if (token) {
      u.token_topk_ids = d.token_topk_ids = ids.ptr();
      u.sorted_rows = d.sorted_rows = nullptr;
    }
    if (pdl) u.pdl = d.pdl = d.weights_before_wait = true;
    ASSERT_TRUE(cuda::launch_quant_gemv(u, stream()).is_ok()) << name;
    ASSERT_TRUE(cuda::launch_quant_gemv(d, stream()).is_ok()) << name;
    *act_h = act.host();
    *y_h = y.host();
  };
  std::vector<uint16_t> act_ref, act_tok;
  std::vector<float> y_ref, y_tok;
  run(false, false, &act_ref, &y_ref);
  for (const bool pdl : {false, true}) {
    const std::string what = name + (pdl ? ", PDL chain" : ", plain launches");
    run(true, pdl, &act_tok, &y_tok);
    EXPECT_EQ(act_tok, act_ref) << what << ": gate|up activations differ";
    EXPECT_EQ(0, std::memcmp(y_tok.data(), y_ref.data(), y_ref.size() * 4))
        << what << ": down rows differ";
  }
  // The slots with an expert were computed (finite), the others kept the poison (NaN).
  int32_t valid = 0;
  for (int32_t id : ids_h) valid += id >= 0 && id < e ? 1 : 0;
  for (int64_t r = 0; r < k; ++r)
    EXPECT_EQ(y_ref[r * hidden] == y_ref[r * hidden], r < valid)
        << name << ": routed row " << r << " written / empty unlike its slot";

  // Refused: sorted_rows set, more slots than rows, another kernel.
  cuda::QuantGemvParams bad = up;
  auto act = Dev<uint16_t>::poisoned(k * inter);
  bad.epilogue.act = act.ptr();
  bad.token_topk_ids = ids.ptr();
  EXPECT_FALSE(cuda::launch_quant_gemv(bad, stream()).is_ok()) << name << ": sorted_rows set";
  bad.sorted_rows = nullptr;
  EXPECT_TRUE(cuda::launch_quant_gemv(bad, stream()).is_ok()) << name;
  bad.num_slots = k + 1;
  EXPECT_FALSE(cuda::launch_quant_gemv(bad, stream()).is_ok()) << name << ": slots > rows";
  bad.num_slots = k;
  bad.kernel = GemvKernel::kMmaDirect;
  EXPECT_FALSE(cuda::launch_quant_gemv(bad, stream()).is_ok()) << name << ": kMmaDirect";
}

TEST(QuantGemvMmaGrouped, TokenSlotsFromTopk) {
  std::vector<TokenSlotsCase> cases;
  cases.push_back({128, 4, randn(128, 91, 2.0f), true});
  std::vector<float> tied = randn(37, 92, 1.0f);
  for (int i : {3, 9, 17, 30}) tied[i] = 1.5f;  // four equal leaders, and more ties below
  tied[11] = tied[12] = tied[36] = 0.75f;
  cases.push_back({37, 3, tied, false});
  std::vector<float> nan(8, std::nanf(""));
  nan[2] = 0.5f, nan[6] = -0.25f;
  cases.push_back({8, 4, nan, true});
  cases.push_back({20, 4, std::vector<float>(20, 0.3f), false});
  for (const TokenSlotsCase& c : cases) {
    run_token_slots(c, QuantFormat::kNvfp4, true);
    run_token_slots(c, QuantFormat::kNvfp4, false);
    run_token_slots(c, QuantFormat::kMxfp8, false);
  }
}

// kMmaDirect's fused SwiGLU on a dense MXFP8 gate|up [2·inter, hidden] (the shared expert and
// the dense MLP at batch 1..8): bf16 and f16 x 2^8 outputs against the CPU, each warp's own
// activation factor (rows of very different magnitudes), rows past N/2 not written.
TEST(QuantGemvDirect, DenseSwigluMatchesCpu) {
  for (const int64_t m : {int64_t{1}, int64_t{3}, int64_t{8}}) {
    const int64_t inter = 520, hidden = 1152;  // 65 tiles, the last one half full
    const QMatrix w = make_matrix(QuantFormat::kMxfp8, 2 * inter, hidden, 41);
    std::vector<float> xf;
    std::vector<uint16_t> xb;
    make_x(m, hidden, 42, &xf, &xb);
    Dev<uint16_t> dx(xb);
    Dev<uint8_t> dw(w.data), ds(w.scale);
    cuda::QuantGemvParams p;
    p.format = QuantFormat::kMxfp8;
    p.x = dx.ptr();
    p.ldx = hidden;
    p.w = dw.ptr();
    p.w_scale = ds.ptr();
    p.num_rows = m;
    p.n = 2 * inter;
    p.k = hidden;
    p.kernel = GemvKernel::kMmaDirect;
    p.epilogue.kind = cuda::GemvEpilogue::kSwigluBf16;
    auto act = Dev<uint16_t>::poisoned(m * inter + 64);
    p.epilogue.act = act.ptr();
    const std::string name = "mxfp8 direct swiglu M" + std::to_string(m);
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok()) << name;
    const auto got = act.host();
    std::vector<float> act_got(m * inter), act_want(m * inter);
    std::vector<double> act_bound(m * inter);
    for (int64_t r = 0; r < m; ++r) {
      swiglu_row_reference(xf.data() + r * hidden, w, inter, hidden, bound_factor(hidden),
                           act_want.data() + r * inter, act_bound.data() + r * inter);
      for (int64_t i = 0; i < inter; ++i) act_got[r * inter + i] = bf16_to_f32(got[r * inter + i]);
    }
    expect_close(act_got, act_want, act_bound, name);
    for (int64_t i = m * inter; i < m * inter + 64; ++i)
      ASSERT_EQ(got[i], 0xFFFFu) << name << ": wrote past the output at " << i;
    p.epilogue.kind = cuda::GemvEpilogue::kSwigluF16;
    auto act16 = Dev<uint16_t>::poisoned(m * inter);
    p.epilogue.act = act16.ptr();
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok()) << name;
    const auto h16 = act16.host();
    for (int64_t i = 0; i < m * inter; ++i)
      ASSERT_LE(std::abs(double(f16_to_f32(h16[i])) / 256.0 - bf16_to_f32(got[i])),
                std::ldexp(1.0, -33))
          << name << ": f16 activation " << i << " is not the bf16 one x 2^8";
    // The gate/up pair tiling of the mma layout: the same bf16 outputs bit for bit (same tiles,
    // same arithmetic); the row tiling is refused with SwiGLU.
    auto dwp = Dev<uint8_t>::poisoned(static_cast<int64_t>(w.data.size()));
    ASSERT_TRUE(cuda::launch_mxfp8_mma_repack(dw.ptr(), dwp.ptr(), 1, 2 * inter, hidden,
                                              mxfp8_mma::Tiling::kSwigluPairs, stream()).is_ok());
    ASSERT_EQ(dwp.host(), mxfp8_mma::pack_matrix(w.data.data(), 1, 2 * inter, hidden,
                                                 mxfp8_mma::Tiling::kSwigluPairs));
    p.w = dwp.ptr();
    p.w_layout = WeightLayout::kMmaSwigluPairs;
    p.epilogue.kind = cuda::GemvEpilogue::kSwigluBf16;
    auto actp = Dev<uint16_t>::poisoned(m * inter);
    p.epilogue.act = actp.ptr();
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok()) << name;
    const auto gotp = actp.host();
    EXPECT_TRUE(std::equal(gotp.begin(), gotp.end(), got.begin())) << name << " mma layout";
    p.w_layout = WeightLayout::kMmaRows16;
    EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok()) << name;
  }
}

// Bad parameters are refused with a message, not launched.
TEST(QuantGemvMmaArgs, RefusesWhatItCannotRun) {
  cuda::QuantGemvParams p;
  p.kernel = GemvKernel::kMmaRing;
  p.format = QuantFormat::kNvfp4;
  p.num_rows = 1;
  p.n = 16;
  p.k = 96;  // not a multiple of 128
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  p.format = QuantFormat::kMxfp8;
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  p.format = QuantFormat::kBf16;
  p.k = 256;
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  p.format = QuantFormat::kMxfp8;
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());  // xh is null
  p.kernel = GemvKernel::kMmaDirect;  // x is null
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());
  p.format = QuantFormat::kNvfp4;
  EXPECT_FALSE(cuda::launch_quant_gemv(p, stream()).is_ok());  // MXFP8 only
}

}  // namespace
}  // namespace m3::cuda_test

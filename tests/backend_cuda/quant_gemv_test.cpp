// The dequantising GEMV kernels (MXFP8 and NVFP4 weights, bf16 activations) against the CPU
// backend's float32 linear on the reference-dequantised weights (src/quant; BF16 for lm_head),
// dense and grouped by
// expert, with both epilogues, at the real MiniMax-M3.1-Flash shapes and at odd ones.
//
// Bound: the GPU and the CPU each compute Σ_k x_k·w_k (x exactly representable: bf16) within
// gamma_{K+2}·Σ|x||w| of the exact value; the GPU applies the block factor to 16- or 32-element
// partial sums, exact for MXFP8 (a power of two) and within 2u for NVFP4 (its global multiplier
// is a rounded reciprocal). So |gpu - cpu| <= (2·gamma_{K+2} + 4u)·Σ|x||w|, with Σ|x||w| from the
// CPU linear on |x|, |W|.
#include <algorithm>
#include <numeric>

#include "backend/cuda/gemm/quant_gemv.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant_matrix.h"

namespace m3::cuda_test {
namespace {

using cuda::QuantFormat;

struct DenseCase {
  QuantFormat f;
  int64_t m, n, k;
};
class QuantGemvDense : public ::testing::TestWithParam<DenseCase> {};

// One dense problem on the device: weights (seed_w), bf16 activations (seed_x), the CPU result
// and Σ|x||w|, the bound (see the top of the file; any summation order of the K products stays
// within gamma_{K+2}), the GEMV parameters for `variant` (its slice count: partial sized for it)
// and the store epilogue into y (poisoned).
struct Dense {
  QMatrix w;
  std::vector<float> xf, want, mag;
  std::vector<double> bound;
  std::vector<uint16_t> xb;
  int64_t slices;
  Dev<uint16_t> dx;
  Dev<uint8_t> dw, ds;
  Dev<float> dg, partial, y;
  cuda::QuantGemvParams p;
  cuda::GemvEpilogueParams e;
  Dense(const DenseCase& c, uint32_t seed_w, uint32_t seed_x, int variant)
      : w(make_matrix(c.f, c.n, c.k, seed_w)),
        xf(randn(c.m * c.k, seed_x, 1.0f)),
        want(c.m * c.n),
        mag(c.m * c.n),
        bound(want.size()),
        xb(to_bf16(&xf)),
        slices(cuda::quant_gemv_num_slices(c.f, c.k, variant)),
        dx(xb),
        dw(w.data),
        ds(w.scale),
        dg(std::vector<float>{w.global}),
        partial(std::vector<float>(slices * c.m * c.n)),
        y(Dev<float>::poisoned(c.m * c.n)) {
    cpu()->linear({xf.data(), w.deq.data(), want.data(), c.m, c.n, c.k, false});
    auto ax = abs_of(xf), aw = abs_of(w.deq);
    cpu()->linear({ax.data(), aw.data(), mag.data(), c.m, c.n, c.k, false});
    for (size_t i = 0; i < want.size(); ++i)
      bound[i] = (2 * gamma(c.k + 2) + 4 * kU) * 1.01 * mag[i] + 1e-30;
    p.format = c.f;
    p.x = dx.ptr();
    p.ldx = c.k;
    p.w = dw.ptr();
    p.w_scale = ds.ptr();
    p.w_global = dg.ptr();
    p.num_rows = c.m;
    p.n = c.n;
    p.k = c.k;
    p.partial = partial.ptr();
    p.variant = variant;
    e.partial = partial.ptr();
    e.num_slices = slices;
    e.num_rows = c.m;
    e.n = c.n;
    e.y = y.ptr();
    e.ldy = c.n;
  }
};

// The GEMV, then its split-K epilogue.
void launch(const cuda::QuantGemvParams& p, const cuda::GemvEpilogueParams& e) {
  ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
  ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
}

TEST_P(QuantGemvDense, MatchesCpuOnDequantisedWeights) {
  const DenseCase c = GetParam();
  Dense d(c, 7, 8, 0);
  const std::vector<float>& want = d.want;
  const std::vector<double>& bound = d.bound;
  cuda::QuantGemvParams& p = d.p;
  cuda::GemvEpilogueParams& e = d.e;
  Dev<float>& y = d.y;
  ASSERT_NO_FATAL_FAILURE(launch(p, e));
  auto y0 = y.host();
  expect_close(y0, want, bound,
               std::string(c.f == QuantFormat::kMxfp8   ? "mxfp8"
                           : c.f == QuantFormat::kNvfp4 ? "nvfp4"
                                                        : "bf16") +
                   " gemv M" +
                   std::to_string(c.m) + " N" + std::to_string(c.n) + " K" + std::to_string(c.k));
  // Variant 1 (8 loads in flight) does the same arithmetic in the same order: bitwise equal.
  p.variant = 1;
  ASSERT_NO_FATAL_FAILURE(launch(p, e));
  EXPECT_EQ(y.host(), y0) << "variant 1 differs from variant 0";
  // Variant 2 (another lane summation order; falls back to 0 where it is not built): same bound.
  p.variant = 2;
  ASSERT_NO_FATAL_FAILURE(launch(p, e));
  expect_close(y.host(), want, bound, "  variant 2");
  // Variant 3 (activations in shared memory, longer K-slices: its own slice count): same bound.
  p.variant = 3;
  e.num_slices = cuda::quant_gemv_num_slices(c.f, c.k, 3);
  ASSERT_LE(e.num_slices, d.slices);
  ASSERT_NO_FATAL_FAILURE(launch(p, e));
  expect_close(y.host(), want, bound, "  variant 3");
}

// Variant 3 alone, at shapes variants 0-2 do not take (K % 32 only) and at the real shapes with
// up to 8 activation rows (several shared-memory passes where rows exceed its capacity).
class QuantGemvV3 : public ::testing::TestWithParam<DenseCase> {};

TEST_P(QuantGemvV3, MatchesCpuOnDequantisedWeights) {
  const DenseCase c = GetParam();
  Dense d(c, 17, 18, 3);
  cuda::QuantGemvParams& p = d.p;
  cuda::GemvEpilogueParams& e = d.e;
  Dev<float>& y = d.y;
  ASSERT_NO_FATAL_FAILURE(launch(p, e));
  // Same bound as above: any summation order of the K products stays within gamma_{K+2}.
  const std::vector<float>& want = d.want;
  const std::vector<double>& bound = d.bound;
  const auto y3 = y.host();
  expect_close(y3, want, bound,
               std::string(c.f == QuantFormat::kMxfp8 ? "mxfp8" : "nvfp4") + " gemv v3 M" +
                   std::to_string(c.m) + " N" + std::to_string(c.n) + " K" + std::to_string(c.k));
  // The fused epilogue sums the same slices in the same order: bitwise equal, twice (the tile
  // counters must come back to zero).
  p.fuse_epilogue = true;
  p.epilogue = e;
  const int64_t counters = cuda::quant_gemv_num_tile_counters(p);
  ASSERT_GT(counters, 0);
  Dev<uint32_t> ctr(std::vector<uint32_t>(counters, 0));
  p.tile_counters = ctr.ptr();
  for (int rep = 0; rep < 2; ++rep) {
    auto yf = Dev<float>::poisoned(c.m * c.n);
    p.epilogue.y = yf.ptr();
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
    EXPECT_EQ(yf.host(), y3) << "fused epilogue differs, launch " << rep;
    EXPECT_EQ(ctr.host(), std::vector<uint32_t>(counters, 0)) << "tile counters not reset";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantGemvV3,
    ::testing::Values(DenseCase{QuantFormat::kMxfp8, 1, 9856, 6144},    // q|k|v|index
                      DenseCase{QuantFormat::kMxfp8, 8, 6144, 8192},    // o_proj, batch 8
                      DenseCase{QuantFormat::kMxfp8, 2, 6144, 3072},    // shared down
                      DenseCase{QuantFormat::kMxfp8, 4, 2000, 12288},   // dense down
                      DenseCase{QuantFormat::kMxfp8, 5, 1000, 1536},    // odd N, K = 3 chunks
                      DenseCase{QuantFormat::kMxfp8, 7, 77, 96},        // K tail inside a chunk
                      DenseCase{QuantFormat::kMxfp8, 3, 13, 2080},      // slice tail
                      DenseCase{QuantFormat::kNvfp4, 1, 6144, 6144},    // expert w1|w3
                      DenseCase{QuantFormat::kNvfp4, 1, 6144, 3072},    // expert w2
                      DenseCase{QuantFormat::kNvfp4, 8, 1000, 3072},    // 2 shared-memory passes
                      DenseCase{QuantFormat::kNvfp4, 6, 1000, 1536},
                      DenseCase{QuantFormat::kNvfp4, 3, 77, 96}));

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantGemvDense,
    ::testing::Values(DenseCase{QuantFormat::kMxfp8, 1, 512, 6144},     // k/v proj
                      DenseCase{QuantFormat::kMxfp8, 3, 1000, 3072},    // odd N, 3 rows
                      DenseCase{QuantFormat::kMxfp8, 5, 6144, 8192},    // o_proj, 5 rows
                      DenseCase{QuantFormat::kMxfp8, 8, 256, 12288},    // dense down, 8 rows
                      DenseCase{QuantFormat::kNvfp4, 1, 6144, 6144},    // expert w1|w3
                      DenseCase{QuantFormat::kNvfp4, 2, 6144, 3072},    // expert w2
                      DenseCase{QuantFormat::kNvfp4, 3, 77, 2048},
                      DenseCase{QuantFormat::kBf16, 1, 4001, 6144},     // lm_head rows
                      DenseCase{QuantFormat::kBf16, 7, 300, 2048}));

// Grouped by expert: tokens × top_k routed rows, each through its expert; SwiGLU epilogue on the
// gate|up product, then the down product with float32 output.
// Routings: distinct experts per token (expert 6 idle), and one where expert 3 takes every
// token (12 rows: more than variant 3 holds in shared memory, so it takes several passes).
struct Routing {
  int64_t tokens;
  std::vector<int32_t> ids;  // [tokens * 3]
};
std::vector<Routing> routings() {
  std::vector<Routing> r;
  r.push_back({5, {0, 3, 7, 3, 5, 7, 1, 3, 4, 0, 2, 5, 1, 2, 3}});
  Routing heavy{12, {}};
  for (int32_t t = 0; t < 12; ++t)
    for (int32_t v : {3, (t % 3) + 4 + (t % 3 >= 2 ? 1 : 0), t % 3}) heavy.ids.push_back(v);
  r.push_back(heavy);
  return r;
}

std::string fmt_name(QuantFormat f, int variant, int64_t tokens) {
  return std::string(f == QuantFormat::kMxfp8 ? "mxfp8" : "nvfp4") + " v" +
         std::to_string(variant) + " T" + std::to_string(tokens);
}

class QuantGemvGrouped : public ::testing::TestWithParam<int> {};  // the GEMV variant

TEST_P(QuantGemvGrouped, ExpertsWithSwigluEpilogue) {
  const int variant = GetParam();
  for (const Routing& routing : routings())
  for (QuantFormat f : {QuantFormat::kNvfp4, QuantFormat::kMxfp8}) {
    const int64_t experts = 8, tokens = routing.tokens, top_k = 3, inter = 1024, hidden = 2048;
    const int64_t rows = tokens * top_k;
    const ExpertSet ex = make_experts(f, experts, inter, hidden, 100, 200);
    const std::vector<int32_t>& ids = routing.ids;
    std::vector<float> xf;
    std::vector<uint16_t> xb;
    bf16_randn(tokens * hidden, 9, 1.0f, &xf, &xb);
    DevRouting route(ids, experts);
    // Exact expectations for the grouping.
    std::vector<int32_t> want_off(experts + 1, 0), want_sorted, want_active;
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < rows; ++r)
        if (ids[r] == e) want_sorted.push_back(int32_t(r));
      want_off[e + 1] = int32_t(want_sorted.size());
      if (want_off[e + 1] > want_off[e]) want_active.push_back(int32_t(e));
    }
    while (want_active.size() < size_t(std::min(experts, rows))) want_active.push_back(-1);
    ASSERT_EQ(route.offs.host(), want_off);
    ASSERT_EQ(route.sorted.host(), want_sorted);
    ASSERT_EQ(route.active.host(), want_active);

    Dev<uint16_t> dx(xb);
    DevExperts dev(ex);
    const int64_t s_up = cuda::quant_gemv_num_slices(f, hidden, variant);
    const int64_t s_dn = cuda::quant_gemv_num_slices(f, inter, variant);
    Dev<float> part_up(std::vector<float>(s_up * rows * 2 * inter)),
        part_dn(std::vector<float>(s_dn * rows * hidden));
    cuda::QuantGemvParams p = grouped_params(f, dev, route, true, inter, hidden);
    p.x = dx.ptr();
    p.x_row_div = top_k;
    p.partial = part_up.ptr();
    p.variant = variant;
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
    auto act = Dev<uint16_t>::poisoned(rows * inter);
    cuda::GemvEpilogueParams e;
    e.kind = cuda::GemvEpilogue::kSwigluBf16;
    e.partial = part_up.ptr();
    e.num_slices = s_up;
    e.num_rows = rows;
    e.n = 2 * inter;
    e.act = act.ptr();
    ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
    auto act_h = act.host();
    if (variant == 3) {  // fused SwiGLU epilogue: bitwise equal to the separate one
      p.fuse_epilogue = true;
      p.epilogue = e;
      const int64_t counters = cuda::quant_gemv_num_tile_counters(p);
      Dev<uint32_t> ctr(std::vector<uint32_t>(counters, 0));
      p.tile_counters = ctr.ptr();
      auto act_f = Dev<uint16_t>::poisoned(rows * inter);
      p.epilogue.act = act_f.ptr();
      ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
      EXPECT_EQ(act_f.host(), act_h) << fmt_name(f, variant, tokens) << " fused swiglu differs";
      EXPECT_EQ(ctr.host(), std::vector<uint32_t>(counters, 0)) << "tile counters not reset";
      p.fuse_epilogue = false;
    }

    // CPU: gate|up per row with the expert's dequantised weights and SwiGLU (quant_matrix.h).
    std::vector<float> act_got(rows * inter), act_want(rows * inter);
    std::vector<double> act_bound(rows * inter);
    for (int64_t r = 0; r < rows; ++r) {
      swiglu_row_reference(xf.data() + (r / top_k) * hidden, ex.up[ids[r]], inter, hidden,
                           (2 * gamma(hidden + 2) + 4 * kU) * 1.01, act_want.data() + r * inter,
                           act_bound.data() + r * inter);
      for (int64_t i = 0; i < inter; ++i)
        act_got[r * inter + i] = bf16_to_f32(act_h[r * inter + i]);
    }
    const std::string fmt = fmt_name(f, variant, tokens);
    expect_close(act_got, act_want, act_bound, fmt + " grouped gate|up + swiglu (bf16)");

    // Down projection of the GPU's bf16 activations (exact inputs for both sides).
    p = grouped_params(f, dev, route, false, inter, hidden);
    p.x = act.ptr();
    p.partial = part_dn.ptr();
    p.variant = variant;
    ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
    auto y = Dev<float>::poisoned(rows * hidden);
    e = {};
    e.partial = part_dn.ptr();
    e.num_slices = s_dn;
    e.num_rows = rows;
    e.n = hidden;
    e.y = y.ptr();
    e.ldy = hidden;
    ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
    std::vector<float> yw;
    std::vector<double> yb;
    down_rows_reference(act_got, ids, ex, inter, hidden, (2 * gamma(inter + 2) + 4 * kU) * 1.01,
                        &yw, &yb);
    const auto y_h = y.host();
    expect_close(y_h, yw, yb, fmt + " grouped down (f32)");
    if (variant == 3) {  // fused f32 epilogue: bitwise equal
      p.fuse_epilogue = true;
      p.epilogue = e;
      const int64_t counters = cuda::quant_gemv_num_tile_counters(p);
      Dev<uint32_t> ctr(std::vector<uint32_t>(counters, 0));
      p.tile_counters = ctr.ptr();
      auto y_f = Dev<float>::poisoned(rows * hidden);
      p.epilogue.y = y_f.ptr();
      ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
      EXPECT_EQ(y_f.host(), y_h) << fmt << " fused down differs";
      EXPECT_EQ(ctr.host(), std::vector<uint32_t>(counters, 0)) << "tile counters not reset";
      p.fuse_epilogue = false;
    }
    if (variant == 0) {
      p.variant = 2;  // the grouped path of variant 2, same bound
      ASSERT_TRUE(cuda::launch_quant_gemv(p, stream()).is_ok());
      ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
      expect_close(y.host(), yw, yb, fmt + " grouped down (f32) variant 2");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, QuantGemvGrouped, ::testing::Values(0, 3));

}  // namespace
}  // namespace m3::cuda_test

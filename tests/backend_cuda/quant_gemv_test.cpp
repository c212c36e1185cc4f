// The split-K GEMV kernels on the CUDA cores (kDequantSplitK for MXFP8 and NVFP4 weights,
// kBf16SplitK for BF16; bf16 activations) against the CPU backend's float32 linear on the
// reference-dequantised weights (src/quant), dense and grouped by expert, with both epilogues, at
// the real MiniMax-M3.1-Flash shapes and at odd ones.
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
// within gamma_{K+2}), the GEMV parameters (the split-K kernel of the format; the partial buffer
// sized for its slice count) and the store epilogue into y (poisoned).
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
  Dense(const DenseCase& c, uint32_t seed_w, uint32_t seed_x)
      : w(make_matrix(c.f, c.n, c.k, seed_w)),
        xf(randn(c.m * c.k, seed_x, 1.0f)),
        want(c.m * c.n),
        mag(c.m * c.n),
        bound(want.size()),
        xb(to_bf16(&xf)),
        slices(cuda::quant_gemv_num_slices(c.f, c.k)),
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
    p.kernel = c.f == QuantFormat::kBf16 ? cuda::GemvKernel::kBf16SplitK
                                         : cuda::GemvKernel::kDequantSplitK;
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

// Activation rows up to 8 (several shared-memory passes of kDequantSplitK where rows exceed its
// capacity), K tails inside a chunk and a slice, odd N.
TEST_P(QuantGemvDense, MatchesCpuOnDequantisedWeights) {
  const DenseCase c = GetParam();
  Dense d(c, 17, 18);
  ASSERT_NO_FATAL_FAILURE(launch(d.p, d.e));
  // Any summation order of the K products stays within gamma_{K+2} (the top of the file).
  expect_close(d.y.host(), d.want, d.bound,
               std::string(c.f == QuantFormat::kMxfp8   ? "mxfp8"
                           : c.f == QuantFormat::kNvfp4 ? "nvfp4"
                                                        : "bf16") +
                   " gemv split-K M" + std::to_string(c.m) + " N" +
                   std::to_string(c.n) + " K" + std::to_string(c.k));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QuantGemvDense,
    ::testing::Values(DenseCase{QuantFormat::kMxfp8, 1, 9856, 6144},    // q|k|v|index
                      DenseCase{QuantFormat::kMxfp8, 8, 6144, 8192},    // o_proj, batch 8
                      DenseCase{QuantFormat::kMxfp8, 2, 6144, 3072},    // shared down
                      DenseCase{QuantFormat::kMxfp8, 4, 2000, 12288},   // dense down
                      DenseCase{QuantFormat::kMxfp8, 1, 512, 6144},     // k/v proj
                      DenseCase{QuantFormat::kMxfp8, 3, 1000, 3072},    // odd N, 3 rows
                      DenseCase{QuantFormat::kMxfp8, 5, 1000, 1536},    // odd N, K = 3 chunks
                      DenseCase{QuantFormat::kMxfp8, 7, 77, 96},        // K tail inside a chunk
                      DenseCase{QuantFormat::kMxfp8, 3, 13, 2080},      // slice tail
                      DenseCase{QuantFormat::kNvfp4, 1, 6144, 6144},    // expert w1|w3
                      DenseCase{QuantFormat::kNvfp4, 1, 6144, 3072},    // expert w2
                      DenseCase{QuantFormat::kNvfp4, 8, 1000, 3072},    // 2 shared-memory passes
                      DenseCase{QuantFormat::kNvfp4, 6, 1000, 1536},
                      DenseCase{QuantFormat::kNvfp4, 3, 77, 2048},
                      DenseCase{QuantFormat::kNvfp4, 3, 77, 96},
                      DenseCase{QuantFormat::kBf16, 1, 4001, 6144},     // lm_head rows
                      DenseCase{QuantFormat::kBf16, 7, 300, 2048}));

// Grouped by expert: tokens × top_k routed rows, each through its expert; SwiGLU epilogue on the
// gate|up product, then the down product with float32 output.
// Routings: distinct experts per token (expert 6 idle), and one where expert 3 takes every
// token (12 rows: more than kDequantSplitK holds in shared memory, so it takes several passes).
// kDequantSplitK (MXFP8 and NVFP4).
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

std::string fmt_name(QuantFormat f, int64_t tokens) {
  return std::string(f == QuantFormat::kMxfp8 ? "mxfp8" : "nvfp4") + " split-K T" +
         std::to_string(tokens);
}

TEST(QuantGemvGrouped, ExpertsWithSwigluEpilogue) {
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
    const int64_t s_up = cuda::quant_gemv_num_slices(f, hidden);
    const int64_t s_dn = cuda::quant_gemv_num_slices(f, inter);
    Dev<float> part_up(std::vector<float>(s_up * rows * 2 * inter)),
        part_dn(std::vector<float>(s_dn * rows * hidden));
    cuda::QuantGemvParams p = grouped_params(f, dev, route, true, inter, hidden);
    p.x = dx.ptr();
    p.x_row_div = top_k;
    p.partial = part_up.ptr();
    p.kernel = cuda::GemvKernel::kDequantSplitK;
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
    const std::string fmt = fmt_name(f, tokens);
    expect_close(act_got, act_want, act_bound, fmt + " grouped gate|up + swiglu (bf16)");

    // Down projection of the GPU's bf16 activations (exact inputs for both sides).
    p = grouped_params(f, dev, route, false, inter, hidden);
    p.x = act.ptr();
    p.partial = part_dn.ptr();
    p.kernel = cuda::GemvKernel::kDequantSplitK;
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
    expect_close(y.host(), yw, yb, fmt + " grouped down (f32)");
  }
}

}  // namespace
}  // namespace m3::cuda_test

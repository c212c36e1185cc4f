// Prefill GEMMs (src/backend/cuda/prefill): exact bf16 dequantisation, the dequantise-then-
// cuBLASLt linear for BF16 / MXFP8 / NVFP4 weights (tiled through a small scratch buffer so that
// several tiles run), and the routed-expert prefill MoE, against the CPU backend's float32 ops on
// the reference-dequantised weights (src/quant).
//
// Linear bound: x is bf16 and every dequantised weight is a bf16 number, so each product is exact
// in float32; the CPU sums K products within gamma_{K+2}·Σ|x||w| of the exact value and the GPU
// within 2·gamma_{K+2}·Σ|x||w| (the tensor cores' float32 accumulation is allowed truncation
// instead of rounding: unit roundoff 2u), plus 4u for the NVFP4 multiplier (a rounded reciprocal,
// applied after the sum on the GPU and per block on the CPU). bf16 output adds its rounding,
// 2^-8·|y|. So |gpu - cpu| <= (3·gamma_{K+2} + 4u)·Σ|x||w| (+ 2^-8·(|cpu| + that)).
//
// MoE bound, per routed (token, slot) (derived in double on the host, from the CPU's values):
//   gate/up h: δh = (3·gamma_{Hd+2} + 4u)·Σ|x||w13|;
//   act = SwiGLU-OAI(g, u) is rounded to bf16 on the GPU (not on the CPU): with
//   |∂act/∂g| <= (1 + α(|g| + δg)/4)·(|clamp(u)| + 1 + δu) and |∂act/∂u| <= |min(g, L)| + δg,
//   Δact = D + 2^-8·(|act| + D) + 8u·|act|, D = |∂act/∂g|·δg + |∂act/∂u|·δu (8u: expf and the
//   three float32 operations, both sides);
//   down: Δo = Σ_i Δact_i·|w2_i| + (3·gamma_{I+2} + 4u)·Σ_i (|act_i| + Δact_i)·|w2_i|;
//   combine over K slots: Σ_s |w_s|·Δo_s + 2·gamma_{K+1}·Σ_s |w_s|·(|o_s| + Δo_s).
// The bound holds for all MoE kernels (kDequantCublas, kGroupedInLoop, kGroupedWgmma): all
// multiply the same bf16 activations by the same exact bf16 weight values with float32
// accumulation (in different orders: cuBLASLt's, mma.sync's, wgmma's), apply the NVFP4 multiplier
// to the float32 sums, and round act to bf16 once. So two kernels differ by at most twice the
// bound, which the kernel-vs-kernel comparisons use.
//
// The grouped expert GEMM is also tested alone (GroupedExpertGemm below: one launch, each
// epilogue, against the CPU per element with the linear / SwiGLU bounds above), so that a failing
// main loop shows which rows and columns of the 128 x 128 tile are wrong.
#include <algorithm>
#include <cstring>
#include <numeric>

#include <cuda_runtime.h>

#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant/mxfp8.h"
#include "quant/mxfp8_mma_layout.h"
#include "quant/nvfp4.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda_test {
namespace {

using cuda::PrefillOut;
using cuda::QuantFormat;
using cuda::WeightLayout;

cuda::CachingAllocator* allocator() {
  static cuda::CachingAllocator a;
  return &a;
}

// G matrices [n, k] of one format back to back, with their dequantised float copies (global
// included) and the bf16-exact values without the NVFP4 global.
struct QMatrices {
  std::vector<uint8_t> data, scale;
  std::vector<float> global;      // [G] NVFP4 multipliers
  std::vector<float> deq;         // [G, n, k] with the global
  std::vector<float> deq_local;   // [G, n, k] without (what launch_dequant_bf16 writes)
};

QMatrices make_matrices(QuantFormat f, int64_t g, int64_t n, int64_t k, uint32_t seed) {
  QMatrices m;
  for (int64_t e = 0; e < g; ++e) {
    auto w = randn(n * k, seed + static_cast<uint32_t>(e), 0.02f);
    std::vector<float> deq(w.size()), local(w.size());
    if (f == QuantFormat::kBf16) {
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t b = f32_to_bf16(w[i]);
        m.data.push_back(static_cast<uint8_t>(b & 0xFF));
        m.data.push_back(static_cast<uint8_t>(b >> 8));
        deq[i] = local[i] = bf16_to_f32(b);
      }
      m.global.push_back(1.0f);
    } else if (f == QuantFormat::kMxfp8) {
      auto q = quantize_mxfp8(w.data(), n, k);
      EXPECT_TRUE(q.is_ok());
      m.data.insert(m.data.end(), q->codes.begin(), q->codes.end());
      m.scale.insert(m.scale.end(), q->scales.begin(), q->scales.end());
      EXPECT_TRUE(dequantize_mxfp8(q->codes.data(), q->scales.data(), n, k, deq.data()).is_ok());
      local = deq;
      m.global.push_back(1.0f);
    } else {
      auto q = quantize_nvfp4(w.data(), n, k, Nvfp4GlobalScale::kDivide);
      EXPECT_TRUE(q.is_ok());
      m.data.insert(m.data.end(), q->packed.begin(), q->packed.end());
      m.scale.insert(m.scale.end(), q->scales.begin(), q->scales.end());
      m.global.push_back(1.0f / q->global_scale);
      EXPECT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), q->global_scale,
                                   Nvfp4GlobalScale::kDivide, n, k, deq.data())
                      .is_ok());
      EXPECT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), 1.0f,
                                   Nvfp4GlobalScale::kMultiply, n, k, local.data())
                      .is_ok());
    }
    m.deq.insert(m.deq.end(), deq.begin(), deq.end());
    m.deq_local.insert(m.deq_local.end(), local.begin(), local.end());
  }
  if (m.scale.empty()) m.scale.assign(16, 0);
  return m;
}

struct Uploaded {
  Dev<uint8_t> w, s;
  Dev<float> g;
  explicit Uploaded(const QMatrices& m) : w(m.data), s(m.scale), g(m.global) {}
  cuda::QuantWeight view(QuantFormat f, int64_t n, int64_t k) {
    cuda::QuantWeight q;
    q.format = f;
    q.w = w.ptr();
    q.w_scale = s.ptr();
    q.w_global = f == QuantFormat::kNvfp4 ? g.ptr() : nullptr;
    q.n = n;
    q.k = k;
    return q;
  }
};

const char* name_of(QuantFormat f) {
  return f == QuantFormat::kMxfp8 ? "mxfp8" : f == QuantFormat::kNvfp4 ? "nvfp4" : "bf16";
}

// ---- exact dequantisation ----

TEST(PrefillDequant, ExactForMxfp8AndNvfp4) {
  for (QuantFormat f : {QuantFormat::kMxfp8, QuantFormat::kNvfp4}) {
    const int64_t n = 200, k = 512, row0 = 8, rows = 150;
    QMatrices m = make_matrices(f, 1, n, k, 11);
    Uploaded up(m);
    auto out = Dev<uint16_t>::poisoned(rows * k);
    ASSERT_TRUE(cuda::launch_dequant_bf16({up.view(f, n, k), row0, rows, out.ptr()}, stream())
                    .is_ok());
    auto got = out.host();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < rows * k; ++i) {
      const float want = m.deq_local[static_cast<size_t>(row0 * k + i)];
      if (bf16_to_f32(got[static_cast<size_t>(i)]) != want) ++mismatches;
    }
    std::printf("[ %-40s ] n=%lld mismatches=%lld (exact)\n",
                (std::string("dequant_bf16 ") + name_of(f)).c_str(),
                static_cast<long long>(rows * k), static_cast<long long>(mismatches));
    EXPECT_EQ(mismatches, 0) << name_of(f);
  }
}

// NVFP4 in the mma layouts the model serves routed experts in (gate|up in row pairs, down in
// 16-row tiles): the same exact values over row windows that cut tiles, cross the gate/up halves,
// or hold one half only (the dequantisation walks the storage and skips rows outside).
TEST(PrefillDequant, ExactForNvfp4FromTheMmaLayouts) {
  struct Case {
    WeightLayout layout;
    nvfp4_mma::Tiling tiling;
    int64_t n, k, row0, rows;
  };
  const auto pairs = WeightLayout::kMmaSwigluPairs;
  const auto rows16 = WeightLayout::kMmaRows16;
  for (const Case c : {Case{rows16, nvfp4_mma::Tiling::kRows16, 192, 512, 0, 192},
                       Case{rows16, nvfp4_mma::Tiling::kRows16, 192, 512, 8, 150},
                       Case{pairs, nvfp4_mma::Tiling::kSwigluPairs, 192, 384, 0, 192},
                       Case{pairs, nvfp4_mma::Tiling::kSwigluPairs, 192, 384, 8, 80},
                       Case{pairs, nvfp4_mma::Tiling::kSwigluPairs, 192, 384, 72, 50},
                       Case{pairs, nvfp4_mma::Tiling::kSwigluPairs, 192, 384, 100, 92}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " rows " +
                 std::to_string(c.row0) + " + " + std::to_string(c.rows) +
                 (c.layout == pairs ? " (pairs)" : " (16-row tiles)"));
    QMatrices m = make_matrices(QuantFormat::kNvfp4, 1, c.n, c.k, 13);
    m.data = nvfp4_mma::pack_matrix(m.data.data(), 1, c.n, c.k, c.tiling);
    Uploaded up(m);
    cuda::QuantWeight w = up.view(QuantFormat::kNvfp4, c.n, c.k);
    w.layout = c.layout;
    auto out = Dev<uint16_t>::poisoned(c.rows * c.k);
    ASSERT_TRUE(cuda::launch_dequant_bf16({w, c.row0, c.rows, out.ptr()}, stream()).is_ok());
    const auto got = out.host();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < c.rows * c.k; ++i)
      mismatches += bf16_to_f32(got[static_cast<size_t>(i)]) !=
                    m.deq_local[static_cast<size_t>(c.row0 * c.k + i)];
    EXPECT_EQ(mismatches, 0);
  }
}

// ---- dense linear ----

struct LinearCase {
  QuantFormat f;
  int64_t m, n, k;
  PrefillOut out;
  bool accumulate;
  int64_t scratch;  // bytes; small values force several tiles
};

class PrefillLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(PrefillLinear, MatchesCpuOnDequantisedWeights) {
  const LinearCase c = GetParam();
  QMatrices w = make_matrices(c.f, 1, c.n, c.k, 7);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(c.m * c.k, 8, 1.0f, &xf, &xb);
  std::vector<float> want(c.m * c.n), mag(c.m * c.n);
  std::vector<float> y0 = randn(c.m * c.n, 9, 1.0f);
  if (c.accumulate) want = y0;
  cpu()->linear({xf.data(), w.deq.data(), want.data(), c.m, c.n, c.k, c.accumulate});
  auto ax = abs_of(xf), aw = abs_of(w.deq);
  cpu()->linear({ax.data(), aw.data(), mag.data(), c.m, c.n, c.k, false});

  auto gemm = cuda::PrefillGemm::create(allocator(), c.scratch);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  Uploaded up(w);
  Dev<uint16_t> dx(xb);
  cuda::PrefillLinearParams p;
  p.x = dx.ptr();
  p.ldx = c.k;
  p.m = c.m;
  p.w = up.view(c.f, c.n, c.k);
  p.ldy = c.n;
  p.out = c.out;
  p.accumulate = c.accumulate;
  std::vector<float> got;
  if (c.out == PrefillOut::kF32) {
    auto y = c.accumulate ? Dev<float>(y0) : Dev<float>::poisoned(c.m * c.n);
    p.y = y.ptr();
    Status st = (*gemm)->linear(p, stream());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    got = y.host();
  } else {
    auto y = Dev<uint16_t>::poisoned(c.m * c.n);
    p.y = y.ptr();
    Status st = (*gemm)->linear(p, stream());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (uint16_t b : y.host()) got.push_back(bf16_to_f32(b));
  }
  std::vector<double> bound(got.size());
  const double rel = 3 * gamma(static_cast<double>(c.k + 2)) + 4 * kU;
  for (size_t i = 0; i < bound.size(); ++i) {
    double b = rel * mag[i] + (c.accumulate ? 2 * kU * (std::abs(want[i]) + mag[i]) : 0.0);
    if (c.out == PrefillOut::kBf16) b += std::ldexp(1.0, -8) * (std::abs(want[i]) + b);
    bound[i] = b + 1e-30;
  }
  char what[96];
  std::snprintf(what, sizeof(what), "prefill linear %s M=%lld N=%lld K=%lld%s%s", name_of(c.f),
                static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), c.out == PrefillOut::kBf16 ? " bf16" : "",
                c.accumulate ? " acc" : "");
  expect_close(got, want, bound, what);
}

constexpr int64_t kMiB = 1 << 20;
INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillLinear,
    ::testing::Values(
        // Several tiles: 1 MiB scratch holds 256 rows of K = 2048 (bf16).
        LinearCase{QuantFormat::kMxfp8, 192, 640, 2048, PrefillOut::kF32, false, kMiB},
        LinearCase{QuantFormat::kNvfp4, 192, 640, 2048, PrefillOut::kF32, false, kMiB},
        LinearCase{QuantFormat::kBf16, 192, 640, 2048, PrefillOut::kF32, false, kMiB},
        LinearCase{QuantFormat::kMxfp8, 130, 520, 1024, PrefillOut::kF32, true, kMiB},
        LinearCase{QuantFormat::kNvfp4, 128, 384, 1024, PrefillOut::kBf16, false, kMiB},
        // Real shapes (qkv + indexer projection, o_proj) at T = 128.
        LinearCase{QuantFormat::kMxfp8, 128, 9856, 6144, PrefillOut::kF32, false, 128 * kMiB},
        LinearCase{QuantFormat::kMxfp8, 128, 6144, 8192, PrefillOut::kF32, false, 64 * kMiB}));

// ---- routed experts ----

enum class Routing : int {
  kSkewed = 0,     // expert 0 popular, the last unused (distinct experts per token)
  kUniform = 1,    // distinct experts per token, uniform
  kEdgeCounts = 2, // expert 0: 1 row, 1: 0 rows, 2: 129 rows, 3: 300 rows (slot 0), rest uniform
  kOneExpert = 3,  // every row on expert 2
};

struct MoeCase {
  QuantFormat format;
  cuda::PrefillMoeKernel kernel;
  bool mma_layout;  // NVFP4 / MXFP8 weights in the mma layouts the model repacks to
  int64_t t, hidden, inter, experts, top_k;
  Routing routing;
  bool with_dropped;  // two slots get ids outside [0, E) (-1 and E)
};

const char* name_of(cuda::PrefillMoeKernel k) {
  switch (k) {
    case cuda::PrefillMoeKernel::kDequantCublas: return "cublas";
    case cuda::PrefillMoeKernel::kGroupedInLoop: return "grouped";
    case cuda::PrefillMoeKernel::kGroupedWgmma: return "grouped-wgmma";
    case cuda::PrefillMoeKernel::kGroupedWgmmaRegisterWeights: return "grouped-wgmma-regw";
  }
  return "?";
}

bool is_grouped(cuda::PrefillMoeKernel k) { return k != cuda::PrefillMoeKernel::kDequantCublas; }

std::string name_of(const MoeCase& c) {
  char b[160];
  std::snprintf(b, sizeof(b),
                "prefill moe %s %s%s T=%lld Hd=%lld I=%lld E=%lld K=%lld routing %d%s",
                name_of(c.format), name_of(c.kernel),
                c.mma_layout ? " mma-layout" : "", static_cast<long long>(c.t),
                static_cast<long long>(c.hidden), static_cast<long long>(c.inter),
                static_cast<long long>(c.experts), static_cast<long long>(c.top_k),
                static_cast<int>(c.routing), c.with_dropped ? " dropped" : "");
  return b;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> wts;
};

Routed make_routing(const MoeCase& c, uint32_t seed) {
  Routed r;
  r.ids.resize(static_cast<size_t>(c.t * c.top_k));
  r.wts.resize(r.ids.size());
  std::mt19937 rng(seed);
  for (int64_t t = 0; t < c.t; ++t) {
    std::vector<int32_t> chosen;
    if (c.routing == Routing::kOneExpert) {
      chosen.assign(static_cast<size_t>(c.top_k), 2);
    } else {
      int32_t first = -1, lo = 0;
      if (c.routing == Routing::kEdgeCounts) {
        first = t == 0 ? 0 : t <= 129 ? 2 : t <= 429 ? 3 : -1;
        lo = 4;  // the other slots avoid experts 0..3 so that their counts stay as stated
      }
      std::vector<int32_t> pool;
      const int32_t hi = c.routing == Routing::kSkewed ? static_cast<int32_t>(c.experts) - 1
                                                       : static_cast<int32_t>(c.experts);
      for (int32_t e = lo; e < hi; ++e) pool.push_back(e);
      std::shuffle(pool.begin(), pool.end(), rng);
      if (c.routing == Routing::kSkewed && t % 3 == 0) {
        pool[0] = 0;
        std::swap(pool[0], pool[static_cast<size_t>(t % c.top_k)]);
      }
      if (first >= 0) chosen.push_back(first);
      for (size_t i = 0; static_cast<int64_t>(chosen.size()) < c.top_k; ++i)
        chosen.push_back(pool[i]);
      std::sort(chosen.begin(), chosen.end());
      chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
      while (static_cast<int64_t>(chosen.size()) < c.top_k) chosen.push_back(hi - 1);
    }
    for (int64_t s = 0; s < c.top_k; ++s) {
      r.ids[t * c.top_k + s] = chosen[static_cast<size_t>(s)];
      r.wts[t * c.top_k + s] = 0.25f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
  if (c.with_dropped) {
    r.ids[static_cast<size_t>(c.top_k + 1 < c.t * c.top_k ? c.top_k + 1 : 0)] = -1;
    r.ids[static_cast<size_t>(c.t * c.top_k - 1)] = static_cast<int32_t>(c.experts);
  }
  return r;
}

// CPU float32 reference of the tokens `tokens` (rows of want) and the bound in double (header).
void moe_reference(const MoeCase& c, const std::vector<float>& xf, const Routed& r,
                   const QMatrices& w13, const QMatrices& w2, const std::vector<int64_t>& tokens,
                   std::vector<float>* want, std::vector<double>* bound) {
  const int64_t nt = static_cast<int64_t>(tokens.size());
  std::vector<const float*> p13(c.experts), p2(c.experts);
  for (int64_t e = 0; e < c.experts; ++e) {
    p13[e] = w13.deq.data() + e * 2 * c.inter * c.hidden;
    p2[e] = w2.deq.data() + e * c.hidden * c.inter;
  }
  std::vector<float> x(nt * c.hidden), wts(nt * c.top_k);
  std::vector<int32_t> ids(nt * c.top_k);
  for (int64_t i = 0; i < nt; ++i) {
    const int64_t t = tokens[static_cast<size_t>(i)];
    std::copy_n(xf.begin() + t * c.hidden, c.hidden, x.begin() + i * c.hidden);
    for (int64_t s = 0; s < c.top_k; ++s) {
      const int32_t e = r.ids[t * c.top_k + s];
      const bool ok = e >= 0 && e < c.experts;
      ids[i * c.top_k + s] = ok ? e : 0;  // a dropped slot contributes 0
      wts[i * c.top_k + s] = ok ? r.wts[t * c.top_k + s] : 0.0f;
    }
  }
  want->assign(static_cast<size_t>(nt * c.hidden), 0.0f);
  MoeExpertsParams mp;
  mp.x = x.data();
  mp.w13 = p13.data();
  mp.w2 = p2.data();
  mp.topk_ids = ids.data();
  mp.topk_weights = wts.data();
  mp.out = want->data();
  mp.m = nt;
  mp.hidden = c.hidden;
  mp.inter = c.inter;
  mp.num_experts = c.experts;
  mp.top_k = c.top_k;
  cpu()->moe_experts(mp);

  const double alpha = 1.702, lim = 7.0;
  const double d1 = 3 * gamma(static_cast<double>(c.hidden + 2)) + 4 * kU;
  const double d2 = 3 * gamma(static_cast<double>(c.inter + 2)) + 4 * kU;
  const double dk = 2 * gamma(static_cast<double>(c.top_k + 1));
  bound->assign(want->size(), 1e-30);
  for (int64_t ti = 0; ti < nt; ++ti) {
    for (int64_t s = 0; s < c.top_k; ++s) {
      const double wt = std::abs(wts[ti * c.top_k + s]);
      if (wt == 0.0) continue;
      const int32_t e = ids[ti * c.top_k + s];
      const float* xr = x.data() + ti * c.hidden;
      std::vector<double> act(c.inter), dact(c.inter);
      for (int64_t i = 0; i < c.inter; ++i) {
        double g = 0, u = 0, mg = 0, mu = 0;
        const float* wg = p13[e] + i * c.hidden;
        const float* wu = p13[e] + (c.inter + i) * c.hidden;
        for (int64_t j = 0; j < c.hidden; ++j) {
          g += double(xr[j]) * wg[j], u += double(xr[j]) * wu[j];
          mg += std::abs(double(xr[j]) * wg[j]), mu += std::abs(double(xr[j]) * wu[j]);
        }
        const double dg = d1 * mg, du = d1 * mu;
        const double gc = std::min(g, lim), uc = std::clamp(u, -lim, lim);
        const double a = gc / (1 + std::exp(-alpha * gc)) * (uc + 1);
        const double dadg = (1 + alpha * (std::abs(g) + dg) / 4) * (std::abs(uc) + 1 + du);
        const double dadu = std::abs(gc) + dg;
        const double dd = dadg * dg + dadu * du;
        act[i] = a;
        dact[i] = dd + std::ldexp(1.0, -8) * (std::abs(a) + dd) + 8 * kU * std::abs(a);
      }
      for (int64_t n = 0; n < c.hidden; ++n) {
        const float* wd = p2[e] + n * c.inter;
        double o = 0, m1 = 0, m2 = 0;
        for (int64_t i = 0; i < c.inter; ++i) {
          o += act[i] * wd[i];
          m1 += dact[i] * std::abs(wd[i]);
          m2 += (std::abs(act[i]) + dact[i]) * std::abs(wd[i]);
        }
        const double d_o = m1 + d2 * m2;
        (*bound)[ti * c.hidden + n] += wt * d_o + dk * wt * (std::abs(o) + d_o);
      }
    }
  }
}

// The device weights of one MoE case (optionally repacked into the mma layouts: gate|up in
// gate/up row pairs, down in tiles of 16 rows, as CudaM3Model::repack_nvfp4 does).
struct MoeWeights {
  QMatrices w13, w2;
  std::unique_ptr<Uploaded> u13, u2;
  WeightLayout l13 = WeightLayout::kRowMajor, l2 = WeightLayout::kRowMajor;
  explicit MoeWeights(const MoeCase& c)
      : w13(make_matrices(c.format, c.experts, 2 * c.inter, c.hidden, 100)),
        w2(make_matrices(c.format, c.experts, c.hidden, c.inter, 300)) {
    QMatrices p13, p2;  // what goes to the device: codes (maybe repacked), scales, globals
    p13.data = w13.data, p13.scale = w13.scale, p13.global = w13.global;
    p2.data = w2.data, p2.scale = w2.scale, p2.global = w2.global;
    if (c.mma_layout) {
      l13 = WeightLayout::kMmaSwigluPairs;
      l2 = WeightLayout::kMmaRows16;
      if (c.format == QuantFormat::kNvfp4) {
        p13.data = nvfp4_mma::pack_matrix(w13.data.data(), c.experts, 2 * c.inter, c.hidden,
                                          nvfp4_mma::Tiling::kSwigluPairs);
        p2.data = nvfp4_mma::pack_matrix(w2.data.data(), c.experts, c.hidden, c.inter,
                                         nvfp4_mma::Tiling::kRows16);
      } else {
        p13.data = mxfp8_mma::pack_matrix(w13.data.data(), c.experts, 2 * c.inter, c.hidden,
                                          mxfp8_mma::Tiling::kSwigluPairs);
        p2.data = mxfp8_mma::pack_matrix(w2.data.data(), c.experts, c.hidden, c.inter,
                                         mxfp8_mma::Tiling::kRows16);
      }
    }
    u13 = std::make_unique<Uploaded>(p13);
    u2 = std::make_unique<Uploaded>(p2);
  }
  void set(const MoeCase& c, cuda::PrefillMoeParams* p) {
    p->w13 = u13->view(c.format, 2 * c.inter, c.hidden);
    p->w13.layout = l13;
    p->w2 = u2->view(c.format, c.hidden, c.inter);
    p->w2.layout = l2;
  }
};

// Runs moe() on the device; out is [T, hidden].
std::vector<float> run_moe(const MoeCase& c, cuda::PrefillMoeKernel kernel, MoeWeights& w,
                           Dev<uint16_t>& dx, const Routed& r, int64_t* active = nullptr) {
  Dev<int32_t> did(r.ids);
  Dev<float> dw(r.wts);
  auto out = Dev<float>::poisoned(c.t * c.hidden);
  auto gemm = cuda::PrefillGemm::create(allocator(), 8 * kMiB);
  EXPECT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  if (!gemm.is_ok()) return {};
  cuda::PrefillMoeParams p;
  p.x = dx.ptr();
  p.topk_ids = did.ptr();
  p.topk_weights = dw.ptr();
  w.set(c, &p);
  p.out = out.ptr();
  p.t = c.t;
  p.hidden = c.hidden;
  p.inter = c.inter;
  p.num_experts = c.experts;
  p.top_k = c.top_k;
  p.kernel = kernel;
  const Status st = (*gemm)->moe(p, stream());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (active != nullptr) *active = (*gemm)->last_moe_stats().active_experts;
  // The grouped kernels never count experts on the host: 0 shows one ran (no silent fallback).
  if (is_grouped(kernel)) {
    EXPECT_EQ((*gemm)->last_moe_stats().active_experts, 0) << name_of(c) << ": fell back";
  }
  return out.host();
}

std::vector<int64_t> all_tokens(int64_t t) {
  std::vector<int64_t> v(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

class PrefillMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(PrefillMoe, MatchesCpuMoeExperts) {
  const MoeCase c = GetParam();
  MoeWeights w(c);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(c.t * c.hidden, 21, 1.0f, &xf, &xb);
  const Routed r = make_routing(c, 5);
  std::vector<float> want;
  std::vector<double> bound;
  moe_reference(c, xf, r, w.w13, w.w2, all_tokens(c.t), &want, &bound);

  Dev<uint16_t> dx(xb);
  int64_t active = -1;
  const std::vector<float> got = run_moe(c, c.kernel, w, dx, r, &active);
  if (c.kernel == cuda::PrefillMoeKernel::kDequantCublas && c.routing == Routing::kSkewed) {
    EXPECT_EQ(active, c.experts - 1);
  }
  expect_close(got, want, bound, name_of(c));
  if (is_grouped(c.kernel)) {
    // Against the dequantise-then-cuBLASLt kernel: both within `bound` of the CPU.
    const std::vector<float> old = run_moe(c, cuda::PrefillMoeKernel::kDequantCublas, w, dx, r);
    std::vector<double> twice(bound.size());
    for (size_t i = 0; i < bound.size(); ++i) twice[i] = 2 * bound[i];
    expect_close(got, old, twice, name_of(c) + " vs cublas");
    if (c.kernel == cuda::PrefillMoeKernel::kGroupedWgmma ||
        c.kernel == cuda::PrefillMoeKernel::kGroupedWgmmaRegisterWeights) {
      const std::vector<float> mma = run_moe(c, cuda::PrefillMoeKernel::kGroupedInLoop, w, dx, r);
      expect_close(got, mma, twice, name_of(c) + " vs mma.sync grouped");
    }
    // Deterministic: the same bits on a second run.
    const std::vector<float> again = run_moe(c, c.kernel, w, dx, r);
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << name_of(c) << ": second run differs";
  }
}

constexpr auto kCublas = cuda::PrefillMoeKernel::kDequantCublas;
constexpr auto kGrouped = cuda::PrefillMoeKernel::kGroupedInLoop;
constexpr auto kWgmma = cuda::PrefillMoeKernel::kGroupedWgmma;
constexpr auto kRegW = cuda::PrefillMoeKernel::kGroupedWgmmaRegisterWeights;
constexpr auto kNv = QuantFormat::kNvfp4;
constexpr auto kMx = QuantFormat::kMxfp8;

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefillMoe,
    ::testing::Values(
        // The dequantise-then-cuBLASLt kernel (shapes the grouped kernel does not take too).
        MoeCase{kNv, kCublas, false, 96, 512, 256, 9, 2, Routing::kSkewed, false},
        MoeCase{kNv, kCublas, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        // The grouped kernel: both formats, both layouts, ragged and empty experts, dropped ids.
        MoeCase{kNv, kGrouped, false, 96, 512, 256, 9, 2, Routing::kSkewed, false},
        MoeCase{kNv, kGrouped, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        MoeCase{kMx, kGrouped, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        MoeCase{kNv, kGrouped, true, 200, 1024, 512, 17, 4, Routing::kUniform, true},
        MoeCase{kMx, kGrouped, true, 200, 1024, 512, 17, 4, Routing::kUniform, false},
        MoeCase{kNv, kGrouped, false, 512, 256, 128, 8, 2, Routing::kEdgeCounts, true},
        MoeCase{kMx, kGrouped, true, 512, 256, 128, 8, 2, Routing::kEdgeCounts, false},
        MoeCase{kNv, kGrouped, true, 300, 256, 256, 5, 1, Routing::kOneExpert, false},
        MoeCase{kMx, kGrouped, false, 300, 256, 256, 5, 1, Routing::kOneExpert, true},
        MoeCase{kNv, kGrouped, false, 1, 256, 128, 4, 2, Routing::kUniform, false},
        // The wgmma main loop on the same cases.
        MoeCase{kNv, kWgmma, false, 96, 512, 256, 9, 2, Routing::kSkewed, false},
        MoeCase{kNv, kWgmma, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        MoeCase{kMx, kWgmma, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        MoeCase{kNv, kWgmma, true, 200, 1024, 512, 17, 4, Routing::kUniform, true},
        MoeCase{kMx, kWgmma, true, 200, 1024, 512, 17, 4, Routing::kUniform, false},
        MoeCase{kNv, kWgmma, false, 512, 256, 128, 8, 2, Routing::kEdgeCounts, true},
        MoeCase{kMx, kWgmma, true, 512, 256, 128, 8, 2, Routing::kEdgeCounts, false},
        MoeCase{kNv, kWgmma, true, 300, 256, 256, 5, 1, Routing::kOneExpert, false},
        MoeCase{kMx, kWgmma, false, 300, 256, 256, 5, 1, Routing::kOneExpert, true},
        MoeCase{kNv, kWgmma, false, 1, 256, 128, 4, 2, Routing::kUniform, false},
        // The register-weights loop (NVFP4 in the mma layouts; the other weights take the wgmma
        // loop): hidden 1024 / 256 gives 256-row CTAs for both matrices, inter 512 / 128 for
        // the down projection's K.
        MoeCase{kNv, kRegW, true, 200, 1024, 512, 17, 4, Routing::kUniform, true},
        MoeCase{kNv, kRegW, true, 200, 1024, 512, 17, 4, Routing::kSkewed, false},
        MoeCase{kNv, kRegW, true, 512, 256, 128, 8, 2, Routing::kEdgeCounts, true},
        MoeCase{kNv, kRegW, true, 300, 256, 256, 5, 1, Routing::kOneExpert, false},
        MoeCase{kNv, kRegW, true, 1, 256, 128, 4, 2, Routing::kUniform, false},
        MoeCase{kNv, kRegW, false, 200, 1024, 512, 17, 4, Routing::kSkewed, true},
        MoeCase{kMx, kRegW, true, 200, 1024, 512, 17, 4, Routing::kUniform, false}));

// One layer at the real expert shape (hidden 6144, inter 3072) and T = 8K, NVFP4 in the model's
// mma layouts, 2 experts at top-1 (each gets ~4K rows, 32 row tiles, as 128 experts at top-4
// would get 256; fewer experts keep the host-side quantisation and reference within seconds).
// The CPU reference covers every 512th token (the rigorous check); the whole output is compared
// with the cuBLASLt kernel within twice the largest sampled bound (catches tiling and indexing
// errors, which are O(|out|)).
void real_shape_t8k(cuda::PrefillMoeKernel kernel) {
  const MoeCase c{kNv, kernel, true, 8192, 6144, 3072, 2, 1, Routing::kUniform, true};
  MoeWeights w(c);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(c.t * c.hidden, 77, 1.0f, &xf, &xb);
  const Routed r = make_routing(c, 9);
  std::vector<int64_t> tokens;
  for (int64_t t = 0; t < c.t; t += 512) tokens.push_back(t);
  tokens.push_back(c.t - 1);
  std::vector<float> want;
  std::vector<double> bound;
  moe_reference(c, xf, r, w.w13, w.w2, tokens, &want, &bound);
  Dev<uint16_t> dx(xb);
  const std::vector<float> got = run_moe(c, kernel, w, dx, r);
  const std::vector<float> old = run_moe(c, kCublas, w, dx, r);
  ASSERT_EQ(got.size(), static_cast<size_t>(c.t * c.hidden));
  ASSERT_EQ(old.size(), got.size());
  auto rows_of = [&](const std::vector<float>& v) {
    std::vector<float> o;
    for (int64_t t : tokens)
      o.insert(o.end(), v.begin() + t * c.hidden, v.begin() + (t + 1) * c.hidden);
    return o;
  };
  expect_close(rows_of(got), want, bound, name_of(c) + " sampled tokens");
  expect_close(rows_of(old), want, bound, name_of(c) + " cublas sampled tokens");
  const double tol = 2 * *std::max_element(bound.begin(), bound.end());
  expect_close(got, old, std::vector<double>(got.size(), tol), name_of(c) + " vs cublas");
}

TEST(PrefillMoeRealShape, Nvfp4T8K) { real_shape_t8k(kGrouped); }
TEST(PrefillMoeRealShape, Nvfp4T8KWgmma) { real_shape_t8k(kWgmma); }
TEST(PrefillMoeRealShape, Nvfp4T8KWgmmaRegisterWeights) { real_shape_t8k(kRegW); }

// The whole grouped moe() call captured in a CUDA graph (no host sync, no host reads) and
// replayed: the same bits as the eager call. The eager call first warms the caching allocator, so
// the capture allocates nothing from the driver; the replays reuse the same blocks.
void graph_capture_replays(cuda::PrefillMoeKernel kernel) {
  const MoeCase c{kNv, kernel, true, 200, 1024, 512, 17, 4, Routing::kSkewed, true};
  MoeWeights w(c);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(c.t * c.hidden, 21, 1.0f, &xf, &xb);
  const Routed r = make_routing(c, 5);
  Dev<uint16_t> dx(xb);
  Dev<int32_t> did(r.ids);
  Dev<float> dw(r.wts);
  auto out = Dev<float>::poisoned(c.t * c.hidden);
  auto gemm = cuda::PrefillGemm::create(allocator(), 8 * kMiB);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  cuda::PrefillMoeParams p;
  p.x = dx.ptr();
  p.topk_ids = did.ptr();
  p.topk_weights = dw.ptr();
  w.set(c, &p);
  p.out = out.ptr();
  p.t = c.t;
  p.hidden = c.hidden;
  p.inter = c.inter;
  p.num_experts = c.experts;
  p.top_k = c.top_k;
  p.kernel = kernel;
  ASSERT_TRUE((*gemm)->moe(p, stream()).is_ok());
  const std::vector<float> eager = out.host();
  cudaStream_t s = stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status st = (*gemm)->moe(p, s);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    std::vector<unsigned char> ff(eager.size() * sizeof(float), 0xFF);
    gpu()->copy_to_device(out.ptr(), ff.data(), static_cast<int64_t>(ff.size()));
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    const std::vector<float> replay = out.host();
    EXPECT_EQ(std::memcmp(replay.data(), eager.data(), eager.size() * sizeof(float)), 0)
        << name_of(c) << " replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(PrefillMoeGraph, GroupedCaptureReplays) { graph_capture_replays(kGrouped); }
TEST(PrefillMoeGraph, GroupedWgmmaCaptureReplays) { graph_capture_replays(kWgmma); }
TEST(PrefillMoeGraph, GroupedWgmmaRegisterWeightsCaptureReplays) { graph_capture_replays(kRegW); }

// ---- the grouped expert GEMM alone (one launch, either main loop, either epilogue) ----

struct GroupedCase {
  QuantFormat format;
  bool mma_layout;  // kMmaSwigluPairs for the SwiGLU epilogue, kMmaRows16 for the store
  cuda::GroupedEpilogue ep;
  cuda::GroupedExpertKernel kernel;
  int64_t n, k;
  // Register-weights loop only: x handed in the weights' k order (a_in_k_order) and, with the
  // SwiGLU epilogue, act written in it (act_in_k_order); the test permutes and un-permutes.
  bool k_order = false;
};

std::string name_of(const GroupedCase& c) {
  char b[160];
  std::snprintf(b, sizeof(b), "grouped gemm %s %s %s %s N=%lld K=%lld%s", name_of(c.format),
                c.kernel == cuda::GroupedExpertKernel::kWgmma                   ? "wgmma"
                : c.kernel == cuda::GroupedExpertKernel::kWgmmaRegisterWeights ? "wgmma-regw"
                                                                               : "mma.sync",
                c.mma_layout ? "mma-layout" : "row-major",
                c.ep == cuda::GroupedEpilogue::kSwigluBf16 ? "swiglu-bf16" : "store-f32",
                static_cast<long long>(c.n), static_cast<long long>(c.k),
                c.k_order ? " k-order" : "");
  return b;
}

// Rows per expert: empty experts (first, inside, last), one row, one tile + 1, several tiles with
// a ragged end, half a tile, exactly one tile, one tile - 1.
const std::vector<int32_t> kGroupedCounts = {0, 1, 129, 300, 0, 64, 128, 127, 0};

// Compares a grouped GEMM output [max_rows, cols] (rows in expert order, offsets `off`) with the
// CPU, and on failure says where in the 128 x 128 CTA tile the wrong elements sit: a histogram
// over the tile's 8 row bands of 16 (a wgmma warp owns one band; rows 64..127 are the second
// warpgroup) and its 16 column groups of 8 (one accumulator column block), the first wrong
// elements, and whether they were never written (NaN poison) or written wrong. Rows past off[E]
// must stay unwritten.
void expect_grouped_close(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<double>& bound, const std::vector<int32_t>& off,
                          int64_t max_rows, int64_t cols, int64_t cols_per_cta,
                          const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(max_rows * cols)) << what;
  const int64_t routed = off.back();
  ASSERT_EQ(want.size(), static_cast<size_t>(routed * cols)) << what;
  int64_t bad = 0, unwritten = 0, written_past_end = 0;
  int64_t by_band[8] = {}, by_colgroup[16] = {};
  double worst = 0;
  int64_t worst_i = 0;
  std::string first;
  for (int64_t r = 0; r < max_rows; ++r) {
    if (r >= routed) {
      for (int64_t j = 0; j < cols; ++j)
        if (!std::isnan(got[static_cast<size_t>(r * cols + j)])) ++written_past_end;
      continue;
    }
    const int64_t e = std::upper_bound(off.begin(), off.end(), r) - off.begin() - 1;
    const int64_t local = (r - off[static_cast<size_t>(e)]) % 128;
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = static_cast<size_t>(r * cols + j);
      const bool nan = std::isnan(got[i]);
      const double ratio = nan ? 1e300 : std::abs(double(got[i]) - want[i]) / bound[i];
      if (ratio > worst) worst = ratio, worst_i = static_cast<int64_t>(i);
      if (ratio <= 1.0) continue;
      ++bad;
      unwritten += nan;
      ++by_band[local / 16];
      ++by_colgroup[(j % cols_per_cta) * 16 / cols_per_cta];
      if (bad <= 12) {
        char b[200];
        std::snprintf(b, sizeof(b),
                      "\n    expert %lld row %lld (tile row %lld) col %lld: gpu %.6g cpu %.6g "
                      "bound %.3g",
                      static_cast<long long>(e), static_cast<long long>(r - off[e]),
                      static_cast<long long>(local), static_cast<long long>(j), got[i], want[i],
                      bound[i]);
        first += b;
      }
    }
  }
  std::printf("[ %-40s ] n=%lld worst |gpu-cpu|/bound = %.3g at row %lld col %lld; over bound %lld "
              "(unwritten %lld); written past the routed rows %lld\n",
              what.c_str(), static_cast<long long>(routed * cols), worst,
              static_cast<long long>(worst_i / cols), static_cast<long long>(worst_i % cols),
              static_cast<long long>(bad), static_cast<long long>(unwritten),
              static_cast<long long>(written_past_end));
  if (bad > 0) {
    std::string hist = "    by tile row band (16 rows):";
    for (int64_t v : by_band) hist += " " + std::to_string(v);
    hist += "\n    by CTA column group (" + std::to_string(cols_per_cta / 16) + " columns):";
    for (int64_t v : by_colgroup) hist += " " + std::to_string(v);
    std::printf("%s\n    first wrong elements:%s\n", hist.c_str(), first.c_str());
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << routed * cols
                    << " elements over the bound (histograms above)";
  EXPECT_EQ(written_past_end, 0) << what << ": wrote rows past the routed rows";
}

class GroupedExpertGemm : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(GroupedExpertGemm, MatchesCpuPerElement) {
  const GroupedCase c = GetParam();
  const bool swiglu = c.ep == cuda::GroupedEpilogue::kSwigluBf16;
  const int64_t E = static_cast<int64_t>(kGroupedCounts.size());
  std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + kGroupedCounts[static_cast<size_t>(e)];
  const int64_t routed = off.back();
  const int64_t max_rows = routed + 37;  // an upper bound: the grid has CTAs past the last tile
  // Rows gathered through routed row ids (token·2 + slot, a_row_div = 2) in a scrambled order:
  // 7919 is prime to `routed`, so every token is read once.
  ASSERT_EQ(std::gcd(routed, int64_t{7919}), 1);
  std::vector<int32_t> a_rows(static_cast<size_t>(routed));
  for (int64_t i = 0; i < routed; ++i)
    a_rows[static_cast<size_t>(i)] = static_cast<int32_t>(((i * 7919) % routed) * 2 + (i & 1));
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(routed * c.k, 31, 1.0f, &xf, &xb);

  QMatrices w = make_matrices(c.format, E, c.n, c.k, 500);
  QMatrices dev_w;
  dev_w.data = w.data, dev_w.scale = w.scale, dev_w.global = w.global;
  WeightLayout layout = WeightLayout::kRowMajor;
  if (c.mma_layout) {
    layout = swiglu ? WeightLayout::kMmaSwigluPairs : WeightLayout::kMmaRows16;
    const auto tiling = swiglu ? nvfp4_mma::Tiling::kSwigluPairs : nvfp4_mma::Tiling::kRows16;
    dev_w.data = c.format == QuantFormat::kNvfp4
                     ? nvfp4_mma::pack_matrix(w.data.data(), E, c.n, c.k, tiling)
                     : mxfp8_mma::pack_matrix(w.data.data(), E, c.n, c.k, tiling);
  }
  Uploaded up(dev_w);

  // CPU: per routed row, the float32-exact products summed in double, and the bounds of the
  // header (linear for the store; gate/up then SwiGLU-OAI and bf16 rounding for the activation).
  const int64_t cols = swiglu ? c.n / 2 : c.n;
  std::vector<float> want(static_cast<size_t>(routed * cols));
  std::vector<double> bound(want.size());
  const double rel = 3 * gamma(static_cast<double>(c.k + 2)) + 4 * kU;
  std::vector<double> h(static_cast<size_t>(c.n)), mag(static_cast<size_t>(c.n));
  for (int64_t e = 0; e < E; ++e) {
    const float* we = w.deq.data() + e * c.n * c.k;
    for (int64_t r = off[e]; r < off[e + 1]; ++r) {
      const float* xr = xf.data() + (a_rows[static_cast<size_t>(r)] / 2) * c.k;
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0, m = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double pr = double(xr[kk]) * we[j * c.k + kk];
          s += pr, m += std::abs(pr);
        }
        h[static_cast<size_t>(j)] = s, mag[static_cast<size_t>(j)] = m;
      }
      for (int64_t j = 0; j < cols; ++j) {
        const size_t o = static_cast<size_t>(r * cols + j);
        if (!swiglu) {
          want[o] = static_cast<float>(h[static_cast<size_t>(j)]);
          bound[o] = rel * mag[static_cast<size_t>(j)] + 1e-30;
          continue;
        }
        const double alpha = 1.702, lim = 7.0;
        const double g = h[static_cast<size_t>(j)], u = h[static_cast<size_t>(cols + j)];
        const double dg = rel * mag[static_cast<size_t>(j)];
        const double du = rel * mag[static_cast<size_t>(cols + j)];
        const double gc = std::min(g, lim), uc = std::clamp(u, -lim, lim);
        const double a = gc / (1 + std::exp(-alpha * gc)) * (uc + 1);
        const double dadg = (1 + alpha * (std::abs(g) + dg) / 4) * (std::abs(uc) + 1 + du);
        const double dd = dadg * dg + (std::abs(gc) + dg) * du;
        want[o] = static_cast<float>(a);
        bound[o] = dd + std::ldexp(1.0, -8) * (std::abs(a) + dd) + 8 * kU * std::abs(a) + 1e-30;
      }
    }
  }

  // In k order: every 128-column chunk of each row permuted as the weights' k-steps read it.
  std::vector<uint16_t> xin = xb;
  if (c.k_order) {
    for (int64_t r = 0; r < routed; ++r)
      for (int64_t col = 0; col < c.k; ++col)
        xin[static_cast<size_t>(r * c.k + (col & ~int64_t{127}) +
                                nvfp4_mma::k_order_position(static_cast<int>(col & 127)))] =
            xb[static_cast<size_t>(r * c.k + col)];
  }
  Dev<uint16_t> dx(xin);
  Dev<int32_t> drows(a_rows), doff(off);
  auto dtiles = Dev<int32_t>::poisoned(E + 1);
  ASSERT_TRUE(cuda::launch_moe_tile_schedule(doff.ptr(), E, dtiles.ptr(), stream()).is_ok());
  cuda::GroupedExpertGemmParams p;
  p.a = dx.ptr();
  p.lda = c.k;
  p.a_rows = drows.ptr();
  p.a_row_div = 2;
  p.group_offsets = doff.ptr();
  p.tile_offsets = dtiles.ptr();
  p.num_experts = E;
  p.max_rows = max_rows;
  p.w = up.view(c.format, c.n, c.k);
  p.w.layout = layout;
  p.epilogue = c.ep;
  p.kernel = c.kernel;
  p.a_in_k_order = c.k_order;
  p.act_in_k_order = c.k_order && swiglu;
  // A fault in the kernel (an illegal instruction, a misaligned shared address) is reported
  // here, by name, before any copy back.
  auto launch_and_sync = [&]() {
    const Status st = cuda::launch_grouped_expert_gemm(p, stream());
    if (!st.is_ok()) return "launch: " + st.to_string();
    const cudaError_t err = cudaStreamSynchronize(stream());
    return err == cudaSuccess ? std::string() : std::string("kernel: ") + cudaGetErrorString(err);
  };
  std::vector<float> got;
  if (swiglu) {
    auto act = Dev<uint16_t>::poisoned(max_rows * cols);
    p.act = act.ptr();
    p.ldact = cols;
    const std::string failure = launch_and_sync();
    ASSERT_TRUE(failure.empty()) << name_of(c) << ": " << failure;
    const std::vector<uint16_t> act_h = act.host();
    got.resize(act_h.size());
    for (size_t i = 0; i < act_h.size(); ++i) {
      size_t from = i;  // act_in_k_order: column j of a row sits at its k-order position
      if (c.k_order) {
        const int64_t j = static_cast<int64_t>(i) % cols;
        from = i - static_cast<size_t>(j) +
               static_cast<size_t>((j & ~int64_t{127}) +
                                   nvfp4_mma::k_order_position(static_cast<int>(j & 127)));
      }
      got[i] = bf16_to_f32(act_h[from]);
    }
  } else {
    auto y = Dev<float>::poisoned(max_rows * cols);
    p.y = y.ptr();
    p.ldy = cols;
    const std::string failure = launch_and_sync();
    ASSERT_TRUE(failure.empty()) << name_of(c) << ": " << failure;
    got = y.host();
  }
  // The SwiGLU CTA owns 64 activation columns, the store CTA 128 output columns; the
  // register-weights CTA 128 weight rows per block of 64 per warpgroup (2 blocks where N % 256 == 0).
  int64_t cols_per_cta = swiglu ? 64 : 128;
  if (c.kernel == cuda::GroupedExpertKernel::kWgmmaRegisterWeights)
    cols_per_cta = (c.n % 256 == 0 ? 256 : 128) / (swiglu ? 2 : 1);
  expect_grouped_close(got, want, bound, off, max_rows, cols, cols_per_cta, name_of(c));
}

constexpr auto kSwiglu = cuda::GroupedEpilogue::kSwigluBf16;
constexpr auto kStore = cuda::GroupedEpilogue::kStoreF32;
constexpr auto kMmaSyncLoop = cuda::GroupedExpertKernel::kMmaSync;
constexpr auto kWgmmaLoop = cuda::GroupedExpertKernel::kWgmma;
constexpr auto kRegWLoop = cuda::GroupedExpertKernel::kWgmmaRegisterWeights;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedExpertGemm,
    ::testing::Values(
        // Both main loops x both formats x both layouts x both epilogues; K = 384: three stages,
        // every ring slot used once; N = 256: two CTA columns.
        GroupedCase{kNv, false, kStore, kMmaSyncLoop, 256, 384},
        GroupedCase{kNv, false, kSwiglu, kMmaSyncLoop, 256, 384},
        GroupedCase{kNv, true, kStore, kMmaSyncLoop, 256, 384},
        GroupedCase{kNv, true, kSwiglu, kMmaSyncLoop, 256, 384},
        GroupedCase{kMx, false, kStore, kMmaSyncLoop, 256, 384},
        GroupedCase{kMx, false, kSwiglu, kMmaSyncLoop, 256, 384},
        GroupedCase{kMx, true, kStore, kMmaSyncLoop, 256, 384},
        GroupedCase{kMx, true, kSwiglu, kMmaSyncLoop, 256, 384},
        GroupedCase{kNv, false, kStore, kWgmmaLoop, 256, 384},
        GroupedCase{kNv, false, kSwiglu, kWgmmaLoop, 256, 384},
        GroupedCase{kNv, true, kStore, kWgmmaLoop, 256, 384},
        GroupedCase{kNv, true, kSwiglu, kWgmmaLoop, 256, 384},
        GroupedCase{kMx, false, kStore, kWgmmaLoop, 256, 384},
        GroupedCase{kMx, false, kSwiglu, kWgmmaLoop, 256, 384},
        GroupedCase{kMx, true, kStore, kWgmmaLoop, 256, 384},
        GroupedCase{kMx, true, kSwiglu, kWgmmaLoop, 256, 384},
        // One stage (no ring turn), and five (the ring wraps past its start twice).
        GroupedCase{kNv, false, kStore, kWgmmaLoop, 128, 128},
        GroupedCase{kMx, true, kSwiglu, kWgmmaLoop, 384, 640},
        GroupedCase{kNv, true, kStore, kWgmmaLoop, 384, 640},
        // The register-weights loop (NVFP4, mma layouts): 256-row CTAs (N = 256, 512), 128-row
        // CTAs (N = 128, 384); one stage, three, and five (its 4-slot ring wraps).
        GroupedCase{kNv, true, kStore, kRegWLoop, 256, 384},
        GroupedCase{kNv, true, kSwiglu, kRegWLoop, 256, 384},
        GroupedCase{kNv, true, kStore, kRegWLoop, 128, 128},
        GroupedCase{kNv, true, kSwiglu, kRegWLoop, 128, 128},
        GroupedCase{kNv, true, kStore, kRegWLoop, 384, 640},
        GroupedCase{kNv, true, kSwiglu, kRegWLoop, 384, 640},
        GroupedCase{kNv, true, kStore, kRegWLoop, 512, 640},
        GroupedCase{kNv, true, kSwiglu, kRegWLoop, 512, 640},
        // The same with x in the weights' k order (16-byte copies) and act written in it.
        GroupedCase{kNv, true, kStore, kRegWLoop, 256, 384, true},
        GroupedCase{kNv, true, kSwiglu, kRegWLoop, 512, 640, true},
        GroupedCase{kNv, true, kStore, kRegWLoop, 384, 640, true}));

// launch_to_k_order against the host permutation, with strides wider than the columns.
TEST(GroupedExpertGemmArgs, ToKOrderPermutesEachChunk) {
  const int64_t rows = 5, cols = 384, ld = 400;
  std::vector<uint16_t> x(static_cast<size_t>(rows * ld));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i * 2654435761u >> 16);
  Dev<uint16_t> dx(x);
  auto dout = Dev<uint16_t>::poisoned(rows * ld);
  ASSERT_TRUE(cuda::launch_to_k_order(dx.ptr(), ld, rows, cols, dout.ptr(), ld, stream()).is_ok());
  const std::vector<uint16_t> out = dout.host();
  std::vector<bool> hit(128, false);
  for (int p = 0; p < 128; ++p) hit[static_cast<size_t>(nvfp4_mma::k_order_position(p))] = true;
  EXPECT_EQ(std::count(hit.begin(), hit.end(), true), 128) << "not a bijection of 0..127";
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < cols; ++col) {
      const int64_t to = (col & ~int64_t{127}) + nvfp4_mma::k_order_position(static_cast<int>(col & 127));
      ASSERT_EQ(out[static_cast<size_t>(r * ld + to)], x[static_cast<size_t>(r * ld + col)])
          << "row " << r << " col " << col;
    }
  EXPECT_FALSE(cuda::launch_to_k_order(dx.ptr(), ld, rows, 200, dout.ptr(), ld, stream()).is_ok());
}

// Arguments for the refusal tests: 2 experts of NVFP4 [256, 256] weights, 4 rows, a float32
// output (the store epilogue) or a bf16 one (SwiGLU); nothing is launched on them.
struct RefusalArgs {
  float y = 0;
  uint16_t act = 0;
  cuda::GroupedExpertGemmParams p;
  RefusalArgs(cuda::GroupedExpertKernel kernel, cuda::GroupedEpilogue ep) {
    p.kernel = kernel;
    p.num_experts = 2;
    p.max_rows = 4;
    p.lda = 256;
    p.w.format = QuantFormat::kNvfp4;
    p.w.n = 256;
    p.w.k = 256;
    p.epilogue = ep;
    p.y = &y;
    p.ldy = 256;
    p.act = &act;
    p.ldact = 128;
  }
  std::string refusal() const {
    const Status st = cuda::launch_grouped_expert_gemm(p, stream());
    return st.is_ok() ? std::string("accepted") : st.to_string();
  }
};

// Weights a main loop does not take are refused with an error naming them, for every loop.
TEST(GroupedExpertGemmArgs, RefusesUnsupportedWeights) {
  for (auto kernel : {kMmaSyncLoop, kWgmmaLoop}) {
    RefusalArgs r(kernel, kSwiglu);
    r.p.w.layout = WeightLayout::kMmaRows16;  // the store's tiling with the SwiGLU epilogue
    EXPECT_NE(r.refusal().find("unsupported weights"), std::string::npos) << r.refusal();
    r.p.w.layout = WeightLayout::kRowMajor;
    r.p.w.n = 200;  // not a multiple of 128
    EXPECT_NE(r.refusal().find("N 200"), std::string::npos) << r.refusal();
  }
  // The k-order flags belong to the register-weights loop.
  RefusalArgs k_order(kWgmmaLoop, kStore);
  k_order.p.a_in_k_order = true;
  EXPECT_NE(k_order.refusal().find("k_order"), std::string::npos) << k_order.refusal();
  // The register-weights loop takes NVFP4 in the mma layouts only.
  RefusalArgs regw(kRegWLoop, kStore);
  for (auto [format, layout] : {std::pair{QuantFormat::kMxfp8, WeightLayout::kMmaRows16},
                                std::pair{QuantFormat::kNvfp4, WeightLayout::kRowMajor}}) {
    regw.p.w.format = format;
    regw.p.w.layout = layout;
    EXPECT_NE(regw.refusal().find("register-weights"), std::string::npos) << regw.refusal();
  }
}

}  // namespace
}  // namespace m3::cuda_test

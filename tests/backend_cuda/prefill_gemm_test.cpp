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
// The bound holds for both MoE kernels (kDequantCublas and kGroupedInLoop): both multiply the same
// bf16 activations by the same exact bf16 weight values with float32 accumulation (in different
// orders), apply the NVFP4 multiplier to the float32 sums, and round act to bf16 once. So the two
// kernels differ by at most twice the bound, which the old-vs-new comparisons use.
#include <algorithm>
#include <cstring>

#include <cuda_runtime.h>

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

std::string name_of(const MoeCase& c) {
  char b[160];
  std::snprintf(b, sizeof(b),
                "prefill moe %s %s%s T=%lld Hd=%lld I=%lld E=%lld K=%lld routing %d%s",
                name_of(c.format),
                c.kernel == cuda::PrefillMoeKernel::kGroupedInLoop ? "grouped" : "cublas",
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
  // The grouped kernel never counts experts on the host: 0 shows it ran (no silent fallback).
  if (kernel == cuda::PrefillMoeKernel::kGroupedInLoop) {
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
  if (c.kernel == cuda::PrefillMoeKernel::kGroupedInLoop) {
    // Against the dequantise-then-cuBLASLt kernel: both within `bound` of the CPU.
    const std::vector<float> old = run_moe(c, cuda::PrefillMoeKernel::kDequantCublas, w, dx, r);
    std::vector<double> twice(bound.size());
    for (size_t i = 0; i < bound.size(); ++i) twice[i] = 2 * bound[i];
    expect_close(got, old, twice, name_of(c) + " vs cublas");
    // Deterministic: the same bits on a second run.
    const std::vector<float> again = run_moe(c, c.kernel, w, dx, r);
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << name_of(c) << ": second run differs";
  }
}

constexpr auto kCublas = cuda::PrefillMoeKernel::kDequantCublas;
constexpr auto kGrouped = cuda::PrefillMoeKernel::kGroupedInLoop;
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
        MoeCase{kNv, kGrouped, false, 1, 256, 128, 4, 2, Routing::kUniform, false}));

// One layer at the real expert shape (hidden 6144, inter 3072) and T = 8K, NVFP4 in the model's
// mma layouts, 2 experts at top-1 (each gets ~4K rows, 32 row tiles, as 128 experts at top-4
// would get 256; fewer experts keep the host-side quantisation and reference within seconds).
// The CPU reference covers every 512th token (the rigorous check); the whole output is compared
// with the cuBLASLt kernel within twice the largest sampled bound (catches tiling and indexing
// errors, which are O(|out|)).
TEST(PrefillMoeRealShape, Nvfp4T8K) {
  const MoeCase c{kNv, kGrouped, true, 8192, 6144, 3072, 2, 1, Routing::kUniform, true};
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
  const std::vector<float> got = run_moe(c, kGrouped, w, dx, r);
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

// The whole grouped moe() call captured in a CUDA graph (no host sync, no host reads) and
// replayed: the same bits as the eager call. The eager call first warms the caching allocator, so
// the capture allocates nothing from the driver; the replays reuse the same blocks.
TEST(PrefillMoeGraph, GroupedCaptureReplays) {
  const MoeCase c{kNv, kGrouped, true, 200, 1024, 512, 17, 4, Routing::kSkewed, true};
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
  p.kernel = kGrouped;
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
        << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace m3::cuda_test

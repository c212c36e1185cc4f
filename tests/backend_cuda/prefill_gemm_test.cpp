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
#include <algorithm>
#include <cstring>

#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3::cuda_test {
namespace {

using cuda::PrefillOut;
using cuda::QuantFormat;

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

struct MoeCase {
  int64_t t, hidden, inter, experts, top_k;
  bool with_dropped;  // one slot gets id -1
};

class PrefillMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(PrefillMoe, MatchesCpuMoeExperts) {
  const MoeCase c = GetParam();
  const QuantFormat f = QuantFormat::kNvfp4;
  QMatrices w13 = make_matrices(f, c.experts, 2 * c.inter, c.hidden, 100);
  QMatrices w2 = make_matrices(f, c.experts, c.hidden, c.inter, 300);
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(c.t * c.hidden, 21, 1.0f, &xf, &xb);
  // Routing: distinct experts per token, ascending; skewed (expert 0 popular, the last unused).
  std::vector<int32_t> ids(c.t * c.top_k);
  std::vector<float> wts(c.t * c.top_k);
  std::mt19937 rng(5);
  for (int64_t t = 0; t < c.t; ++t) {
    std::vector<int32_t> pool;
    for (int32_t e = 0; e + 1 < c.experts; ++e) pool.push_back(e);
    std::shuffle(pool.begin(), pool.end(), rng);
    if (t % 3 == 0) pool[0] = 0, std::swap(pool[0], pool[static_cast<size_t>(t % c.top_k)]);
    std::vector<int32_t> chosen(pool.begin(), pool.begin() + c.top_k);
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    while (static_cast<int64_t>(chosen.size()) < c.top_k) chosen.push_back(c.experts - 2);
    for (int64_t s = 0; s < c.top_k; ++s) {
      ids[t * c.top_k + s] = chosen[static_cast<size_t>(s)];
      wts[t * c.top_k + s] = 0.25f + 0.5f * static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
  if (c.with_dropped) ids[c.top_k + 1] = -1;

  // CPU reference (float32 backend op) and the bound in double.
  std::vector<const float*> p13(c.experts), p2(c.experts);
  for (int64_t e = 0; e < c.experts; ++e) {
    p13[e] = w13.deq.data() + e * 2 * c.inter * c.hidden;
    p2[e] = w2.deq.data() + e * c.hidden * c.inter;
  }
  std::vector<int32_t> cpu_ids = ids;
  std::vector<float> cpu_wts = wts;
  if (c.with_dropped) cpu_wts[c.top_k + 1] = 0.0f, cpu_ids[c.top_k + 1] = 0;  // contributes 0
  std::vector<float> want(c.t * c.hidden);
  MoeExpertsParams mp;
  mp.x = xf.data();
  mp.w13 = p13.data();
  mp.w2 = p2.data();
  mp.topk_ids = cpu_ids.data();
  mp.topk_weights = cpu_wts.data();
  mp.out = want.data();
  mp.m = c.t;
  mp.hidden = c.hidden;
  mp.inter = c.inter;
  mp.num_experts = c.experts;
  mp.top_k = c.top_k;
  cpu()->moe_experts(mp);

  const double alpha = 1.702, lim = 7.0;
  const double d1 = 3 * gamma(static_cast<double>(c.hidden + 2)) + 4 * kU;
  const double d2 = 3 * gamma(static_cast<double>(c.inter + 2)) + 4 * kU;
  const double dk = 2 * gamma(static_cast<double>(c.top_k + 1));
  std::vector<double> bound(want.size(), 1e-30);
  for (int64_t t = 0; t < c.t; ++t) {
    for (int64_t s = 0; s < c.top_k; ++s) {
      const int32_t e = ids[t * c.top_k + s];
      if (e < 0) continue;
      const double wt = std::abs(wts[t * c.top_k + s]);
      const float* x = xf.data() + t * c.hidden;
      std::vector<double> act(c.inter), dact(c.inter);
      for (int64_t i = 0; i < c.inter; ++i) {
        double g = 0, u = 0, mg = 0, mu = 0;
        const float* wg = p13[e] + i * c.hidden;
        const float* wu = p13[e] + (c.inter + i) * c.hidden;
        for (int64_t j = 0; j < c.hidden; ++j) {
          g += double(x[j]) * wg[j], u += double(x[j]) * wu[j];
          mg += std::abs(double(x[j]) * wg[j]), mu += std::abs(double(x[j]) * wu[j]);
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
        bound[t * c.hidden + n] += wt * d_o + dk * wt * (std::abs(o) + d_o);
      }
    }
  }

  Uploaded u13(w13), u2(w2);
  Dev<uint16_t> dx(xb);
  Dev<int32_t> did(ids);
  Dev<float> dw(wts);
  auto out = Dev<float>::poisoned(c.t * c.hidden);
  auto gemm = cuda::PrefillGemm::create(allocator(), 8 * kMiB);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  cuda::PrefillMoeParams p;
  p.x = dx.ptr();
  p.topk_ids = did.ptr();
  p.topk_weights = dw.ptr();
  p.w13 = u13.view(f, 2 * c.inter, c.hidden);
  p.w2 = u2.view(f, c.hidden, c.inter);
  p.out = out.ptr();
  p.t = c.t;
  p.hidden = c.hidden;
  p.inter = c.inter;
  p.num_experts = c.experts;
  p.top_k = c.top_k;
  Status st = (*gemm)->moe(p, stream());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ((*gemm)->last_moe_stats().active_experts, c.experts - 1);
  char what[96];
  std::snprintf(what, sizeof(what), "prefill moe nvfp4 T=%lld Hd=%lld I=%lld E=%lld K=%lld%s",
                static_cast<long long>(c.t), static_cast<long long>(c.hidden),
                static_cast<long long>(c.inter), static_cast<long long>(c.experts),
                static_cast<long long>(c.top_k), c.with_dropped ? " dropped" : "");
  expect_close(out.host(), want, bound, what);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillMoe,
                         ::testing::Values(MoeCase{96, 512, 256, 9, 2, false},
                                           MoeCase{200, 1024, 512, 17, 4, true}));

}  // namespace
}  // namespace m3::cuda_test

// CPU ops against plain double-precision references written here, independently of the
// backend. Each test states its tolerance and how it was derived; failures report the worst
// element, its index and the bound. u = 2^-24 is the float32 unit roundoff.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace m3 {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Compares got against ref with a per-element bound; reports the worst ratio |err| / bound.
void expect_within(const std::vector<float>& got, const std::vector<double>& ref,
                   const std::vector<double>& bound, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": non-finite at " << i;
    double err = std::abs(static_cast<double>(got[i]) - ref[i]);
    double r = err / bound[i];
    if (r > worst) worst = r, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": worst element " << worst_i << " got " << got[worst_i]
                        << " ref " << ref[worst_i] << " err "
                        << std::abs(got[worst_i] - ref[worst_i]) << " bound " << bound[worst_i];
}

// ---------------------------------------------------------------------------------------------
// linear
// ---------------------------------------------------------------------------------------------

struct LinearCase {
  int64_t m, n, k;
};

class LinearTest : public ::testing::TestWithParam<LinearCase> {};

TEST_P(LinearTest, MatchesDoubleReference) {
  auto [m, n, k] = GetParam();
  CpuBackend be(2);
  auto x = randn(m * k, 1), w = randn(n * k, 2);
  std::vector<float> y(static_cast<size_t>(m * n), 123.0f);
  be.linear({x.data(), w.data(), y.data(), m, n, k, false});
  std::vector<double> ref(y.size()), bound(y.size());
  // Each lane sums ceil(k/8) products in sequence, then 3 pairwise adds: the classic bound
  // |err| <= gamma_{ceil(k/8)+4} · Σ|x||w| (one rounding per product and per add on the path).
  double gamma = (std::ceil(k / 8.0) + 4) * kU * 1.01;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (int64_t q = 0; q < k; ++q) {
        s += static_cast<double>(x[i * k + q]) * w[j * k + q];
        a += std::abs(static_cast<double>(x[i * k + q]) * w[j * k + q]);
      }
      ref[i * n + j] = s;
      bound[i * n + j] = gamma * a + 1e-30;
    }
  expect_within(y, ref, bound, "linear");

  // accumulate = true adds onto y (one more rounding: bound + u·|y|).
  std::vector<float> y2(y.size(), 1.5f);
  be.linear({x.data(), w.data(), y2.data(), m, n, k, true});
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] += 1.5;
    bound[i] += kU * std::abs(ref[i]);
  }
  expect_within(y2, ref, bound, "linear accumulate");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(LinearCase{1, 1, 1}, LinearCase{1, 7, 5},
                                           LinearCase{3, 50, 64}, LinearCase{37, 101, 67},
                                           LinearCase{64, 96, 256}, LinearCase{5, 200, 1031}));

TEST(Linear, RowsIndependentOfBatchAndThreads) {
  // A row's result must be bitwise identical whatever else is in the batch and however many
  // threads run: the model's batch invariance rests on this.
  const int64_t m = 45, n = 130, k = 99;
  auto x = randn(m * k, 3), w = randn(n * k, 4);
  CpuBackend be1(1), be3(3);
  std::vector<float> full(m * n), full3(m * n), one(n);
  be1.linear({x.data(), w.data(), full.data(), m, n, k, false});
  be3.linear({x.data(), w.data(), full3.data(), m, n, k, false});
  EXPECT_EQ(0, std::memcmp(full.data(), full3.data(), full.size() * sizeof(float)));
  for (int64_t r : {0L, 17L, 44L}) {
    be3.linear({x.data() + r * k, w.data(), one.data(), 1, n, k, false});
    EXPECT_EQ(0, std::memcmp(one.data(), full.data() + r * n, n * sizeof(float))) << "row " << r;
    EXPECT_EQ(one[5], cpu::dot(x.data() + r * k, w.data() + 5 * k, k));
  }
}

// ---------------------------------------------------------------------------------------------
// rms_norm, rope, swiglu
// ---------------------------------------------------------------------------------------------

TEST(RmsNorm, GemmaUnitOffset) {
  CpuBackend be(2);
  const int64_t rows = 13, dim = 96;
  auto x = randn(rows * dim, 5, 3.0f), w = randn(dim, 6, 0.5f);
  for (bool unit : {true, false}) {
    std::vector<float> y(x.size());
    be.rms_norm({x.data(), w.data(), y.data(), rows, dim, 1e-6f, unit});
    std::vector<double> ref(y.size()), bound(y.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i) {
        double scale = unit ? 1.0 + w[i] : w[i];
        ref[r * dim + i] = x[r * dim + i] * inv * scale;
        // Roundings: inv (1), x·inv (1), 1+w (1), the product (1); plus eps as float (tiny).
        bound[r * dim + i] = 5 * kU * std::abs(ref[r * dim + i]) + 1e-30;
      }
    }
    expect_within(y, ref, bound, unit ? "rms_norm(1+w)" : "rms_norm(w)");
  }
  // In place (y aliases x) gives the same result.
  std::vector<float> y(x.size()), xi = x;
  be.rms_norm({x.data(), w.data(), y.data(), rows, dim, 1e-6f, true});
  be.rms_norm({xi.data(), w.data(), xi.data(), rows, dim, 1e-6f, true});
  EXPECT_EQ(y, xi);
}

struct RopeCase {
  int64_t d, rotary_dim, rot_width;
};
class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, PartialHalfSplit) {
  auto [d, rotary_dim, rot_width] = GetParam();
  CpuBackend be(2);
  const int64_t t = 9, h = 3;
  const double theta = 5e6;
  std::vector<int32_t> pos = {0, 1, 2, 7, 127, 128, 300, 1000, 4095};
  auto x = randn(t * h * d, 7);
  auto y = x;
  be.rope({y.data(), pos.data(), t, h, d, rotary_dim, rot_width, theta});
  std::vector<double> ref(y.size()), bound(y.size());
  const int64_t half = rot_width / 2;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t dd = 0; dd < d; ++dd) {
        size_t idx = (i * h + hh) * d + dd;
        if (dd >= rot_width) {
          ref[idx] = x[idx];
          bound[idx] = 1e-30;  // pass-through dims must be untouched
          continue;
        }
        // Exact maths: frequency index dd mod (rotary_dim / 2), partner dd ± half.
        int64_t f = dd % (rotary_dim / 2);
        double angle = pos[i] * std::pow(theta, -2.0 * f / rotary_dim);
        double partner = dd < half ? -static_cast<double>(x[idx + half]) : x[idx - half];
        ref[idx] = x[idx] * std::cos(angle) + partner * std::sin(angle);
        // The float32 angle (as in HF) carries ~4u relative error (pow, reciprocal, product), so
        // cos/sin are off by up to 4u·|angle| + u; the products and the sum add 3u.
        double da = 4 * kU * std::abs(angle) + kU;
        bound[idx] = (std::abs(x[idx]) + std::abs(partner)) * (da + 3 * kU) + 1e-30;
      }
  expect_within(y, ref, bound, "rope");
}

INSTANTIATE_TEST_SUITE_P(Widths, RopeTest,
                         ::testing::Values(RopeCase{16, 8, 8}, RopeCase{32, 32, 32},
                                           RopeCase{128, 64, 64},
                                           // indexer head narrower than the rotary table
                                           RopeCase{16, 32, 16}));

TEST(SwigluOai, ClampAndGate) {
  CpuBackend be(2);
  const int64_t m = 7, inter = 40;
  auto gu = randn(m * 2 * inter, 8, 5.0f);  // wide spread so both clamps trigger
  gu[0] = 7.0f, gu[inter] = -7.0f, gu[1] = 7.5f, gu[inter + 1] = 9.0f;
  std::vector<float> out(m * inter);
  be.swiglu_oai({gu.data(), out.data(), m, inter, 1.702f, 7.0f});
  std::vector<double> ref(out.size()), bound(out.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      double g = std::min<double>(gu[r * 2 * inter + i], 7.0);
      double u = std::clamp<double>(gu[r * 2 * inter + inter + i], -7.0, 7.0);
      double sig = 1.0 / (1.0 + std::exp(-1.702 * g));
      double v = g * sig * (u + 1.0);
      ref[r * inter + i] = v;
      // Rounding x = alpha·g moves σ(x) by (1-σ)·|x|·u relative (g is not clamped from below,
      // so |x| is unbounded); exp (1-2 ulp), 1+e and the division (2), g·σ (1), u+1 (1
      // relative to |u|+1) and the product (1) add a constant. Twice the first-order term.
      double x = std::abs(1.702 * g);
      bound[r * inter + i] =
          std::abs(g * sig) * (std::abs(u) + 1) * ((2 * x * (1 - sig) + 10) * kU) + 1e-30;
    }
  expect_within(out, ref, bound, "swiglu_oai");
}

// ---------------------------------------------------------------------------------------------
// router and experts
// ---------------------------------------------------------------------------------------------

TEST(RouterTopk, BiasSelectsButDoesNotWeight) {
  CpuBackend be(2);
  const int64_t m = 11, e = 16, k = 4;
  auto logits = randn(m * e, 9, 2.0f);
  auto bias = randn(e, 10, 0.3f);
  std::vector<int32_t> ids(m * k);
  std::vector<float> wts(m * k);
  be.router_topk({logits.data(), bias.data(), ids.data(), wts.data(), m, e, k, 2.0f});
  for (int64_t r = 0; r < m; ++r) {
    std::vector<double> s(e), c(e);
    std::vector<int> order(e);
    for (int64_t i = 0; i < e; ++i) {
      s[i] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[r * e + i])));
      c[i] = s[i] + bias[i];
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[a] > c[b]; });
    std::vector<int> want(order.begin(), order.begin() + k);
    std::sort(want.begin(), want.end());
    double denom = 0;
    for (int id : want) denom += s[id];
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(ids[r * k + i], want[i]) << "row " << r << " slot " << i;
      double ref = s[want[i]] / denom * 2.0;
      // sigmoid (3u), the 4-term sum (3u), division and scaling (2u).
      EXPECT_NEAR(wts[r * k + i], ref, 10 * kU * ref) << "row " << r << " slot " << i;
    }
  }
}

TEST(RouterTopk, TiesGoToLowerExpertId) {
  CpuBackend be(1);
  std::vector<float> logits = {0.5f, 1.0f, 1.0f, 0.5f, 1.0f, -1.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> wts(2);
  be.router_topk({logits.data(), nullptr, ids.data(), wts.data(), 1, 6, 2, 1.0f});
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(wts[0], 0.5f);
}

TEST(MoeExperts, MatchesDoubleReference) {
  CpuBackend be(2);
  const int64_t m = 9, hd = 24, inter = 16, ne = 5, k = 2;
  auto x = randn(m * hd, 11);
  std::vector<std::vector<float>> w13(ne), w2(ne);
  std::vector<const float*> p13(ne), p2(ne);
  for (int64_t e = 0; e < ne; ++e) {
    w13[e] = randn(2 * inter * hd, 100 + e, 0.4f);
    w2[e] = randn(hd * inter, 200 + e, 0.4f);
    p13[e] = w13[e].data(), p2[e] = w2[e].data();
  }
  std::vector<int32_t> ids(m * k);
  std::vector<float> wts(m * k);
  std::mt19937 rng(12);
  for (int64_t t = 0; t < m; ++t) {
    int a = rng() % ne, b = (a + 1 + rng() % (ne - 1)) % ne;
    ids[t * k] = std::min(a, b), ids[t * k + 1] = std::max(a, b);
    wts[t * k] = 0.3f + 0.1f * t, wts[t * k + 1] = 0.7f;
  }
  std::vector<float> out(m * hd, 99.0f);
  be.moe_experts({x.data(), p13.data(), p2.data(), ids.data(), wts.data(), out.data(), m, hd, inter,
                  ne, k, 1.702f, 7.0f});
  std::vector<double> ref(out.size(), 0.0), bound(out.size(), 1e-30);
  const double g1 = (std::ceil(hd / 8.0) + 4) * kU, g2 = (std::ceil(inter / 8.0) + 4) * kU;
  for (int64_t t = 0; t < m; ++t)
    for (int64_t s = 0; s < k; ++s) {
      int e = ids[t * k + s];
      std::vector<double> a(inter), da(inter);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0, ga = 0, ua = 0;
        for (int64_t q = 0; q < hd; ++q) {
          g += double(x[t * hd + q]) * w13[e][i * hd + q];
          u += double(x[t * hd + q]) * w13[e][(inter + i) * hd + q];
          ga += std::abs(double(x[t * hd + q]) * w13[e][i * hd + q]);
          ua += std::abs(double(x[t * hd + q]) * w13[e][(inter + i) * hd + q]);
        }
        double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0);
        double sig = 1.0 / (1.0 + std::exp(-1.702 * gc));
        a[i] = gc * sig * (uc + 1);
        // First-order propagation: d act/d g <= |u+1|·(σ + 1.702|g|σ(1-σ)), d act/d u = |gσ|,
        // plus the activation's own 20u (see SwigluOai).
        double dg = g1 * ga, du = g1 * ua;
        da[i] = std::abs(uc + 1) * (sig + 1.702 * std::abs(gc) * sig * (1 - sig)) * dg +
                std::abs(gc * sig) * du + 20 * kU * std::abs(a[i]);
      }
      for (int64_t j = 0; j < hd; ++j) {
        double y = 0, ya = 0, yd = 0;
        for (int64_t i = 0; i < inter; ++i) {
          y += a[i] * w2[e][j * inter + i];
          ya += std::abs(a[i] * w2[e][j * inter + i]);
          yd += std::abs(double(w2[e][j * inter + i])) * da[i];
        }
        ref[t * hd + j] += wts[t * k + s] * y;
        // the down-projection's own rounding, the propagated error, weight product and sum (2u).
        bound[t * hd + j] += wts[t * k + s] * (g2 * ya + yd + 2 * kU * ya) * 1.01;
      }
    }
  expect_within(out, ref, bound, "moe_experts");
}

// ---------------------------------------------------------------------------------------------
// paged KV cache, indexer, attention
// ---------------------------------------------------------------------------------------------

// A small paged cache with a scrambled block table, filled through kv_write.
struct PagedFixture {
  int64_t page = 4, hkv = 2, d = 16, dix = 8, len = 37;
  int64_t num_blocks = 0, num_pages = 0;
  std::vector<float> k, v, ik;               // logical [len, ...] contents
  std::vector<float> kc, vc, ikc;            // cache storage
  std::vector<int32_t> table;
  KvLayerView view;

  PagedFixture(CpuBackend& be, uint32_t seed) {
    num_blocks = (len + page - 1) / page;
    num_pages = num_blocks + 3;
    k = randn(len * hkv * d, seed), v = randn(len * hkv * d, seed + 1);
    ik = randn(len * dix, seed + 2);
    kc.assign(num_pages * page * hkv * d, std::nanf("")), vc = kc;
    ikc.assign(num_pages * page * dix, std::nanf(""));
    for (int64_t b = 0; b < num_blocks; ++b)
      table.push_back(static_cast<int32_t>((b * 5 + 2) % num_pages));  // a permutation
    view = {kc.data(), vc.data(), ikc.data(), num_pages, page, hkv, d, dix};
    // Two writes (a chunk, then the rest) like chunked prefill.
    std::vector<int32_t> pos(len);
    std::iota(pos.begin(), pos.end(), 0);
    int64_t first = 13;
    be.kv_write({view, k.data(), v.data(), ik.data(), pos.data(), table.data(), first, num_blocks});
    be.kv_write({view, k.data() + first * hkv * d, v.data() + first * hkv * d,
                 ik.data() + first * dix, pos.data() + first, table.data(), len - first,
                 num_blocks});
  }
};

// The reference selection, computed naively from the full score matrix (§3.2-§3.3).
std::vector<int32_t> ref_select(const PagedFixture& f, const std::vector<float>& iq, int64_t hix,
                                const std::vector<int32_t>& pos, int64_t topk, int64_t local,
                                int64_t init) {
  std::vector<int32_t> out;
  for (size_t t = 0; t < pos.size(); ++t)
    for (int64_t h = 0; h < hix; ++h) {
      int64_t nb = f.num_blocks;
      std::vector<double> bs(nb, -INFINITY);
      for (int64_t j = 0; j < f.len; ++j) {
        double s = -INFINITY;
        if (j <= pos[t]) {
          s = 0;
          for (int64_t q = 0; q < f.dix; ++q)
            s += double(iq[(t * hix + h) * f.dix + q]) * f.ik[j * f.dix + q];
        }
        bs[j / f.page] = std::max(bs[j / f.page], s);
      }
      int64_t qb = pos[t] / f.page;
      for (int64_t i = 0; i < local; ++i) bs[std::max<int64_t>(0, qb - i)] = INFINITY;
      for (int64_t b = 0; b < init && b <= qb; ++b) bs[b] = INFINITY;
      std::vector<int> order(nb);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bs[a] > bs[b]; });
      int64_t kk = std::min(topk, nb);
      for (int64_t i = 0; i < topk; ++i)
        out.push_back(i < kk && bs[order[i]] != -INFINITY ? order[i] : -1);
    }
  return out;
}

struct IndexerCase {
  int64_t topk, local, init;
};
class IndexerTest : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(IndexerTest, MatchesNaiveSelection) {
  auto [topk, local, init] = GetParam();
  CpuBackend be(2);
  PagedFixture f(be, 20);
  const int64_t hix = 2;
  std::vector<int32_t> pos = {0, 3, 4, 5, 11, 12, 20, 27, 33, 36};
  auto iq = randn(pos.size() * hix * f.dix, 21);
  std::vector<int32_t> sel(pos.size() * hix * topk, 77);
  be.indexer_topk({iq.data(), f.view, pos.data(), f.table.data(), sel.data(),
                   static_cast<int64_t>(pos.size()), hix, f.num_blocks, topk, local, init});
  auto want = ref_select(f, iq, hix, pos, topk, local, init);
  ASSERT_EQ(sel.size(), want.size());
  for (size_t i = 0; i < sel.size(); ++i)
    EXPECT_EQ(sel[i], want[i]) << "token " << i / (hix * topk) << " head " << (i / topk) % hix
                               << " slot " << i % topk;
}

INSTANTIATE_TEST_SUITE_P(Configs, IndexerTest,
                         ::testing::Values(IndexerCase{3, 1, 0}, IndexerCase{2, 1, 1},
                                           IndexerCase{4, 2, 0}, IndexerCase{3, 0, 0},
                                           IndexerCase{16, 1, 0}, IndexerCase{1, 1, 0}));

// Reference attention with an explicit keep mask per (token, head, key).
void check_attention(bool sparse) {
  CpuBackend be(3);
  PagedFixture f(be, 30);
  const int64_t h = 4, hix = f.hkv, topk = 3;
  std::vector<int32_t> pos = {0, 2, 5, 9, 16, 23, 30, 36};
  const int64_t t = static_cast<int64_t>(pos.size());
  auto q = randn(t * h * f.d, 31);
  std::vector<int32_t> sel;
  if (sparse) {
    auto iq = randn(t * hix * f.dix, 32);
    sel.assign(t * hix * topk, -1);
    be.indexer_topk({iq.data(), f.view, pos.data(), f.table.data(), sel.data(), t, hix,
                     f.num_blocks, topk, 1, 0});
  }
  const float scale = 1.0f / std::sqrt(float(f.d));
  std::vector<float> out(t * h * f.d, 55.0f);
  PagedAttentionParams p{q.data(), f.view, pos.data(), f.table.data(),
                         sparse ? sel.data() : nullptr, out.data(), t, h, f.num_blocks,
                         hix, topk, scale};
  be.paged_attention(p);
  std::vector<double> ref(out.size()), bound(out.size());
  for (int64_t i = 0; i < t; ++i)
    for (int64_t n = 0; n < h; ++n) {
      int64_t g = n / (h / f.hkv);
      std::vector<double> s;
      std::vector<int64_t> keys;
      double ds = 0;  // bound on a score's float error
      for (int64_t j = 0; j <= pos[i]; ++j) {
        bool keep = true;
        if (sparse) {
          keep = false;
          for (int64_t q2 = 0; q2 < topk; ++q2)
            keep |= sel[(i * hix + g) * topk + q2] == j / f.page;
        }
        if (!keep) continue;
        double acc = 0, aabs = 0;
        for (int64_t dd = 0; dd < f.d; ++dd) {
          double prod = double(q[(i * h + n) * f.d + dd]) * f.k[(j * f.hkv + g) * f.d + dd];
          acc += prod, aabs += std::abs(prod);
        }
        s.push_back(acc * scale);
        keys.push_back(j);
        ds = std::max(ds, ((std::ceil(f.d / 8.0) + 5) * kU) * aabs * scale);
      }
      ASSERT_FALSE(keys.empty());
      double mx = *std::max_element(s.begin(), s.end()), sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      int64_t nk = static_cast<int64_t>(keys.size());
      for (int64_t dd = 0; dd < f.d; ++dd) {
        double o = 0, oabs = 0;
        for (int64_t j = 0; j < nk; ++j) {
          double vv = f.v[(keys[j] * f.hkv + g) * f.d + dd];
          o += s[j] / sum * vv, oabs += s[j] / sum * std::abs(vv);
        }
        ref[(i * h + n) * f.d + dd] = o;
        // Each weight p_j is off by a factor (1 ± (2·ds + (nk + 4)u)) (score errors enter the
        // numerator and the denominator; exp, the sum of nk terms, division); the weighted sum of
        // nk values adds (nk + 1)u.
        bound[(i * h + n) * f.d + dd] = oabs * (2 * ds + (2 * nk + 6) * kU) * 1.01 + 1e-30;
      }
    }
  expect_within(out, ref, bound, sparse ? "sparse attention" : "dense attention");

  // Same result on one thread, bitwise.
  CpuBackend be1(1);
  std::vector<float> out1(out.size());
  p.out = out1.data();
  be1.paged_attention(p);
  EXPECT_EQ(0, std::memcmp(out.data(), out1.data(), out.size() * sizeof(float)));
}

TEST(PagedAttention, DenseCausal) { check_attention(false); }
TEST(PagedAttention, BlockSparse) { check_attention(true); }

TEST(PagedAttention, SparseWithAllBlocksEqualsDense) {
  // When top-k covers every block, block-sparse attention is dense causal attention, bitwise.
  CpuBackend be(2);
  PagedFixture f(be, 40);
  const int64_t h = 4, hix = 2, topk = 16;
  std::vector<int32_t> pos = {1, 8, 19, 36};
  const int64_t t = 4;
  auto q = randn(t * h * f.d, 41), iq = randn(t * hix * f.dix, 42);
  std::vector<int32_t> sel(t * hix * topk);
  be.indexer_topk({iq.data(), f.view, pos.data(), f.table.data(), sel.data(), t, hix, f.num_blocks,
                   topk, 1, 0});
  std::vector<float> dense(t * h * f.d), sparse(t * h * f.d);
  be.paged_attention({q.data(), f.view, pos.data(), f.table.data(), nullptr, dense.data(), t, h,
                      f.num_blocks, hix, topk, 0.25f});
  be.paged_attention({q.data(), f.view, pos.data(), f.table.data(), sel.data(), sparse.data(), t,
                      h, f.num_blocks, hix, topk, 0.25f});
  EXPECT_EQ(dense, sparse);
}

TEST(SmallOps, EmbeddingAddGather) {
  CpuBackend be(1);
  auto table = randn(10 * 3, 50);
  std::vector<int32_t> ids = {4, 0, 9};
  std::vector<float> e(9);
  be.embedding({table.data(), ids.data(), e.data(), 3, 10, 3});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(e[i * 3 + j], table[ids[i] * 3 + j]);
  std::vector<float> s(9);
  be.add({e.data(), e.data(), s.data(), 9});
  for (int i = 0; i < 9; ++i) EXPECT_EQ(s[i], 2 * e[i]);
  std::vector<int32_t> rows = {2, 2, 0};
  std::vector<float> g(9);
  be.gather_rows({e.data(), rows.data(), g.data(), 3, 3});
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(g[j], e[6 + j]);
    EXPECT_EQ(g[6 + j], e[j]);
  }
}

}  // namespace
}  // namespace m3

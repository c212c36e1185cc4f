// The composite float32 CUDA ops (routed experts, indexer block selection, paged attention)
// against the CPU backend. Their rounding-error bounds need intermediate magnitudes, so each test
// computes a double-precision reference of the op's semantics here and derives the bound from it;
// the GPU must match the CPU within (CPU error bound + GPU error bound).
#include <algorithm>
#include <limits>
#include <numeric>
#include <set>

#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// moe_experts. Per (token, slot): g, u dot products of length Hd (each side within
// gamma_Hd·G, G = Σ|x||w|), SwiGLU-OAI with |∂a/∂g| <= |u'+1|·(1 + α|g'|/4) and |∂a/∂u| <= |g'|
// (σ <= 1, σ' <= 1/4), plus 16u·|a| for its own roundings; the down projection adds
// gamma_I·Σ|a||w2| and propagates Σ|w2|·δa; the weighted slot sum adds (K + 1)u·Σ|w·c|.
// First-order bound, doubled for second-order terms and for the two sides.
// ---------------------------------------------------------------------------------------------
struct MoeCase {
  int64_t m, hidden, inter, experts, top_k;
};
class CudaMoeExperts : public ::testing::TestWithParam<MoeCase> {};

TEST_P(CudaMoeExperts, MatchesCpu) {
  const MoeCase c = GetParam();
  const float alpha = 1.702f, limit = 7.0f;
  auto x = randn(c.m * c.hidden, 30, 1.5f);
  std::vector<std::vector<float>> w13(c.experts), w2(c.experts);
  std::vector<DeviceBuffer<float>> d13, d2;
  std::vector<const float*> h13, h2, g13, g2;
  for (int64_t e = 0; e < c.experts; ++e) {
    w13[e] = randn(2 * c.inter * c.hidden, 100 + e, 1.0f / std::sqrt(float(c.hidden)));
    w2[e] = randn(c.hidden * c.inter, 500 + e, 1.0f / std::sqrt(float(c.inter)));
    h13.push_back(w13[e].data());
    h2.push_back(w2[e].data());
    d13.emplace_back(gpu(), int64_t(w13[e].size()));
    d2.emplace_back(gpu(), int64_t(w2[e].size()));
    gpu()->copy_to_device(d13.back().data(), w13[e].data(), int64_t(w13[e].size() * 4));
    gpu()->copy_to_device(d2.back().data(), w2[e].data(), int64_t(w2[e].size() * 4));
    g13.push_back(d13.back().data());
    g2.push_back(d2.back().data());
  }
  // Random distinct experts per token, sorted ascending (the router's contract), random weights.
  std::mt19937 rng(31);
  std::vector<int32_t> ids(c.m * c.top_k);
  std::vector<float> wts(c.m * c.top_k);
  for (int64_t t = 0; t < c.m; ++t) {
    std::vector<int32_t> perm(c.experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::sort(perm.begin(), perm.begin() + c.top_k);
    for (int64_t s = 0; s < c.top_k; ++s) {
      ids[t * c.top_k + s] = perm[s];
      wts[t * c.top_k + s] = 0.1f + 0.5f * float(rng() % 1000) / 1000.0f;
    }
  }
  std::vector<float> want(c.m * c.hidden);
  cpu()->moe_experts({x.data(), h13.data(), h2.data(), ids.data(), wts.data(), want.data(), c.m,
                      c.hidden, c.inter, c.experts, c.top_k, alpha, limit});
  Dev<float> dx(x), dw(wts);
  Dev<int32_t> di(ids);
  auto dout = Dev<float>::poisoned(c.m * c.hidden);
  gpu()->moe_experts({dx.ptr(), g13.data(), g2.data(), di.ptr(), dw.ptr(), dout.ptr(), c.m,
                      c.hidden, c.inter, c.experts, c.top_k, alpha, limit});

  std::vector<double> bound(want.size(), 0.0);
  for (int64_t t = 0; t < c.m; ++t) {
    std::vector<double> wc_abs(c.hidden, 0.0);
    for (int64_t s = 0; s < c.top_k; ++s) {
      const int64_t e = ids[t * c.top_k + s];
      const double ws = wts[t * c.top_k + s];
      std::vector<double> a(c.inter), da(c.inter);
      for (int64_t i = 0; i < c.inter; ++i) {
        double g = 0, u = 0, G = 0, U = 0;
        for (int64_t q = 0; q < c.hidden; ++q) {
          const double xq = x[t * c.hidden + q];
          g += xq * w13[e][i * c.hidden + q];
          u += xq * w13[e][(c.inter + i) * c.hidden + q];
          G += std::abs(xq * w13[e][i * c.hidden + q]);
          U += std::abs(xq * w13[e][(c.inter + i) * c.hidden + q]);
        }
        const double gc = std::min(g, double(limit)), uc = std::clamp(u, -double(limit), double(limit));
        const double sig = 1.0 / (1.0 + std::exp(-alpha * gc));
        a[i] = gc * sig * (uc + 1.0);
        const double dg = std::abs(uc + 1.0) * (1.0 + alpha * std::abs(gc) / 4);
        da[i] = dg * gamma(c.hidden) * G + std::abs(gc) * gamma(c.hidden) * U + 16 * kU * std::abs(a[i]);
      }
      for (int64_t j = 0; j < c.hidden; ++j) {
        double y = 0, A = 0, P = 0;
        for (int64_t i = 0; i < c.inter; ++i) {
          const double wv = w2[e][j * c.inter + i];
          y += a[i] * wv;
          A += std::abs(a[i] * wv);
          P += std::abs(wv) * da[i];
        }
        bound[t * c.hidden + j] += ws * (P + gamma(c.inter) * A);
        wc_abs[j] += std::abs(ws * y);
      }
    }
    for (int64_t j = 0; j < c.hidden; ++j)
      bound[t * c.hidden + j] =
          2 * (2 * bound[t * c.hidden + j] + (c.top_k + 1) * kU * wc_abs[j]) + 1e-30;
  }
  expect_close(dout.host(), want, bound,
               "moe_experts m" + std::to_string(c.m) + " Hd" + std::to_string(c.hidden) + " I" +
                   std::to_string(c.inter) + " E" + std::to_string(c.experts) + " k" +
                   std::to_string(c.top_k));
  // The same expert-pointer arrays again: the staged device table is reused, same result.
  gpu()->moe_experts({dx.ptr(), g13.data(), g2.data(), di.ptr(), dw.ptr(), dout.ptr(), c.m,
                      c.hidden, c.inter, c.experts, c.top_k, alpha, limit});
  expect_close(dout.host(), want, bound, "moe_experts (second call)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeExperts,
                         ::testing::Values(MoeCase{5, 64, 32, 6, 2}, MoeCase{16, 256, 96, 16, 4},
                                           MoeCase{3, 1024, 384, 8, 4}));

// ---------------------------------------------------------------------------------------------
// Paged cache fixtures shared by the indexer and attention tests.
// ---------------------------------------------------------------------------------------------
struct PagedFixture {
  int64_t pages, ps, hkv, d, dix;
  std::vector<int32_t> table;  // logical block -> page (a permutation)
  std::vector<float> k, v, ik;  // [P, S, Hkv, D], [P, S, Dix]
  PagedFixture(int64_t len, int64_t ps_, int64_t hkv_, int64_t d_, int64_t dix_, uint32_t seed)
      : ps(ps_), hkv(hkv_), d(d_), dix(dix_) {
    const int64_t nb = (len + ps - 1) / ps;
    pages = nb + 3;
    table.resize(nb);
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(table.begin(), table.end(), rng);
    for (int32_t& p : table) p += 2;  // pages 0, 1 unused
    k = randn(pages * ps * hkv * d, seed + 1);
    v = randn(pages * ps * hkv * d, seed + 2);
    ik = randn(pages * ps * dix, seed + 3);
  }
  const float* krow(int64_t pos, int64_t g) const {
    return k.data() + ((table[pos / ps] * ps + pos % ps) * hkv + g) * d;
  }
  const float* vrow(int64_t pos, int64_t g) const {
    return v.data() + ((table[pos / ps] * ps + pos % ps) * hkv + g) * d;
  }
  const float* ikrow(int64_t pos) const {
    return ik.data() + (table[pos / ps] * ps + pos % ps) * dix;
  }
};

// ---------------------------------------------------------------------------------------------
// indexer_topk. Each float block score is within eps = gamma_Dix·max Σ|q||k| of the exact one on
// either side, so two blocks whose exact scores differ by more than 2·eps are ordered the same by
// both. Check: slot by slot, a GPU id that differs from the CPU id must have an exact score
// within 2·eps of the CPU id's score (a rounding tie), and the GPU list must hold distinct ids.
// ---------------------------------------------------------------------------------------------
struct IndexerCase {
  int64_t t, hix, dix, ps, top_k, local, init, len;
};
class CudaIndexerTopk : public ::testing::TestWithParam<IndexerCase> {};

TEST_P(CudaIndexerTopk, MatchesCpu) {
  const IndexerCase c = GetParam();
  PagedFixture f(c.len, c.ps, 1, 8, c.dix, 40);
  const int64_t nb = static_cast<int64_t>(f.table.size());
  auto iq = randn(c.t * c.hix * c.dix, 41);
  std::vector<int32_t> pos(c.t);
  for (int64_t i = 0; i < c.t; ++i) pos[i] = static_cast<int32_t>(c.len - c.t + i);
  pos[0] = 0;  // also the very first position
  std::vector<float> dummy(f.pages * f.ps * 8);
  KvLayerView hv{dummy.data(), dummy.data(), f.ik.data(), f.pages, f.ps, 1, 8, c.dix};
  std::vector<int32_t> sel(c.t * c.hix * c.top_k);
  cpu()->indexer_topk({iq.data(), hv, pos.data(), f.table.data(), sel.data(), c.t, c.hix, nb,
                       c.top_k, c.local, c.init});
  Dev<float> dq(iq), dik(f.ik), dd(dummy);
  Dev<int32_t> dpos(pos), dtab(f.table);
  auto dsel = Dev<int32_t>::poisoned(c.t * c.hix * c.top_k);
  KvLayerView gv{dd.ptr(), dd.ptr(), dik.ptr(), f.pages, f.ps, 1, 8, c.dix};
  gpu()->indexer_topk({dq.ptr(), gv, dpos.ptr(), dtab.ptr(), dsel.ptr(), c.t, c.hix, nb, c.top_k,
                       c.local, c.init});
  auto gsel = dsel.host();
  int64_t ties = 0;
  for (int64_t th = 0; th < c.t * c.hix; ++th) {
    const int64_t t = th / c.hix, qb = pos[t] / c.ps;
    std::vector<double> score(qb + 1, -kInf);
    double mag = 0;
    for (int64_t j = 0; j <= pos[t]; ++j) {
      double s = 0, a = 0;
      for (int64_t i = 0; i < c.dix; ++i) {
        s += double(iq[th * c.dix + i]) * f.ikrow(j)[i];
        a += std::abs(double(iq[th * c.dix + i]) * f.ikrow(j)[i]);
      }
      score[j / c.ps] = std::max(score[j / c.ps], s);
      mag = std::max(mag, a);
    }
    for (int64_t i = 0; i < c.local; ++i) score[std::max<int64_t>(0, qb - i)] = kInf;
    for (int64_t b = 0; b < std::min(c.init, qb + 1); ++b) score[b] = kInf;
    const double tol = 2 * gamma(c.dix) * mag;
    std::set<int32_t> seen;
    for (int64_t s = 0; s < c.top_k; ++s) {
      const int32_t want = sel[th * c.top_k + s], got = gsel[th * c.top_k + s];
      if (want == -1 || got == -1) {
        ASSERT_EQ(got, want) << "row " << th << " slot " << s;
        continue;
      }
      ASSERT_TRUE(got >= 0 && got <= qb) << "row " << th << " slot " << s << " id " << got;
      ASSERT_TRUE(seen.insert(got).second) << "row " << th << " duplicate id " << got;
      if (got != want) {
        const double a = score[got], b = score[want];
        ASSERT_TRUE(a == b || std::abs(a - b) <= tol)
            << "row " << th << " slot " << s << ": gpu block " << got << " (score " << a
            << ") cpu block " << want << " (score " << b << "), tie tolerance " << tol;
        ++ties;
      }
    }
  }
  std::printf("[ %-40s ] rows=%lld exact except %lld rounding ties\n",
              ("indexer_topk len" + std::to_string(c.len) + " S" + std::to_string(c.ps)).c_str(),
              static_cast<long long>(c.t * c.hix), static_cast<long long>(ties));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaIndexerTopk,
    ::testing::Values(IndexerCase{9, 2, 16, 4, 3, 1, 0, 45}, IndexerCase{6, 2, 16, 4, 4, 2, 1, 45},
                      // real widths: 4 index heads x 128, pages of 128, top-16, ~6K context
                      IndexerCase{4, 4, 128, 128, 16, 1, 0, 6000},
                      IndexerCase{3, 4, 128, 128, 16, 1, 1, 2100}));

// ---------------------------------------------------------------------------------------------
// paged_attention. Scores s_j are within δ = gamma_D·Σ|q||k|·scale (+u) of exact on each side;
// softmax weights then move by p_j·2δ (first order), so the output moves by at most
// 2δ·Σ p_j|v_j - o|; the weighted sum and normalisation add (n + 8)u·Σ p_j|v_j| with exp's own
// error. Bound = 2·(2δ_max·Σ p|v - o| + gamma_{n+8}·Σ p|v|) for the two sides.
// ---------------------------------------------------------------------------------------------
struct AttnCase {
  int64_t t, h, hkv, d, ps, top_k, len;
  bool sparse;
};
class CudaPagedAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaPagedAttention, MatchesCpu) {
  const AttnCase c = GetParam();
  PagedFixture f(c.len, c.ps, c.hkv, c.d, 8, 50);
  const int64_t nb = static_cast<int64_t>(f.table.size());
  auto q = randn(c.t * c.h * c.d, 51, 1.5f);
  std::vector<int32_t> pos(c.t);
  for (int64_t i = 0; i < c.t; ++i) pos[i] = static_cast<int32_t>(c.len - c.t + i);
  pos[0] = std::min<int32_t>(3, pos[0]);
  // A random selection per (token, group) with duplicates, -1 holes and blocks past the query
  // (all of which the op must skip); the local block is always included.
  std::mt19937 rng(52);
  std::vector<int32_t> sel(c.t * c.hkv * c.top_k);
  for (int64_t tg = 0; tg < c.t * c.hkv; ++tg) {
    const int64_t qb = pos[tg / c.hkv] / c.ps;
    for (int64_t s = 0; s < c.top_k; ++s) {
      int64_t r = rng() % 10;
      sel[tg * c.top_k + s] = r == 0 ? -1 : r == 1 ? int32_t(qb + 1) : int32_t(rng() % (qb + 1));
    }
    sel[tg * c.top_k + c.top_k - 1] = int32_t(qb);
  }
  const float scale = 1.0f / std::sqrt(float(c.d));
  KvLayerView hv{f.k.data(), f.v.data(), nullptr, f.pages, f.ps, c.hkv, c.d, 0};
  const int32_t* hsel = c.sparse ? sel.data() : nullptr;
  std::vector<float> want(c.t * c.h * c.d);
  cpu()->paged_attention({q.data(), hv, pos.data(), f.table.data(), hsel, want.data(), c.t, c.h, nb,
                          c.hkv, c.top_k, scale});
  Dev<float> dq(q), dk(f.k), dv(f.v);
  Dev<int32_t> dpos(pos), dtab(f.table), dsel(sel);
  auto dout = Dev<float>::poisoned(c.t * c.h * c.d);
  KvLayerView gv{dk.ptr(), dv.ptr(), nullptr, f.pages, f.ps, c.hkv, c.d, 0};
  gpu()->paged_attention({dq.ptr(), gv, dpos.ptr(), dtab.ptr(), c.sparse ? dsel.ptr() : nullptr,
                          dout.ptr(), c.t, c.h, nb, c.hkv, c.top_k, scale});
  std::vector<double> bound(want.size());
  for (int64_t tn = 0; tn < c.t * c.h; ++tn) {
    const int64_t t = tn / c.h, n = tn % c.h, g = n / (c.h / c.hkv), qb = pos[t] / c.ps;
    std::set<int64_t> blocks;
    if (c.sparse) {
      for (int64_t s = 0; s < c.top_k; ++s) {
        int64_t b = sel[(t * c.hkv + g) * c.top_k + s];
        if (b >= 0 && b <= qb) blocks.insert(b);
      }
    } else {
      for (int64_t b = 0; b <= qb; ++b) blocks.insert(b);
    }
    std::vector<double> s, qk;
    std::vector<int64_t> keys;
    for (int64_t b : blocks)
      for (int64_t j = b * c.ps; j <= std::min<int64_t>(pos[t], (b + 1) * c.ps - 1); ++j) {
        double dot = 0, a = 0;
        for (int64_t i = 0; i < c.d; ++i) {
          dot += double(q[tn * c.d + i]) * f.krow(j, g)[i];
          a += std::abs(double(q[tn * c.d + i]) * f.krow(j, g)[i]);
        }
        s.push_back(dot * scale);
        qk.push_back(a * scale);
        keys.push_back(j);
      }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0, delta = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      sum += std::exp(s[j] - mx);
      delta = std::max(delta, gamma(c.d + 2) * qk[j] + kU * std::abs(s[j]));
    }
    const double n_keys = static_cast<double>(s.size());
    for (int64_t i = 0; i < c.d; ++i) {
      double o = 0, pv = 0;
      for (size_t j = 0; j < s.size(); ++j) o += std::exp(s[j] - mx) / sum * f.vrow(keys[j], g)[i];
      double dev = 0;
      for (size_t j = 0; j < s.size(); ++j) {
        const double p = std::exp(s[j] - mx) / sum, vv = f.vrow(keys[j], g)[i];
        pv += p * std::abs(vv);
        dev += p * std::abs(vv - o);
      }
      bound[tn * c.d + i] = 2 * (2 * delta * dev + gamma(n_keys + 8) * pv) + 1e-30;
    }
  }
  expect_close(dout.host(), want, bound,
               std::string(c.sparse ? "sparse" : "dense") + " attention H" + std::to_string(c.h) +
                   "/" + std::to_string(c.hkv) + " D" + std::to_string(c.d) + " S" +
                   std::to_string(c.ps) + " len" + std::to_string(c.len));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaPagedAttention,
    ::testing::Values(AttnCase{9, 4, 2, 16, 4, 3, 45, true}, AttnCase{9, 4, 2, 16, 4, 3, 45, false},
                      // real widths: 64 query heads over 4 KV heads of 128, pages of 128, top-16
                      AttnCase{3, 64, 4, 128, 128, 16, 3000, true},
                      AttnCase{2, 64, 4, 128, 128, 16, 700, false}));

}  // namespace
}  // namespace m3::cuda_test

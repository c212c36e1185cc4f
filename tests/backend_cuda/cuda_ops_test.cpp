// Every float32 CUDA op against the CPU backend (the oracle) on random inputs of several shapes,
// from tiny to the real MiniMax-M3.1-Flash widths. Tolerances are derived per op (comments);
// each comparison prints the worst element as |gpu - cpu| / bound. Integer outputs (top-k ids,
// block selections, cache contents) must match exactly, except where the double-precision scores
// show a near-tie that rounding may legitimately resolve either way (then both answers must be
// equally good to within the rounding bound).
#include <algorithm>
#include <limits>
#include <numeric>

#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

// ---------------------------------------------------------------------------------------------
// linear: both results lie within gamma_K·Σ|x||w| of the exact dot product whatever the
// summation order (cuBLASLt's is unknown), so |gpu - cpu| <= 2·gamma_K·Σ|x||w|.
// ---------------------------------------------------------------------------------------------
struct LinearCase {
  int64_t m, n, k;
};
class CudaLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaLinear, MatchesCpu) {
  auto [m, n, k] = GetParam();
  auto x = randn(m * k, 1), w = randn(n * k, 2, 0.05f);
  for (bool acc : {false, true}) {
    std::vector<float> want(static_cast<size_t>(m * n), acc ? 0.75f : 0.0f);
    cpu()->linear({x.data(), w.data(), want.data(), m, n, k, acc});
    Dev<float> dx(x), dw(w);
    auto dy = acc ? Dev<float>(std::vector<float>(want.size(), 0.75f))
                  : Dev<float>::poisoned(m * n);
    gpu()->linear({dx.ptr(), dw.ptr(), dy.ptr(), m, n, k, acc});
    std::vector<double> bound(want.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double a = acc ? 0.75 : 0.0;
        for (int64_t q = 0; q < k; ++q) a += std::abs(double(x[i * k + q]) * w[j * k + q]);
        bound[i * n + j] = 2 * gamma(k + 1) * a + 1e-30;
      }
    expect_close(dy.host(), want, bound,
                 "linear " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                     std::to_string(k) + (acc ? " acc" : ""));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLinear,
                         ::testing::Values(LinearCase{1, 1, 1}, LinearCase{3, 50, 64},
                                           LinearCase{37, 101, 67}, LinearCase{1, 512, 6144},
                                           LinearCase{8, 6144, 1024}, LinearCase{64, 256, 3072}));

// ---------------------------------------------------------------------------------------------
// rms_norm: the GPU sums squares in float (relative error <= gamma_dim), the CPU in double; the
// reciprocal square root halves that error and adds ~2u, the two products and 1 + w add 3u each
// side: |gpu - cpu| <= (gamma_dim / 2 + 12u)·|y|.
// ---------------------------------------------------------------------------------------------
TEST(CudaRmsNorm, MatchesCpu) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 7}, {13, 128}, {5, 6144}, {64, 128}}) {
    auto x = randn(rows * dim, 3, 3.0f), w = randn(dim, 4, 0.5f);
    for (bool unit : {true, false}) {
      std::vector<float> want(x.size());
      cpu()->rms_norm({x.data(), w.data(), want.data(), rows, dim, 1e-6f, unit});
      Dev<float> dx(x), dw(w);
      auto dy = Dev<float>::poisoned(rows * dim);
      gpu()->rms_norm({dx.ptr(), dw.ptr(), dy.ptr(), rows, dim, 1e-6f, unit});
      std::vector<double> bound(want.size());
      for (size_t i = 0; i < want.size(); ++i)
        bound[i] = (gamma(dim) / 2 + 12 * kU) * std::abs(want[i]) + 1e-30;
      expect_close(dy.host(), want, bound,
                   "rms_norm " + std::to_string(rows) + "x" + std::to_string(dim) +
                       (unit ? " (1+w)" : " (w)"));
      // In place.
      gpu()->rms_norm({dx.ptr(), dw.ptr(), dx.ptr(), rows, dim, 1e-6f, unit});
      expect_close(dx.host(), want, bound, "rms_norm in place");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rope: same float operations in the same order as the CPU; only cos/sin may differ by an ulp of
// float after rounding double results, so |gpu - cpu| <= 2u·(|x_d| + |x_partner|).
// ---------------------------------------------------------------------------------------------
TEST(CudaRope, MatchesCpu) {
  struct C {
    int64_t t, h, d, rotary_dim, rot_width;
  };
  std::vector<int32_t> pos = {0, 1, 2, 7, 127, 128, 300, 1000, 4095, 32767, 131071, 1048575};
  for (C c : {C{12, 3, 16, 8, 8}, C{12, 64, 128, 64, 64}, C{12, 4, 128, 64, 64},
              C{12, 2, 16, 32, 16}, C{12, 1, 32, 32, 32}}) {
    auto x = randn(c.t * c.h * c.d, 7);
    auto want = x;
    cpu()->rope({want.data(), pos.data(), c.t, c.h, c.d, c.rotary_dim, c.rot_width, 5e6});
    Dev<float> dx(x);
    Dev<int32_t> dp(pos);
    gpu()->rope({dx.ptr(), dp.ptr(), c.t, c.h, c.d, c.rotary_dim, c.rot_width, 5e6});
    std::vector<double> bound(x.size());
    const int64_t half = c.rot_width / 2;
    for (int64_t r = 0; r < c.t * c.h; ++r)
      for (int64_t d = 0; d < c.d; ++d) {
        size_t i = r * c.d + d;
        double partner = d < c.rot_width ? x[d < half ? i + half : i - half] : 0.0;
        bound[i] = 2 * kU * (std::abs(x[i]) + std::abs(partner)) + 1e-30;
      }
    expect_close(dx.host(), want, bound,
                 "rope h" + std::to_string(c.h) + " d" + std::to_string(c.d) + " rot" +
                     std::to_string(c.rot_width));
  }
}

// ---------------------------------------------------------------------------------------------
// swiglu_oai: expf and std::exp each within 2 ulp: σ carries <= 5u relative error per side,
// the products 2u: |gpu - cpu| <= 16u·|out|.
// ---------------------------------------------------------------------------------------------
TEST(CudaSwigluOai, MatchesCpu) {
  for (auto [m, inter] : {std::pair<int64_t, int64_t>{7, 40}, {4, 3072}, {1, 12288}}) {
    auto gu = randn(m * 2 * inter, 8, 5.0f);
    gu[0] = 7.0f, gu[inter] = -7.0f, gu[1] = 7.5f, gu[inter + 1] = 9.0f;
    std::vector<float> want(m * inter);
    cpu()->swiglu_oai({gu.data(), want.data(), m, inter, 1.702f, 7.0f});
    Dev<float> dg(gu);
    auto dout = Dev<float>::poisoned(m * inter);
    gpu()->swiglu_oai({dg.ptr(), dout.ptr(), m, inter, 1.702f, 7.0f});
    std::vector<double> bound(want.size());
    for (size_t i = 0; i < want.size(); ++i) bound[i] = 16 * kU * std::abs(want[i]) + 1e-37;
    expect_close(dout.host(), want, bound, "swiglu_oai " + std::to_string(m) + "x" +
                                               std::to_string(inter));
  }
}

// ---------------------------------------------------------------------------------------------
// Exact ops: add (one IEEE add), embedding, gather_rows, kv_write.
// ---------------------------------------------------------------------------------------------
TEST(CudaExactOps, AddEmbeddingGatherKvWrite) {
  const int64_t n = 100003;
  auto a = randn(n, 9), b = randn(n, 10);
  std::vector<float> want(n);
  cpu()->add({a.data(), b.data(), want.data(), n});
  Dev<float> da(a), db(b);
  gpu()->add({da.ptr(), db.ptr(), da.ptr(), n});
  EXPECT_EQ(da.host(), want) << "add";

  const int64_t vocab = 1000, dim = 6144, t = 9;
  auto table = randn(vocab * dim, 11);
  std::vector<int32_t> ids = {0, 999, 5, 5, 17, 400, 1, 998, 3};
  std::vector<float> emb(t * dim);
  cpu()->embedding({table.data(), ids.data(), emb.data(), t, vocab, dim});
  Dev<float> dt(table);
  Dev<int32_t> di(ids);
  auto de = Dev<float>::poisoned(t * dim);
  gpu()->embedding({dt.ptr(), di.ptr(), de.ptr(), t, vocab, dim});
  EXPECT_EQ(de.host(), emb) << "embedding";

  std::vector<int32_t> rows = {8, 0, 3, 3};
  std::vector<float> g(rows.size() * dim);
  cpu()->gather_rows({emb.data(), rows.data(), g.data(), 4, dim});
  Dev<int32_t> dr(rows);
  auto dg = Dev<float>::poisoned(4 * dim);
  gpu()->gather_rows({de.ptr(), dr.ptr(), dg.ptr(), 4, dim});
  EXPECT_EQ(dg.host(), g) << "gather_rows";

  // kv_write at the real widths: 4 KV heads x 128, index keys 128, pages of 128.
  const int64_t pages = 6, ps = 128, hkv = 4, d = 128, dix = 128, tt = 200;
  std::vector<int32_t> table_ids = {4, 1, 5, 0};  // logical block -> page
  std::vector<int32_t> pos(tt);
  std::iota(pos.begin(), pos.end(), 150);  // crosses a page boundary
  auto k = randn(tt * hkv * d, 12), v = randn(tt * hkv * d, 13), ik = randn(tt * dix, 14);
  std::vector<float> ck(pages * ps * hkv * d, 0.5f), cv = ck, cik(pages * ps * dix, 0.5f);
  KvLayerView hv{ck.data(), cv.data(), cik.data(), pages, ps, hkv, d, dix};
  cpu()->kv_write({hv, k.data(), v.data(), ik.data(), pos.data(), table_ids.data(), tt, 4});
  Dev<float> dck(std::vector<float>(ck.size(), 0.5f)), dcv(std::vector<float>(cv.size(), 0.5f)),
      dcik(std::vector<float>(cik.size(), 0.5f)), dk(k), dv(v), dik(ik);
  Dev<int32_t> dpos(pos), dtab(table_ids);
  KvLayerView gv{dck.ptr(), dcv.ptr(), dcik.ptr(), pages, ps, hkv, d, dix};
  gpu()->kv_write({gv, dk.ptr(), dv.ptr(), dik.ptr(), dpos.ptr(), dtab.ptr(), tt, 4});
  EXPECT_EQ(dck.host(), ck) << "kv_write K";
  EXPECT_EQ(dcv.host(), cv) << "kv_write V";
  EXPECT_EQ(dcik.host(), cik) << "kv_write index keys";
  std::printf("[ %-40s ] exact\n", "add/embedding/gather_rows/kv_write");
}

// ---------------------------------------------------------------------------------------------
// router_topk: ids must match exactly unless the double-precision choice scores of two
// candidates at the selection boundary are within 8u (a rounding tie); weights: the sigmoid
// (<= 5u per side), the K-term denominator (gamma_K), division and scaling (2u):
// |gpu - cpu| <= (2·5u + 2·gamma_K + 4u)·|w|.
// ---------------------------------------------------------------------------------------------
TEST(CudaRouterTopk, MatchesCpu) {
  for (auto [m, e, k] : {std::tuple<int64_t, int64_t, int64_t>{5, 6, 2}, {64, 128, 4},
                         {33, 128, 8}, {3, 256, 16}}) {
    auto logits = randn(m * e, 20, 2.0f), bias = randn(e, 21, 0.3f);
    std::vector<int32_t> ids(m * k);
    std::vector<float> wts(m * k);
    cpu()->router_topk({logits.data(), bias.data(), ids.data(), wts.data(), m, e, k, 2.0f});
    Dev<float> dl(logits), db(bias);
    auto di = Dev<int32_t>::poisoned(m * k);
    auto dw = Dev<float>::poisoned(m * k);
    gpu()->router_topk({dl.ptr(), db.ptr(), di.ptr(), dw.ptr(), m, e, k, 2.0f});
    auto gids = di.host();
    auto gw = dw.host();
    int64_t ties = 0;
    std::vector<float> want_w, got_w;
    std::vector<double> bound;
    for (int64_t r = 0; r < m; ++r) {
      std::vector<double> choice(e);
      for (int64_t x = 0; x < e; ++x)
        choice[x] = 1.0 / (1.0 + std::exp(-double(logits[r * e + x]))) + bias[x];
      std::vector<double> sorted = choice;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const bool tie = k < e && sorted[k - 1] - sorted[k] <= 8 * kU * std::abs(sorted[k]);
      if (tie) {
        ++ties;
        continue;
      }
      for (int64_t s = 0; s < k; ++s) {
        ASSERT_EQ(gids[r * k + s], ids[r * k + s]) << "row " << r << " slot " << s;
        want_w.push_back(wts[r * k + s]);
        got_w.push_back(gw[r * k + s]);
        bound.push_back((14 * kU + 2 * gamma(k)) * std::abs(wts[r * k + s]) + 1e-37);
      }
    }
    EXPECT_LE(ties, 1) << "more near-ties than random inputs should give";
    expect_close(got_w, want_w, bound,
                 "router_topk m" + std::to_string(m) + " E" + std::to_string(e) + " k" +
                     std::to_string(k));
  }
}

}  // namespace
}  // namespace m3::cuda_test

namespace m3::cuda_test {
namespace {

// The caching allocator: freed blocks are reused for requests of at most their size and at least
// half of it; sizes are rounded (512 B below 1 MiB, 2 MiB above); stats add up.
TEST(CudaCachingAllocator, ReusesFreedBlocks) {
  // Sizes no other test uses, so the cache holds nothing that fits them at first.
  auto* be = gpu();
  be->synchronize();
  const int64_t small = 123 * 512 + 7, large = (int64_t{37} << 20) + 3;  // -> 63488, 38 MiB
  const auto s0 = be->allocator_stats();
  void* a = be->alloc(small);
  void* b = be->alloc(large);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto s1 = be->allocator_stats();
  EXPECT_GE(s1.bytes_in_use - s0.bytes_in_use, 124 * 512 + (int64_t{38} << 20));  // rounded up
  be->free(a);
  be->free(b);
  EXPECT_EQ(be->allocator_stats().bytes_in_use, s0.bytes_in_use);
  // The same requests again are served from the cache: no cudaMalloc. (The small one may get
  // another cached block of a fitting size that an earlier test freed, so only the large one,
  // of a size no other test uses, must come back as the same block.)
  void* a2 = be->alloc(small);
  void* b2 = be->alloc(large - 1000);
  EXPECT_NE(a2, nullptr);
  EXPECT_EQ(b2, b);
  const auto s2 = be->allocator_stats();
  EXPECT_EQ(s2.num_device_allocs, s1.num_device_allocs);
  EXPECT_EQ(s2.num_cache_hits - s1.num_cache_hits, 2);
  be->free(a2);
  be->free(b2);
  std::printf("[ %-40s ] device allocs %lld, cache hits %lld, peak %lld B\n", "caching allocator",
              (long long)s2.num_device_allocs, (long long)s2.num_cache_hits,
              (long long)s2.peak_in_use);
}

}  // namespace
}  // namespace m3::cuda_test

#include "backend/cuda/sampling/argmax.h"

namespace m3::cuda_test {
namespace {

// Greedy sampling: exact ids, ties to the lowest id, NaN never chosen, all-NaN row -> -1.
TEST(CudaArgmax, ExactWithTiesAndNan) {
  const int64_t b = 6, v = 200064;
  auto logits = randn(b * v, 90, 3.0f);
  // Row 1: a tie between ids 7 and 150000 at the maximum; row 2: NaNs around the max;
  // row 3: all NaN; row 4: the maximum at the last id.
  logits[1 * v + 7] = 100.0f, logits[1 * v + 150000] = 100.0f;
  logits[2 * v + 0] = NAN, logits[2 * v + 5] = 50.0f, logits[2 * v + 6] = NAN;
  for (int64_t i = 0; i < v; ++i) logits[3 * v + i] = NAN;
  logits[4 * v + v - 1] = 1e30f;
  std::vector<int32_t> want(b);
  for (int64_t r = 0; r < b; ++r) {
    int64_t best = -1;
    for (int64_t i = 0; i < v; ++i) {
      const float x = logits[r * v + i];
      if (std::isnan(x)) continue;
      if (best < 0 || x > logits[r * v + best]) best = i;
    }
    want[r] = static_cast<int32_t>(best);
  }
  EXPECT_EQ(want[1], 7);
  EXPECT_EQ(want[3], -1);
  Dev<float> dl(logits);
  auto dout = Dev<int32_t>::poisoned(b);
  cuda::ArgmaxParams p{dl.ptr(), b, v, v, dout.ptr()};
  ASSERT_TRUE(cuda::launch_argmax(p, stream()).is_ok());
  EXPECT_EQ(dout.host(), want);
  std::printf("[ %-40s ] exact (B=%lld, V=%lld)\n", "argmax", (long long)b, (long long)v);
}

}  // namespace
}  // namespace m3::cuda_test

#include "backend/cuda/dummy/dummy_weights.h"
#include "core/dtype.h"

namespace m3::cuda_test {
namespace {

// Dummy weights: valid codes only (no E4M3 NaN), scales in their documented ranges, bf16 values
// with the asked standard deviation, and contents that depend only on (kind, seed, index).
TEST(CudaDummyWeights, ValidCodesAndStatistics) {
  auto* s = stream();
  const int64_t n = 1 << 20;
  auto codes = Dev<uint8_t>::poisoned(n), e8 = Dev<uint8_t>::poisoned(n),
       e4 = Dev<uint8_t>::poisoned(n);
  auto bf = Dev<uint16_t>::poisoned(n), bf2 = Dev<uint16_t>::poisoned(n);
  ASSERT_TRUE(cuda::fill_dummy(codes.ptr(), n, cuda::DummyKind::kE4m3Codes, 1, 1, s).is_ok());
  ASSERT_TRUE(cuda::fill_dummy(e8.ptr(), n, cuda::DummyKind::kE8m0Scales, 2, 1, s).is_ok());
  ASSERT_TRUE(cuda::fill_dummy(e4.ptr(), n, cuda::DummyKind::kE4m3Scales, 3, 1, s).is_ok());
  ASSERT_TRUE(cuda::fill_dummy(bf.ptr(), n, cuda::DummyKind::kBf16Normal, 4, 0.02f, s).is_ok());
  ASSERT_TRUE(cuda::fill_dummy(bf2.ptr(), n, cuda::DummyKind::kBf16Normal, 4, 0.02f, s).is_ok());
  for (uint8_t c : codes.host()) ASSERT_NE(c & 0x7F, 0x7F) << "E4M3 NaN code";
  for (uint8_t c : e8.host()) ASSERT_TRUE(c >= 116 && c <= 119) << int(c);
  for (uint8_t c : e4.host()) {
    const float v = e4m3_to_f32(c);
    ASSERT_TRUE(v >= 0.5f && v <= 120.0f) << int(c);
  }
  auto h = bf.host();
  EXPECT_EQ(h, bf2.host()) << "same seed, same contents";
  double sum = 0, sq = 0;
  for (uint16_t x : h) {
    const double v = bf16_to_f32(x);
    sum += v, sq += v * v;
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  // 2^20 samples: the mean's standard error is 0.02/1024; the sd estimate's is ~0.1%.
  EXPECT_LT(std::abs(mean), 1e-4);
  EXPECT_NEAR(sd, 0.02, 0.02 * 0.01);
  std::printf("[ %-40s ] bf16 mean %.2e sd %.5f (want 0.02)\n", "dummy weights", mean, sd);
}

}  // namespace
}  // namespace m3::cuda_test

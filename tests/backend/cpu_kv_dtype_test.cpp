// --kv-cache-dtype in the CPU backend: kv_write quantises, and the indexer and attention read the
// stored rows through exact dequantisation (quant/kv_quant.h). So the ops over a bf16 / fp8 / fp4
// cache must equal, bit for bit, the same ops over a float32 cache that holds the dequantised
// values; and those values must be the kv_quant rounding of what was written (its own tests bound
// that error). Written in one prefill chunk, then a second chunk, then decode steps one token at a
// time, as the model writes them.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace m3 {
namespace {

constexpr int64_t kPage = 16, kHkv = 2, kD = 32, kDix = 16, kLen = 53, kHeads = 4, kTopk = 2;

std::vector<float> randn(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

struct QuantTensor {
  std::vector<uint8_t> codes, block_scales;
  std::vector<float> scales;
  QuantTensor(KvCacheDtype d, int64_t pages, int64_t heads, int64_t dim)
      : codes(size_t(pages * kPage * heads * kv_row_code_bytes(d, dim))),
        block_scales(size_t(pages * kPage * heads * kv_row_block_scale_bytes(d, dim)) + 1),
        scales(size_t(pages * heads)) {}
  KvQuantStore store() { return {codes.data(), block_scales.data(), scales.data()}; }
};

TEST(CpuKvDtype, OpsReadTheDequantisedValues) {
  CpuBackend be(2);
  const int64_t blocks = (kLen + kPage - 1) / kPage, pages = blocks + 3;
  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(int32_t((b * 5 + 2) % pages));  // a permutation
  // Keys of growing size along the sequence, so page scales are raised mid-page.
  std::vector<float> k = randn(kLen * kHkv * kD, 1, 1.0f), v = randn(kLen * kHkv * kD, 2, 3.0f),
                     ik = randn(kLen * kDix, 3, 1.0f);
  for (int64_t t = 0; t < kLen; ++t) {
    const float grow = 1.0f + float(t % kPage);
    for (int64_t i = 0; i < kHkv * kD; ++i) k[size_t(t * kHkv * kD + i)] *= grow;
    for (int64_t i = 0; i < kDix; ++i) ik[size_t(t * kDix + i)] *= grow;
  }
  std::vector<int32_t> pos(kLen);
  std::iota(pos.begin(), pos.end(), 0);

  for (KvCacheDtype d : {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    SCOPED_TRACE(kv_cache_dtype_name(d));
    QuantTensor kq(d, pages, kHkv, kD), vq(d, pages, kHkv, kD), iq(d, pages, 1, kDix);
    KvLayerView qv{nullptr, nullptr, nullptr, pages, kPage, kHkv, kD, kDix};
    qv.dtype = d;
    qv.kq = kq.store();
    qv.vq = vq.store();
    qv.iq = iq.store();
    // A prefill chunk, a second chunk, then decode steps.
    const int64_t c1 = 21, c2 = 40;
    auto write = [&](int64_t from, int64_t n) {
      be.kv_write({qv, k.data() + from * kHkv * kD, v.data() + from * kHkv * kD,
                   ik.data() + from * kDix, pos.data() + from, table.data(), n, blocks});
    };
    write(0, c1);
    write(c1, c2 - c1);
    for (int64_t t = c2; t < kLen; ++t) write(t, 1);

    // The float32 cache holding the dequantised rows.
    std::vector<float> kf(size_t(pages * kPage * kHkv * kD), NAN), vf = kf,
                       ikf(size_t(pages * kPage * kDix), NAN);
    double worst_k = 0;
    for (int64_t t = 0; t < kLen; ++t) {
      const int64_t page = table[size_t(t / kPage)], r = t % kPage, slot = page * kPage + r;
      for (int64_t h = 0; h < kHkv; ++h) {
        kv_read_row(d, kv_page_head(d, qv.kq, page, kPage, kHkv, h, kD), r, kD,
                    kf.data() + (slot * kHkv + h) * kD);
        kv_read_row(d, kv_page_head(d, qv.vq, page, kPage, kHkv, h, kD), r, kD,
                    vf.data() + (slot * kHkv + h) * kD);
        for (int64_t i = 0; i < kD; ++i)
          worst_k = std::max(worst_k, double(std::fabs(kf[size_t((slot * kHkv + h) * kD + i)] -
                                                       k[size_t((t * kHkv + h) * kD + i)])));
      }
      kv_read_row(d, kv_page_head(d, qv.iq, page, kPage, 1, 0, kDix), r, kDix,
                  ikf.data() + slot * kDix);
    }
    // The stored keys are the written ones, rounded (not garbage, not another token's).
    // |K| < 16 x 5 sigma; fp4's error is <= 17/16 x 1/6 of its block's max, fp8's and bf16's
    // <= 2^-4 of the element (kv_quant_test states the bounds).
    EXPECT_LT(worst_k, d == KvCacheDtype::kFp4E2M1 ? 16.0 * 5 * 17 / 96 : 16.0 * 5 / 16);
    KvLayerView fv{kf.data(), vf.data(), ikf.data(), pages, kPage, kHkv, kD, kDix};

    // Indexer and attention for every position (prefill) and the last one alone (decode).
    for (int64_t first : {int64_t{0}, kLen - 1}) {
      const int64_t t = kLen - first;
      std::vector<float> iq_in = randn(t * kHkv * kDix, 7, 1.0f), q = randn(t * kHeads * kD, 8, 0.3f);
      std::vector<int32_t> sel_q(size_t(t * kHkv * kTopk)), sel_f = sel_q;
      IndexerTopkParams ip{iq_in.data(), qv, pos.data() + first, table.data(), sel_q.data(),
                           t, kHkv, blocks, kTopk, 1, 1};
      be.indexer_topk(ip);
      ip.cache = fv;
      ip.selected = sel_f.data();
      be.indexer_topk(ip);
      EXPECT_EQ(sel_q, sel_f);
      for (const int32_t* sel : {static_cast<const int32_t*>(nullptr),
                                 static_cast<const int32_t*>(sel_f.data())}) {
        std::vector<float> out_q(size_t(t * kHeads * kD)), out_f = out_q;
        PagedAttentionParams ap{q.data(), qv, pos.data() + first, table.data(), sel,
                                out_q.data(), t, kHeads, blocks, kHkv, kTopk,
                                1.0f / std::sqrt(float(kD))};
        be.paged_attention(ap);
        ap.cache = fv;
        ap.out = out_f.data();
        be.paged_attention(ap);
        EXPECT_EQ(out_q, out_f) << (sel ? "sparse" : "dense") << " from position " << first;
      }
    }
  }
}

}  // namespace
}  // namespace m3

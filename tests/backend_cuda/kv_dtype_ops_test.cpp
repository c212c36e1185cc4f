// --kv-cache-dtype on the GPU's float32 backend: kv_write into a bf16 / fp8_e4m3 / fp4_e2m1 cache
// and the indexer and paged attention reading it, against the CPU reference.
//  * kv_write must store exactly the CPU's bytes (codes, block scales, page-head scales): both use
//    the same conversions (core/dtype.h, quant/kv_quant.h) and the same scale rule, including the
//    re-encoding of earlier rows when a page-head's scale grows.
//  * The indexer and attention read each element through exact dequantisation, so over the
//    quantised cache they must equal, bit for bit, the same GPU ops over a float32 cache holding
//    the dequantised values (whose agreement with the CPU cuda_composite_ops_test bounds).
// Decode (one token per call, positions crossing pages) and a prefill chunk, at the real widths
// (4 KV heads x 128, 128-wide index keys, pages of 128).
#include <numeric>

#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

constexpr int64_t kPs = 128, kHkv = 4, kD = 128, kDix = 128, kH = 16, kTopk = 2;

struct HostStore {
  std::vector<uint8_t> codes, block_scales;
  std::vector<float> scales;
  HostStore(KvCacheDtype d, int64_t pages, int64_t heads, int64_t dim)
      : codes(size_t(pages * kPs * heads * kv_row_code_bytes(d, dim))),
        block_scales(size_t(pages * kPs * heads * kv_row_block_scale_bytes(d, dim)) + 1),
        scales(size_t(pages * heads)) {}
  KvQuantStore view() { return {codes.data(), block_scales.data(), scales.data()}; }
};

struct DevStore {
  Dev<uint8_t> codes, block_scales;
  Dev<float> scales;
  explicit DevStore(const HostStore& h)
      : codes(std::vector<uint8_t>(h.codes.size())),
        block_scales(std::vector<uint8_t>(h.block_scales.size())),
        scales(std::vector<float>(h.scales.size())) {}
  KvQuantStore view() { return {codes.ptr(), block_scales.ptr(), scales.ptr()}; }
};

TEST(CudaKvDtype, WriteMatchesCpuAndReadsAreTheDequantisedValues) {
  const int64_t len = 300, blocks = (len + kPs - 1) / kPs, pages = blocks + 2;
  std::vector<int32_t> table = {3, 0, 4};
  std::vector<int32_t> pos(len);
  std::iota(pos.begin(), pos.end(), 0);
  auto k = randn(len * kHkv * kD, 1), v = randn(len * kHkv * kD, 2, 3.0f), ik = randn(len * kDix, 3);
  for (int64_t t = 0; t < len; ++t) {  // growing within each page: scales raised mid-page
    const float grow = 1.0f + float(t % kPs) / 8;
    for (int64_t i = 0; i < kHkv * kD; ++i) k[t * kHkv * kD + i] *= grow;
    for (int64_t i = 0; i < kDix; ++i) ik[t * kDix + i] *= grow;
  }
  Dev<float> dk(k), dv(v), dik(ik);
  Dev<int32_t> dpos(pos), dtab(table);
  for (KvCacheDtype d : {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    SCOPED_TRACE(kv_cache_dtype_name(d));
    HostStore hk(d, pages, kHkv, kD), hv(d, pages, kHkv, kD), hi(d, pages, 1, kDix);
    DevStore gk(hk), gv(hv), gi(hi);
    KvLayerView hview{nullptr, nullptr, nullptr, pages, kPs, kHkv, kD, kDix};
    hview.dtype = d;
    hview.kq = hk.view(), hview.vq = hv.view(), hview.iq = hi.view();
    KvLayerView gview = hview;
    gview.kq = gk.view(), gview.vq = gv.view(), gview.iq = gi.view();
    // A prefill chunk of 200 tokens, then decode steps of one.
    auto write = [&](int64_t from, int64_t n) {
      cpu()->kv_write({hview, k.data() + from * kHkv * kD, v.data() + from * kHkv * kD,
                       ik.data() + from * kDix, pos.data() + from, table.data(), n, blocks});
      gpu()->kv_write({gview, dk.ptr() + from * kHkv * kD, dv.ptr() + from * kHkv * kD,
                       dik.ptr() + from * kDix, dpos.ptr() + from, dtab.ptr(), n, blocks});
    };
    write(0, 200);
    for (int64_t t = 200; t < len; ++t) write(t, 1);
    EXPECT_EQ(gk.codes.host(), hk.codes);
    EXPECT_EQ(gv.codes.host(), hv.codes);
    EXPECT_EQ(gi.codes.host(), hi.codes);
    EXPECT_EQ(gk.block_scales.host(), hk.block_scales);
    EXPECT_EQ(gi.block_scales.host(), hi.block_scales);
    EXPECT_EQ(gk.scales.host(), hk.scales);
    EXPECT_EQ(gv.scales.host(), hv.scales);
    EXPECT_EQ(gi.scales.host(), hi.scales);

    // The float32 cache of the dequantised values (poisoned where nothing was written).
    std::vector<float> kf(size_t(pages * kPs * kHkv * kD), NAN), vf = kf,
                       ikf(size_t(pages * kPs * kDix), NAN);
    for (int64_t t = 0; t < len; ++t) {
      const int64_t page = table[size_t(t / kPs)], r = t % kPs, slot = page * kPs + r;
      for (int64_t h = 0; h < kHkv; ++h) {
        kv_read_row(d, kv_page_head(d, hview.kq, page, kPs, kHkv, h, kD), r, kD,
                    kf.data() + (slot * kHkv + h) * kD);
        kv_read_row(d, kv_page_head(d, hview.vq, page, kPs, kHkv, h, kD), r, kD,
                    vf.data() + (slot * kHkv + h) * kD);
      }
      kv_read_row(d, kv_page_head(d, hview.iq, page, kPs, 1, 0, kDix), r, kDix,
                  ikf.data() + slot * kDix);
    }
    Dev<float> dkf(kf), dvf(vf), dikf(ikf);
    KvLayerView fview{dkf.ptr(), dvf.ptr(), dikf.ptr(), pages, kPs, kHkv, kD, kDix};

    for (int64_t first : {int64_t{0}, len - 1}) {  // prefill over all positions; one decode token
      const int64_t t = len - first;
      Dev<float> diq(randn(t * kHkv * kDix, 7)), dq(randn(t * kH * kD, 8, 0.3f));
      auto sq = Dev<int32_t>::poisoned(t * kHkv * kTopk), sf = Dev<int32_t>::poisoned(t * kHkv * kTopk);
      IndexerTopkParams ip{diq.ptr(), gview, dpos.ptr() + first, dtab.ptr(), sq.ptr(),
                           t, kHkv, blocks, kTopk, 1, 0};
      gpu()->indexer_topk(ip);
      ip.cache = fview;
      ip.selected = sf.ptr();
      gpu()->indexer_topk(ip);
      EXPECT_EQ(sq.host(), sf.host()) << "indexer from position " << first;
      for (bool sparse : {false, true}) {
        auto oq = Dev<float>::poisoned(t * kH * kD), of = Dev<float>::poisoned(t * kH * kD);
        PagedAttentionParams ap{dq.ptr(), gview, dpos.ptr() + first, dtab.ptr(),
                                sparse ? sf.ptr() : nullptr, oq.ptr(), t, kH, blocks, kHkv, kTopk,
                                1.0f / std::sqrt(float(kD))};
        gpu()->paged_attention(ap);
        ap.cache = fview;
        ap.out = of.ptr();
        gpu()->paged_attention(ap);
        EXPECT_EQ(oq.host(), of.host())
            << (sparse ? "sparse" : "dense") << " attention from position " << first;
      }
    }
    std::printf("[ %-40s ] exact\n", (std::string("kv dtype ") + kv_cache_dtype_name(d)).c_str());
  }
}

}  // namespace
}  // namespace m3::cuda_test

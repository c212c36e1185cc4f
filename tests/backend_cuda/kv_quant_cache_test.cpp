// The real-shape path's quantised KV cache (kv/kv_quant_cache.h) against the CPU reference.
//  * launch_kv_append_quantised must leave exactly the bytes (codes, fp4 block scales, page-head
//    scales) that quant/kv_quant.h's kv_append_row leaves when the step's rows are appended one by
//    one in step order: both use the same conversions (core/dtype.h) and the same scale rule, and
//    the kernel appends a page-head's rows in order in one warp. The steps cover a prefill chunk
//    over three pages, a chunk that starts mid-page on rows written by an earlier step (whose
//    scale it must read, raise and re-encode), and a decode step of several sequences with
//    padding rows and a position past the table; values grow within a page so scales rise
//    mid-page.
//  * launch_kv_dequantise_pages must give bf16(kv_read_row), bit for bit (the values fit bf16
//    exactly, kv/kv_load.cuh), on the pages of the table and nowhere else.
#include <algorithm>
#include <cstring>

#include "backend/cuda/kv/kv_quant_cache.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

constexpr int64_t kS = 128, kHkv = 4, kD = 128, kDix = 128, kPages = 8, kMaxBlocks = 4;

// One tensor's store (codes, block scales, page-head scales) on the host.
struct HostStore {
  std::vector<uint8_t> codes, block_scales;
  std::vector<float> scales;
  HostStore(KvCacheDtype d, int64_t heads, int64_t dim)
      : codes(size_t(kPages * kS * heads * kv_row_code_bytes(d, dim))),
        block_scales(size_t(kPages * kS * heads * kv_row_block_scale_bytes(d, dim)) + 16),
        scales(size_t(kPages * heads)) {}
  KvQuantStore view() { return {codes.data(), block_scales.data(), scales.data()}; }
};

struct DevStore {
  Dev<uint8_t> codes, block_scales;
  Dev<float> scales;
  explicit DevStore(const HostStore& h)
      : codes(h.codes), block_scales(h.block_scales), scales(h.scales) {}
  KvQuantStore view() { return {codes.ptr(), block_scales.ptr(), scales.ptr()}; }
  void expect_equal(const HostStore& h, const std::string& what) {
    EXPECT_TRUE(codes.host() == h.codes) << what << ": codes differ";
    EXPECT_TRUE(block_scales.host() == h.block_scales) << what << ": block scales differ";
    const std::vector<float> s = scales.host();
    EXPECT_EQ(std::memcmp(s.data(), h.scales.data(), s.size() * 4), 0)
        << what << ": page-head scales differ";
  }
};

// A step: rows of (position, block table), their bf16 K, V and index-key values.
struct Step {
  std::vector<int32_t> positions, tables;  // tables: [t, kMaxBlocks]
  std::vector<uint16_t> k, v, ik;
  int64_t t() const { return static_cast<int64_t>(positions.size()); }
};

// Rows of one sequence at positions [start, start + n) through `table`, with values that grow
// along the page (so a later row needs a larger scale) and a zero row at every 37th position.
void add_rows(Step* s, const std::vector<int32_t>& table, int64_t start, int64_t n, uint32_t seed) {
  std::vector<float> k = randn(n * kHkv * kD, seed), v = randn(n * kHkv * kD, seed + 1, 3.0f),
                     ik = randn(n * kDix, seed + 2);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = start + i;
    const float grow = pos % 37 == 0 ? 0.0f : 1.0f + float(pos % kS) / 4;
    for (int64_t e = 0; e < kHkv * kD; ++e) k[i * kHkv * kD + e] *= grow;
    for (int64_t e = 0; e < kHkv * kD; ++e) v[i * kHkv * kD + e] *= (pos % 3 == 0 ? grow : 1.0f);
    for (int64_t e = 0; e < kDix; ++e) ik[i * kDix + e] *= grow * 1e-3f;  // small: subnormals
    s->positions.push_back(static_cast<int32_t>(pos));
    for (int64_t b = 0; b < kMaxBlocks; ++b)
      s->tables.push_back(b < int64_t(table.size()) ? table[size_t(b)] : -1);
  }
  for (std::vector<float>* f : {&k, &v, &ik}) {
    const std::vector<uint16_t> bits = to_bf16(f);
    std::vector<uint16_t>& dst = f == &k ? s->k : f == &v ? s->v : s->ik;
    dst.insert(dst.end(), bits.begin(), bits.end());
  }
}

// kv_append_row over the step's rows in order: the reference.
void cpu_append(KvCacheDtype d, const Step& s, HostStore* k, HostStore* v, HostStore* ik) {
  for (int64_t t = 0; t < s.t(); ++t) {
    const int64_t pos = s.positions[size_t(t)];
    if (pos < 0 || pos / kS >= kMaxBlocks) continue;
    const int64_t page = s.tables[size_t(t * kMaxBlocks + pos / kS)];
    if (page < 0 || page >= kPages) continue;
    for (int64_t h = 0; h < kHkv; ++h) {
      std::vector<float> row(kD);
      for (int which = 0; which < 2; ++which) {
        const std::vector<uint16_t>& src = which == 0 ? s.k : s.v;
        for (int64_t e = 0; e < kD; ++e)
          row[size_t(e)] = bf16_to_f32(src[size_t((t * kHkv + h) * kD + e)]);
        HostStore* st = which == 0 ? k : v;
        kv_append_row(d, kv_page_head(d, st->view(), page, kS, kHkv, h, kD), pos % kS,
                      row.data(), kD);
      }
    }
    std::vector<float> row(kDix);
    for (int64_t e = 0; e < kDix; ++e) row[size_t(e)] = bf16_to_f32(s.ik[size_t(t * kDix + e)]);
    kv_append_row(d, kv_page_head(d, ik->view(), page, kS, 1, 0, kDix), pos % kS, row.data(), kDix);
  }
}

TEST(KvQuantCache, AppendEqualsTheCpuRowByRowAndDequantiseIsExact) {
  const std::vector<int32_t> table_a = {5, 2, 7}, table_b = {1, 3}, table_c = {6};
  std::vector<Step> steps(4);
  add_rows(&steps[0], table_a, 0, 300, 10);   // a prefill chunk over three pages
  add_rows(&steps[1], table_b, 0, 50, 20);    // sequence B's first chunk ...
  add_rows(&steps[2], table_b, 50, 100, 30);  // ... and its second, from mid-page across pages
  add_rows(&steps[3], table_a, 300, 1, 40);   // decode: A, B, a padding row, C past its table
  add_rows(&steps[3], table_b, 150, 1, 41);
  add_rows(&steps[3], {-1}, 0, 1, 42);
  add_rows(&steps[3], table_c, 128 * kMaxBlocks, 1, 43);
  add_rows(&steps[3], table_c, 5, 1, 44);      // C's row 5 on a fresh page: no row 0 before it
  for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    SCOPED_TRACE(kv_cache_dtype_name(d));
    HostStore hk(d, kHkv, kD), hv(d, kHkv, kD), hi(d, 1, kDix);
    DevStore gk(hk), gv(hv), gi(hi);
    cuda::KvCacheView view;
    view.dtype = d;
    view.kq = gk.view(), view.vq = gv.view(), view.iq = gi.view();
    view.num_pages = kPages, view.page_size = kS, view.num_kv_heads = kHkv, view.head_dim = kD;
    view.index_head_dim = kDix;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      Dev<uint16_t> dk(s.k), dv(s.v), dik(s.ik);
      Dev<int32_t> dpos(s.positions), dtab(s.tables);
      cuda::KvAppendQuantisedParams p;
      p.cache = view;
      p.k = dk.ptr(), p.v = dv.ptr(), p.idx_k = dik.ptr();
      p.positions = dpos.ptr(), p.block_tables = dtab.ptr();
      p.t = s.t(), p.max_blocks = kMaxBlocks;
      ASSERT_TRUE(cuda::launch_kv_append_quantised(p, stream()).is_ok());
      gpu()->synchronize();
      cpu_append(d, s, &hk, &hv, &hi);
      const std::string what = "after step " + std::to_string(i);
      gk.expect_equal(hk, what + " K");
      gv.expect_equal(hv, what + " V");
      gi.expect_equal(hi, what + " index keys");
    }
    // Page 5 (sequence A's first) was written: its rows' amax grows 32-fold along the page, so
    // its scales rose mid-page and earlier rows were re-encoded.
    EXPECT_GT(hk.scales[size_t(5 * kHkv)], 0.0f);

    // Dequantise sequence A's pages into a poisoned bf16 cache.
    Dev<uint16_t> bk = Dev<uint16_t>::poisoned(kPages * kS * kHkv * kD),
                  bv = Dev<uint16_t>::poisoned(kPages * kS * kHkv * kD),
                  bi = Dev<uint16_t>::poisoned(kPages * kS * kDix);
    const cuda::KvCacheView bf =
        cuda::bf16_kv_view(bk.ptr(), bv.ptr(), bi.ptr(), kPages, kS, kHkv, kD, kDix);
    std::vector<int32_t> table = table_a;
    table.push_back(-1);
    Dev<int32_t> dtab(table);
    ASSERT_TRUE(cuda::launch_kv_dequantise_pages(view, bf, dtab.ptr(), 4, stream()).is_ok());
    gpu()->synchronize();
    struct Tensor {
      Dev<uint16_t>* got;
      HostStore* ref;
      int64_t heads, dim;
    };
    for (const Tensor& t : {Tensor{&bk, &hk, kHkv, kD}, Tensor{&bv, &hv, kHkv, kD},
                            Tensor{&bi, &hi, 1, kDix}}) {
      const std::vector<uint16_t> got = t.got->host();
      int64_t mismatches = 0;
      std::vector<float> row(size_t(t.dim));
      for (int64_t page = 0; page < kPages; ++page) {
        const bool in_table = std::find(table_a.begin(), table_a.end(), page) != table_a.end();
        for (int64_t r = 0; r < kS; ++r)
          for (int64_t h = 0; h < t.heads; ++h) {
            kv_read_row(d, kv_page_head(d, t.ref->view(), page, kS, t.heads, h, t.dim), r, t.dim,
                        row.data());
            for (int64_t e = 0; e < t.dim; ++e) {
              const uint16_t g = got[size_t(((page * kS + r) * t.heads + h) * t.dim + e)];
              const uint16_t want = in_table ? f32_to_bf16(row[size_t(e)]) : uint16_t(0xFFFF);
              if (in_table && bf16_to_f32(want) != row[size_t(e)]) ++mismatches;  // not exact
              if (g != want) ++mismatches;
            }
          }
      }
      EXPECT_EQ(mismatches, 0) << "dequantised pages (heads " << t.heads << ")";
    }
  }
}

TEST(KvQuantCache, RefusesWhatItCannotWrite) {
  cuda::KvCacheView bf16;
  bf16.num_pages = 1, bf16.page_size = kS, bf16.num_kv_heads = 1, bf16.head_dim = kD;
  bf16.index_head_dim = kDix;
  cuda::KvAppendQuantisedParams p;
  p.cache = bf16;
  p.t = 1;
  EXPECT_FALSE(cuda::launch_kv_append_quantised(p, stream()).is_ok());  // not quantised
  HostStore h(KvCacheDtype::kFp8E4M3, 1, kD);
  DevStore g(h);
  cuda::KvCacheView q = bf16;
  q.dtype = KvCacheDtype::kFp8E4M3;
  q.kq = g.view(), q.vq = g.view();
  p.cache = q;
  EXPECT_FALSE(cuda::launch_kv_append_quantised(p, stream()).is_ok());  // null rows
  q.head_dim = 100;
  p.cache = q;
  EXPECT_FALSE(cuda::launch_kv_append_quantised(p, stream()).is_ok());  // not a multiple of 16
}

}  // namespace
}  // namespace m3::cuda_test

// The real-shape decode kernels on a quantised KV cache (--kv-cache-dtype fp8_e4m3 / fp4_e2m1):
// the lightning indexer (launch_indexer_decode), the block-sparse attention (launch_sparse_decode:
// the tensor-core split with and without the thread-block cluster, the cluster selecting from
// block_scores itself, the float32-FMA split with 1, 2 and 4 key splits, and the identity
// selection) and the dense attention (launch_dense_decode), each against the same launch on a
// bf16 cache holding the dequantised values, for bitwise equality.
//
// Why bitwise: the kernels dequantise each 8-element piece on load into the very bf16 shared-memory
// tiles they fill from a bf16 cache (kv/kv_load.cuh), and the dequantisation is exact: an fp8
// element is e4m3 · 2^k and an fp4 element e2m1 · e4m3 · 2^k (at most 6 significant bits), so
// kv_read_row's float32 value is a bf16 value (checked below for every element) and the tiles hold
// the same bits either way. Everything after the tiles is the same code, so any difference is a
// bug in the quantised loads (a wrong row, head, page scale, block scale or nibble order).
//
// The cache is written on the host with the CPU reference (kv_page_head + kv_append_row, rows in
// position order) from values that grow within each page, so the page-head scales are raised
// mid-page and earlier rows re-encoded, as in serving. Real shapes: pages of 128, 4 KV heads x
// 128, 64 query heads (16 per KV group), 4 index heads x 128, top-16 blocks; sequences whose
// query positions sit mid-page and at a page's first row, over shuffled page ids. The unwritten
// tails of the last pages hold random bytes in both caches (different ones): the kernels must
// mask them (keys past the position) or zero them (V), never read them into a result.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "backend/cuda/attention/dense_decode.h"
#include "backend/cuda/attention/sparse_decode.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant/kv_quant.h"

namespace m3::cuda_test {
namespace {

constexpr int64_t kS = 128, kHkv = 4, kD = 128, kH = 64, kHix = 4, kDix = 128, kTopk = 16;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

// One quantised tensor of a layer ([P, S, heads, dim]) on the host; random bytes until written.
struct HostStore {
  std::vector<uint8_t> codes, block_scales;
  std::vector<float> scales;
  HostStore(KvCacheDtype d, int64_t pages, int64_t heads, int64_t dim, uint32_t seed)
      : codes(random_bytes(size_t(pages * kS * heads * kv_row_code_bytes(d, dim)), seed)),
        block_scales(random_bytes(
            std::max<size_t>(1, size_t(pages * kS * heads * kv_row_block_scale_bytes(d, dim))),
            seed + 1)),
        scales(size_t(pages * heads), 1.0f) {}
  KvQuantStore view(KvCacheDtype d) {
    return {codes.data(), d == KvCacheDtype::kFp4E2M1 ? block_scales.data() : nullptr,
            scales.data()};
  }
};

struct DevStore {
  Dev<uint8_t> codes, block_scales;
  Dev<float> scales;
  explicit DevStore(const HostStore& h)
      : codes(h.codes), block_scales(h.block_scales), scales(h.scales) {}
  KvQuantStore view(KvCacheDtype d) {
    return {codes.ptr(), d == KvCacheDtype::kFp4E2M1 ? block_scales.ptr() : nullptr, scales.ptr()};
  }
};

// got and want equal bit for bit; `want` (the bf16 cache's result) must not hold the poison
// pattern (all-ones bytes) anywhere: an element neither launch wrote would compare equal.
template <typename T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, bool check_poison,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  T poison;
  std::memset(&poison, 0xFF, sizeof(T));
  size_t differ = 0, first = 0, poisoned = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
    poisoned += check_poison && std::memcmp(&want[i], &poison, sizeof(T)) == 0;
  }
  std::printf("[ %-52s ] %zu of %zu differ\n", what.c_str(), differ, got.size());
  EXPECT_EQ(differ, 0u) << what << ": first difference at element " << first;
  EXPECT_EQ(poisoned, 0u) << what << ": elements left unwritten";
}

// The batch: block tables over shuffled pages (page 0 never used), the query positions, and the
// K, V and index-key rows of every position (values growing within each page).
struct Batch {
  std::vector<int64_t> lens = {1, 130, 300, 2049, 5000};  // positions 0, 129, 299, 2048, 4999
  int64_t b = 0, max_blocks = 0, pages = 1;
  std::vector<int32_t> tables, pos;
  Batch() {
    b = static_cast<int64_t>(lens.size());
    for (int64_t l : lens)
      max_blocks = std::max(max_blocks, (l + kS - 1) / kS), pages += (l + kS - 1) / kS;
    pages += 2;  // two pages nobody's table names
    std::vector<int32_t> perm(size_t(pages - 1));
    std::iota(perm.begin(), perm.end(), 1);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(90));
    tables.assign(size_t(b * max_blocks), -1);
    pos.resize(size_t(b));
    int64_t next = 0;
    for (int64_t i = 0; i < b; ++i) {
      pos[i] = static_cast<int32_t>(lens[i] - 1);
      for (int64_t j = 0; j < (lens[i] + kS - 1) / kS; ++j)
        tables[i * max_blocks + j] = perm[next++];
    }
  }
};

// A quantised cache of the batch's rows (device) and its bf16 twin of the dequantised values.
struct Caches {
  KvCacheDtype d;
  HostStore hk, hv, hi;
  std::unique_ptr<DevStore> gk, gv, gi;
  std::unique_ptr<Dev<uint16_t>> tk, tv, ti;  // the bf16 twin
  int64_t raised = 0;                         // page-heads whose scale grew after their row 0

  Caches(KvCacheDtype dt, const Batch& bt)
      : d(dt),
        hk(dt, bt.pages, kHkv, kD, 91),
        hv(dt, bt.pages, kHkv, kD, 93),
        hi(dt, bt.pages, 1, kDix, 95) {
    const KvQuantStore kq = hk.view(d), vq = hv.view(d), iq = hi.view(d);
    // bf16 twin: random bits where nothing is written.
    auto rnd16 = [](size_t n, uint32_t seed) {
      std::mt19937 rng(seed);
      std::vector<uint16_t> v(n);
      for (uint16_t& x : v) x = static_cast<uint16_t>(rng());
      return v;
    };
    std::vector<uint16_t> k16 = rnd16(size_t(bt.pages * kS * kHkv * kD), 97),
                          v16 = rnd16(size_t(bt.pages * kS * kHkv * kD), 98),
                          i16 = rnd16(size_t(bt.pages * kS * kDix), 99);
    std::vector<float> row(kD), deq(kD);
    int64_t inexact = 0;
    // Every element of a stored row, read back, into the twin (bf16 holds it exactly).
    auto twin = [&](const KvPageHead& ph, int64_t r, int64_t dim, uint16_t* out) {
      kv_read_row(d, ph, r, dim, deq.data());
      for (int64_t i = 0; i < dim; ++i) {
        out[i] = f32_to_bf16(deq[i]);
        inexact += bf16_to_f32(out[i]) != deq[i];
      }
    };
    for (int64_t s = 0; s < bt.b; ++s) {
      for (int64_t t = 0; t <= bt.pos[s]; ++t) {
        const int64_t page = bt.tables[s * bt.max_blocks + t / kS], r = t % kS;
        const float grow = 1.0f + float(r) / 16;  // scales raised mid-page
        const uint32_t seed = static_cast<uint32_t>(1000 + s * 100000 + t * 16);
        for (int64_t h = 0; h <= kHkv; ++h) {  // h == kHkv: the index key
          const bool index = h == kHkv;
          const int64_t dim = index ? kDix : kD;
          for (int kvi = 0; kvi < (index ? 1 : 2); ++kvi) {
            row = randn(dim, seed + uint32_t(2 * h + kvi), kvi == 1 ? 2.0f : 1.0f);
            for (float& x : row) x *= grow;
            const KvPageHead ph = index
                                      ? kv_page_head(d, iq, page, kS, 1, 0, kDix)
                                      : kv_page_head(d, kvi == 0 ? kq : vq, page, kS, kHkv, h, kD);
            const float before = r == 0 ? 0.0f : *ph.scale;
            kv_append_row(d, ph, r, row.data(), dim);
            raised += r > 0 && before > 0.0f && *ph.scale > before;
          }
        }
      }
    }
    // The twin from the final codes (the re-encodings included), every written row.
    for (int64_t s = 0; s < bt.b; ++s)
      for (int64_t t = 0; t <= bt.pos[s]; ++t) {
        const int64_t page = bt.tables[s * bt.max_blocks + t / kS], r = t % kS;
        for (int64_t h = 0; h < kHkv; ++h) {
          const int64_t slot = (page * kS + r) * kHkv + h;
          twin(kv_page_head(d, kq, page, kS, kHkv, h, kD), r, kD, k16.data() + slot * kD);
          twin(kv_page_head(d, vq, page, kS, kHkv, h, kD), r, kD, v16.data() + slot * kD);
        }
        twin(kv_page_head(d, iq, page, kS, 1, 0, kDix), r, kDix,
             i16.data() + (page * kS + r) * kDix);
      }
    EXPECT_EQ(inexact, 0) << "dequantised values bf16 does not hold";
    gk = std::make_unique<DevStore>(hk);
    gv = std::make_unique<DevStore>(hv);
    gi = std::make_unique<DevStore>(hi);
    tk = std::make_unique<Dev<uint16_t>>(k16);
    tv = std::make_unique<Dev<uint16_t>>(v16);
    ti = std::make_unique<Dev<uint16_t>>(i16);
  }

  cuda::KvCacheView quantised(const Batch& bt) {
    cuda::KvCacheView c;
    c.num_pages = bt.pages, c.page_size = kS, c.num_kv_heads = kHkv, c.head_dim = kD;
    c.index_head_dim = kDix;
    c.dtype = d;
    c.kq = gk->view(d), c.vq = gv->view(d), c.iq = gi->view(d);
    return c;
  }
  cuda::KvCacheView bf16(const Batch& bt) {
    return {tk->ptr(), tv->ptr(), ti->ptr(), bt.pages, kS, kHkv, kD, kDix};
  }
};

class KvQuantDecode : public ::testing::TestWithParam<KvCacheDtype> {};

TEST_P(KvQuantDecode, KernelsEqualTheBf16CacheOfTheDequantisedValues) {
  const KvCacheDtype d = GetParam();
  const std::string name = kv_cache_dtype_name(d);
  const Batch bt;
  Caches caches(d, bt);
  EXPECT_GT(caches.raised, 100) << "no page-head scale was raised mid-page";
  const cuda::KvCacheView qv = caches.quantised(bt), bv = caches.bf16(bt);
  const int64_t B = bt.b, MB = bt.max_blocks;
  std::vector<float> qf, iqf;
  std::vector<uint16_t> qb, iqb;
  bf16_randn(B * kH * kD, 101, 1.0f, &qf, &qb);
  bf16_randn(B * kHix * kDix, 102, 1.0f, &iqf, &iqb);
  Dev<uint16_t> dq(qb), diq(iqb);
  Dev<int32_t> dtab(bt.tables), dpos(bt.pos);
  const float scale = 1.0f / std::sqrt(float(kD));

  // ---- The indexer: block scores and selections (as a programmatic dependent with
  // keys_before_wait too, which a quantised cache ignores; same results).
  std::vector<float> want_scores;
  std::vector<int32_t> want_sel;
  auto sel_b = Dev<int32_t>::poisoned(B * kHix * kTopk);
  auto scores_b = Dev<float>::poisoned(B * kHix * MB);
  for (bool pdl : {false, true}) {
    auto run = [&](const cuda::KvCacheView& c, Dev<float>& scores, Dev<int32_t>& sel) {
      cuda::IndexerDecodeParams ip;
      ip.iq = diq.ptr();
      ip.cache = c;
      ip.positions = dpos.ptr();
      ip.block_tables = dtab.ptr();
      ip.batch = B;
      ip.num_index_heads = kHix;
      ip.max_blocks = MB;
      ip.top_k = kTopk;
      ip.local_blocks = 1;
      ip.init_blocks = 1;
      ip.pdl = ip.keys_before_wait = pdl;
      ip.block_scores = scores.ptr();
      ip.selected = sel.ptr();
      ASSERT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    };
    auto scores_q = Dev<float>::poisoned(B * kHix * MB);
    auto sel_q = Dev<int32_t>::poisoned(B * kHix * kTopk);
    run(bv, scores_b, sel_b);
    run(qv, scores_q, sel_q);
    want_scores = scores_b.host();
    want_sel = sel_b.host();
    const std::string tag = " " + name + (pdl ? " pdl" : "");
    expect_same_bits(scores_q.host(), want_scores, true, "indexer block scores" + tag);
    expect_same_bits(sel_q.host(), want_sel, false, "indexer selection" + tag);
  }
  int64_t finite = 0, selected = 0;
  for (float x : want_scores) finite += std::isfinite(x);
  for (int32_t x : want_sel) selected += x >= 0;
  EXPECT_GT(finite, B * kHix) << "the block scores are mostly -inf";
  EXPECT_GT(selected, B * kHix) << "the selections are mostly empty";

  // ---- Sparse attention on the indexer's selection: the tensor-core split (plain, clustered,
  // clustered selecting from the block scores) and the FMA split with 1, 2, 4 key splits.
  struct Variant {
    const char* name;
    bool mma, cluster, from_scores;
    int64_t splits;
  };
  const Variant variants[] = {{"mma", true, false, false, 1},
                              {"mma cluster", true, true, false, 1},
                              {"mma cluster from block_scores", true, true, true, 1},
                              {"fma 1 split", false, false, false, 1},
                              {"fma 2 key splits", false, false, false, 2},
                              {"fma 4 key splits", false, false, false, 4}};
  for (const Variant& var : variants) {
    Dev<float> opart(std::vector<float>(size_t(B * kH * kTopk * var.splits * kD))),
        ml(std::vector<float>(size_t(B * kH * kTopk * var.splits * 2)));
    auto run = [&](const cuda::KvCacheView& c, bool pdl) {
      auto out = Dev<uint16_t>::poisoned(B * kH * kD);
      cuda::SparseDecodeParams ap;
      ap.q = dq.ptr();
      ap.cache = c;
      ap.positions = dpos.ptr();
      ap.block_tables = dtab.ptr();
      ap.selected = var.from_scores ? nullptr : sel_b.ptr();
      ap.block_scores = var.from_scores ? scores_b.ptr() : nullptr;
      ap.local_blocks = 1;
      ap.init_blocks = 1;
      ap.batch = B;
      ap.num_heads = kH;
      ap.max_blocks = MB;
      ap.top_k = kTopk;
      ap.scale = scale;
      ap.mma = var.mma;
      ap.cluster_combine = ap.force_cluster_combine = var.cluster;
      ap.max_key_splits = var.splits;
      ap.force_key_splits = !var.mma;
      ap.pdl = pdl;
      ap.o_partial = opart.ptr();
      ap.ml_partial = ml.ptr();
      ap.out = out.ptr();
      const Status st = cuda::launch_sparse_decode(ap, stream());
      EXPECT_TRUE(st.is_ok()) << var.name << ": " << st.to_string();
      return out.host();
    };
    if (var.cluster) {
      cuda::SparseDecodeParams probe;
      probe.mma = probe.cluster_combine = probe.force_cluster_combine = true;
      probe.top_k = kTopk;
      probe.batch = B;
      probe.cache = qv;
      ASSERT_TRUE(cuda::sparse_decode_clusters(probe)) << "the GPU cannot schedule the cluster";
    }
    const auto want = run(bv, false);
    int64_t nonzero = 0;
    for (uint16_t x : want) nonzero += (x & 0x7FFF) != 0;
    EXPECT_GT(nonzero, B * kH * kD / 2) << var.name << ": the output is mostly zero";
    for (bool pdl : {false, true})
      expect_same_bits(run(qv, pdl), want, true,
                       std::string("sparse_decode ") + var.name + " " + name + (pdl ? " pdl" : ""));
  }

  // ---- No selection (every block; max_blocks <= top_k): the first 16 columns of the tables,
  // positions capped to them (keys written past a position are masked like a page's tail).
  {
    std::vector<int32_t> tab16(size_t(B * kTopk)), pos16(bt.pos);
    for (int64_t i = 0; i < B; ++i) {
      std::copy_n(bt.tables.begin() + i * MB, kTopk, tab16.begin() + i * kTopk);
      pos16[i] = std::min<int32_t>(pos16[i], int32_t(kTopk * kS - 1));
    }
    Dev<int32_t> dtab16(tab16), dpos16(pos16);
    for (bool mma : {false, true}) {
      Dev<float> opart(std::vector<float>(size_t(B * kH * kTopk * kD))),
          ml(std::vector<float>(size_t(B * kH * kTopk * 2)));
      auto run = [&](const cuda::KvCacheView& c) {
        auto out = Dev<uint16_t>::poisoned(B * kH * kD);
        cuda::SparseDecodeParams ap;
        ap.q = dq.ptr();
        ap.cache = c;
        ap.positions = dpos16.ptr();
        ap.block_tables = dtab16.ptr();
        ap.batch = B;
        ap.num_heads = kH;
        ap.max_blocks = kTopk;
        ap.top_k = kTopk;
        ap.scale = scale;
        ap.mma = mma;
        ap.force_key_splits = !mma;  // one split on FMAs
        ap.o_partial = opart.ptr();
        ap.ml_partial = ml.ptr();
        ap.out = out.ptr();
        const Status st = cuda::launch_sparse_decode(ap, stream());
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        return out.host();
      };
      expect_same_bits(run(qv), run(bv), true,
                       std::string("sparse_decode every block ") + (mma ? "mma " : "fma ") + name);
    }
  }

  // ---- Dense attention over every key: one split walking up to 40 blocks, and the launcher's
  // choice within 64 (as a programmatic dependent).
  for (int64_t max_splits : {1, 64}) {
    Dev<float> opart(std::vector<float>(size_t(B * kH * max_splits * kD))),
        ml(std::vector<float>(size_t(B * kH * max_splits * 2)));
    auto run = [&](const cuda::KvCacheView& c) {
      auto out = Dev<uint16_t>::poisoned(B * kH * kD);
      cuda::DenseDecodeParams p;
      p.q = dq.ptr();
      p.cache = c;
      p.positions = dpos.ptr();
      p.block_tables = dtab.ptr();
      p.batch = B;
      p.num_heads = kH;
      p.max_blocks = MB;
      p.max_splits = max_splits;
      p.scale = scale;
      p.pdl = max_splits > 1;
      p.o_partial = opart.ptr();
      p.ml_partial = ml.ptr();
      p.out = out.ptr();
      const Status st = cuda::launch_dense_decode(p, stream());
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      return out.host();
    };
    expect_same_bits(run(qv), run(bv), true,
                     "dense_decode max_splits " + std::to_string(max_splits) + " " + name);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvQuantDecode,
                         ::testing::Values(KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1),
                         [](const ::testing::TestParamInfo<KvCacheDtype>& i) {
                           return std::string(kv_cache_dtype_name(i.param));
                         });

// Every launcher refuses, naming itself, a quantised view the loads cannot read (a float32
// "quantised" dtype, missing page scales, fp4 without block scales, codes not 8-byte aligned),
// instead of launching on it. Nothing is read: the checks come before any launch.
TEST(KvQuantDecodeRefusals, MalformedQuantisedViews) {
  Dev<uint8_t> codes(std::vector<uint8_t>(64));
  Dev<float> scales(std::vector<float>(4));
  Dev<uint16_t> q(std::vector<uint16_t>(size_t(kH * kD)));
  Dev<int32_t> zeros(std::vector<int32_t>(16));
  Dev<float> fbuf(std::vector<float>(size_t(kH * kTopk * kD)));
  const KvQuantStore good{codes.ptr(), codes.ptr(), scales.ptr()};
  struct Case {
    const char* what;
    KvCacheDtype d;
    KvQuantStore st;
  };
  const Case cases[] = {
      {"float32 dtype", KvCacheDtype::kFloat32, good},
      {"no page scales", KvCacheDtype::kFp8E4M3, {codes.ptr(), nullptr, nullptr}},
      {"fp4 without block scales", KvCacheDtype::kFp4E2M1, {codes.ptr(), nullptr, scales.ptr()}},
      {"codes misaligned", KvCacheDtype::kFp8E4M3, {codes.ptr() + 4, nullptr, scales.ptr()}},
  };
  for (const Case& k : cases) {
    cuda::KvCacheView c;
    c.num_pages = 1, c.page_size = kS, c.num_kv_heads = kHkv, c.head_dim = kD;
    c.index_head_dim = kDix;
    c.dtype = k.d;
    c.kq = c.vq = c.iq = k.st;
    cuda::IndexerDecodeParams ip;
    ip.iq = q.ptr();
    ip.cache = c;
    ip.positions = ip.block_tables = zeros.ptr();
    ip.batch = 1;
    ip.num_index_heads = kHix;
    ip.max_blocks = 1;
    ip.block_scores = fbuf.ptr();
    ip.selected = zeros.ptr();
    const Status si = cuda::launch_indexer_decode(ip, stream());
    EXPECT_EQ(si.code(), StatusCode::kInvalidArgument) << k.what;
    EXPECT_NE(si.message().find("indexer_decode"), std::string::npos) << si.message();
    cuda::SparseDecodeParams ap;
    ap.q = q.ptr();
    ap.cache = c;
    ap.positions = ap.block_tables = zeros.ptr();
    ap.batch = 1;
    ap.num_heads = kH;
    ap.max_blocks = 1;
    ap.top_k = kTopk;
    ap.o_partial = ap.ml_partial = fbuf.ptr();
    ap.out = q.ptr();
    for (bool mma : {false, true}) {
      ap.mma = mma;
      const Status ss = cuda::launch_sparse_decode(ap, stream());
      EXPECT_EQ(ss.code(), StatusCode::kInvalidArgument) << k.what << " mma " << mma;
      EXPECT_NE(ss.message().find("sparse_decode"), std::string::npos) << ss.message();
    }
    cuda::DenseDecodeParams dp;
    dp.q = q.ptr();
    dp.cache = c;
    dp.positions = dp.block_tables = zeros.ptr();
    dp.batch = 1;
    dp.num_heads = kH;
    dp.max_blocks = 1;
    dp.o_partial = dp.ml_partial = fbuf.ptr();
    dp.out = q.ptr();
    const Status sd = cuda::launch_dense_decode(dp, stream());
    EXPECT_EQ(sd.code(), StatusCode::kInvalidArgument) << k.what;
    EXPECT_NE(sd.message().find("dense_decode"), std::string::npos) << sd.message();
  }
  std::printf("[ %-52s ] refused\n", "malformed quantised views");
}

}  // namespace
}  // namespace m3::cuda_test

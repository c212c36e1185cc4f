// The fused attention-inputs launch (rope/attention_inputs.h) against the three launches it
// replaces, bit for bit: the split-K epilogue (store f32), qk_norm_rope over the q / k / index q /
// index k segments, and kv_write_bf16. Every output is compared byte for byte: q, index q, the
// optional k / index-key copies, and the whole K, V and index-key caches (pre-filled with the
// same random bits, so a stray or missing write shows). Shapes: M3.1-Flash (64 q heads, 4 KV
// heads, 4 index heads, D = Dix = 128, the fused row of 9856 floats), a small layout with the
// segments shuffled, gaps and an odd row stride, and a layer without an indexer; T = 1, 3, 8, 130
// tokens (sequences), 1, 2 and 4 slices, positions up to 2^19 (RoPE angles spread), some tokens
// without a page. Plus a float64 reference of q / index q / k, placement and V rounding checked
// on the host, determinism and argument checks.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/kv/kv_write_bf16.h"
#include "backend/cuda/rope/attention_inputs.h"
#include "backend/cuda/rope/qk_norm_rope.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

constexpr int64_t kD = 128, kPage = 128, kMaxBlocks = 4096;  // positions < 4096 · 128 = 2^19

struct Layout {
  std::string name;
  int64_t hq, hkv, hix, rotary_dim, rot_width;
  int64_t off_q, off_k, off_v, off_iq, off_ik, ld;
};

// builtin_m3_flash_config: q 64 x 128, k / v 4 x 128, index q 4 x 128, index k 128; rotary 64.
Layout m3_flash() { return {"M3.1-Flash", 64, 4, 4, 64, 64, 0, 8192, 8704, 9216, 9728, 9856}; }
// Segments in the order index k, v, q, index q, k with gaps; odd ld; RoPE partners d ± 24 (through
// shared memory) and a frequency table shorter than the rotated width.
// Rows: index k [3, 131), v [133, 517), q [518, 1286), index q [1286, 1542), k [1549, 1933).
Layout odd_layout() { return {"odd", 6, 3, 2, 32, 48, 518, 1549, 133, 1286, 3, 1937}; }
// A layer without an indexer (no index heads, no index-key cache).
Layout no_indexer() { return {"no-indexer", 2, 1, 0, 64, 64, 0, 256, 384, 0, 0, 517}; }

// Host inputs of one case.
struct Case {
  Layout l;
  int64_t t = 0, slices = 1, pages = 0;
  std::vector<float> partial;                      // [S, T, ld]
  std::vector<uint16_t> wq, wk, wiq, wik;          // bf16 norm weights
  std::vector<int32_t> pos, tables;                // [T], [T, kMaxBlocks]
  std::vector<uint16_t> cache_k, cache_v, cache_ik;  // initial contents (random bits)
};

Case make_case(const Layout& l, int64_t t, int64_t slices, uint32_t seed) {
  Case c;
  c.l = l;
  c.t = t;
  c.slices = slices;
  c.pages = t + 3;
  c.partial = randn(slices * t * l.ld, seed, 1.5f);
  std::vector<float> f;
  bf16_randn(kD, seed + 1, 0.3f, &f, &c.wq);
  bf16_randn(kD, seed + 2, 0.3f, &f, &c.wk);
  bf16_randn(kD, seed + 3, 0.3f, &f, &c.wiq);
  bf16_randn(kD, seed + 4, 0.3f, &f, &c.wik);
  std::mt19937 rng(seed + 5);
  std::uniform_int_distribution<int32_t> any_pos(0, kMaxBlocks * kPage - 1), any_page(0, int32_t(c.pages) - 1);
  c.pos.resize(t);
  for (int64_t i = 0; i < t; ++i) c.pos[i] = any_pos(rng);
  if (t >= 3) c.pos[1] = 0;  // angle 0
  if (t >= 8) {
    c.pos[5] = -1;                       // no slot (pos < 0)
    c.pos[6] = kMaxBlocks * kPage + 7;   // no slot (block past max_blocks)
  }
  // Every table entry a valid page (a wrong entry read writes somewhere visible), except the
  // entry each token's position selects: a page of its own, or -1 / past num_pages (no slot).
  c.tables.resize(t * kMaxBlocks);
  for (int32_t& e : c.tables) e = any_page(rng);
  std::vector<int32_t> own(c.pages);
  std::iota(own.begin(), own.end(), 0);
  std::shuffle(own.begin(), own.end(), rng);
  for (int64_t i = 0; i < t; ++i) {
    if (c.pos[i] < 0 || c.pos[i] / kPage >= kMaxBlocks) continue;
    int32_t page = own[i];
    if (t >= 3 && i % 4 == 2) page = -1;
    if (t >= 8 && i == 7) page = int32_t(c.pages);  // outside the pool
    c.tables[i * kMaxBlocks + c.pos[i] / kPage] = page;
  }
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  c.cache_k.resize(c.pages * kPage * l.hkv * kD);
  c.cache_v.resize(c.cache_k.size());
  c.cache_ik.resize(c.pages * kPage * kD);
  for (auto* v : {&c.cache_k, &c.cache_v, &c.cache_ik})
    for (uint16_t& x : *v) x = static_cast<uint16_t>(bits(rng));
  return c;
}

// The cache slot of token i, -1 for none (kv_write_bf16's rule).
int64_t slot_of(const Case& c, int64_t i) {
  const int64_t p = c.pos[i];
  if (p < 0 || p / kPage >= kMaxBlocks) return -1;
  const int64_t page = c.tables[i * kMaxBlocks + p / kPage];
  if (page < 0 || page >= c.pages) return -1;
  return page * kPage + p % kPage;
}

// The projection value the kernels see: plane 0 for S = 1, else the epilogue's 0 + p0 + p1 ...
float summed(const Case& c, int64_t i, int64_t col) {
  const size_t plane = c.t * c.l.ld, at = i * c.l.ld + col;
  if (c.slices == 1) return c.partial[at];
  float a = 0.0f;
  for (int64_t s = 0; s < c.slices; ++s) a += c.partial[s * plane + at];
  return a;
}

// Device state of one case: inputs plus one set of outputs and caches.
struct DevCase {
  Dev<float> partial;
  Dev<uint16_t> wq, wk, wiq, wik;
  Dev<int32_t> pos, tables;
  Dev<uint16_t> ck, cv, cik;
  Dev<uint16_t> q, iq, k, ik;
  explicit DevCase(const Case& c)
      : partial(c.partial), wq(c.wq), wk(c.wk), wiq(c.wiq), wik(c.wik), pos(c.pos),
        tables(c.tables), ck(c.cache_k), cv(c.cache_v), cik(c.cache_ik),
        q(Dev<uint16_t>::poisoned(c.t * c.l.hq * kD)),
        iq(Dev<uint16_t>::poisoned(std::max<int64_t>(1, c.t * c.l.hix * kD))),
        k(Dev<uint16_t>::poisoned(c.t * c.l.hkv * kD)),
        ik(Dev<uint16_t>::poisoned(c.t * kD)) {}
  cuda::KvCacheView view(const Case& c) {
    return {ck.ptr(), cv.ptr(), c.l.hix > 0 ? cik.ptr() : nullptr, c.pages, kPage, c.l.hkv, kD,
            kD};
  }
};

// The three launches the fused one replaces, into d's outputs and caches.
void run_reference(const Case& c, DevCase* d) {
  const Layout& l = c.l;
  std::unique_ptr<Dev<float>> qkv_buf;
  float* qkv = d->partial.ptr();
  if (c.slices > 1) {
    qkv_buf = std::make_unique<Dev<float>>(Dev<float>::poisoned(c.t * l.ld));
    qkv = qkv_buf->ptr();
    cuda::GemvEpilogueParams e;
    e.kind = cuda::GemvEpilogue::kStoreF32;
    e.partial = d->partial.ptr();
    e.num_slices = c.slices;
    e.num_rows = c.t;
    e.n = l.ld;
    e.y = qkv;
    e.ldy = l.ld;
    ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
  }
  auto seg = [&](int64_t off, int64_t h, Dev<uint16_t>& w, Dev<uint16_t>& out) {
    cuda::QkNormRopeParams p;
    p.x = qkv + off;
    p.ld_x = l.ld;
    p.weight = w.ptr();
    p.positions = d->pos.ptr();
    p.out = out.ptr();
    p.t = c.t;
    p.h = h;
    p.rotary_dim = l.rotary_dim;
    p.rot_width = l.rot_width;
    return p;
  };
  const cuda::QkNormRopeParams segs[4] = {seg(l.off_q, l.hq, d->wq, d->q),
                                          seg(l.off_k, l.hkv, d->wk, d->k),
                                          seg(l.off_iq, l.hix, d->wiq, d->iq),
                                          seg(l.off_ik, 1, d->wik, d->ik)};
  ASSERT_TRUE(cuda::launch_qk_norm_rope_multi(segs, l.hix > 0 ? 4 : 2, stream()).is_ok());
  cuda::KvWriteBf16Params kw;
  kw.cache = d->view(c);
  kw.k = d->k.ptr();
  kw.v = qkv + l.off_v;
  kw.ld_v = l.ld;
  kw.idx_k = l.hix > 0 ? d->ik.ptr() : nullptr;
  kw.positions = d->pos.ptr();
  kw.block_tables = d->tables.ptr();
  kw.batch = c.t;
  kw.max_blocks = kMaxBlocks;
  ASSERT_TRUE(cuda::launch_kv_write_bf16(kw, stream()).is_ok());
  gpu()->synchronize();
}

cuda::AttentionInputsParams fused_params(const Case& c, DevCase* d, bool pdl) {
  const Layout& l = c.l;
  cuda::AttentionInputsParams p;
  p.partial = d->partial.ptr();
  p.num_slices = c.slices;
  p.ld = l.ld;
  p.t = c.t;
  p.positions = d->pos.ptr();
  p.off_q = l.off_q, p.off_k = l.off_k, p.off_v = l.off_v, p.off_iq = l.off_iq, p.off_ik = l.off_ik;
  p.num_q_heads = l.hq, p.num_kv_heads = l.hkv, p.num_index_heads = l.hix;
  p.q_norm = d->wq.ptr(), p.k_norm = d->wk.ptr(), p.iq_norm = d->wiq.ptr(), p.ik_norm = d->wik.ptr();
  p.rotary_dim = l.rotary_dim;
  p.rot_width = l.rot_width;
  p.q_out = d->q.ptr();
  p.iq_out = d->iq.ptr();
  p.k_out = d->k.ptr();
  p.ik_out = d->ik.ptr();
  p.cache = d->view(c);
  p.block_tables = d->tables.ptr();
  p.max_blocks = kMaxBlocks;
  p.pdl = pdl;
  return p;
}

int64_t count_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

TEST(AttentionInputs, BitwiseEqualsEpilogueQkNormRopeKvWrite) {
  uint32_t seed = 100;
  int64_t cases = 0;
  for (const Layout& l : {m3_flash(), odd_layout(), no_indexer()})
    for (int64_t t : {1, 3, 8, 130})
      for (int64_t s : {1, 2, 4}) {
        SCOPED_TRACE(l.name + " T=" + std::to_string(t) + " S=" + std::to_string(s));
        const Case c = make_case(l, t, s, seed += 10);
        DevCase ref(c), fused(c), again(c);
        ASSERT_NO_FATAL_FAILURE(run_reference(c, &ref));
        const bool pdl = (cases++ % 2) == 1;
        ASSERT_TRUE(cuda::launch_attention_inputs(fused_params(c, &fused, pdl), stream()).is_ok());
        ASSERT_TRUE(cuda::launch_attention_inputs(fused_params(c, &again, !pdl), stream()).is_ok());
        gpu()->synchronize();
        const auto q = fused.q.host(), k = fused.k.host(), ik = fused.ik.host(), iq = fused.iq.host();
        const auto ck = fused.ck.host(), cv = fused.cv.host(), cik = fused.cik.host();
        const int64_t dq = count_diff(q, ref.q.host()), diq = count_diff(iq, ref.iq.host()),
                      dk = count_diff(k, ref.k.host()),
                      dik = l.hix > 0 ? count_diff(ik, ref.ik.host()) : 0,
                      dck = count_diff(ck, ref.ck.host()), dcv = count_diff(cv, ref.cv.host()),
                      dcik = count_diff(cik, ref.cik.host());
        EXPECT_EQ(dq, 0) << "q";
        EXPECT_EQ(diq, 0) << "index q";
        EXPECT_EQ(dk, 0) << "k copy";
        EXPECT_EQ(dik, 0) << "index-key copy";
        EXPECT_EQ(dck, 0) << "K cache";
        EXPECT_EQ(dcv, 0) << "V cache";
        EXPECT_EQ(dcik, 0) << "index-key cache";
        // Deterministic: a second launch (the other pdl setting) gives the same bytes.
        EXPECT_EQ(count_diff(again.q.host(), q), 0) << "rerun q";
        EXPECT_EQ(count_diff(again.iq.host(), iq), 0) << "rerun iq";
        EXPECT_EQ(count_diff(again.ck.host(), ck), 0) << "rerun ck";
        EXPECT_EQ(count_diff(again.cv.host(), cv), 0) << "rerun cv";
        EXPECT_EQ(count_diff(again.cik.host(), cik), 0) << "rerun cik";
        // Not vacuous: every q / index q value written and finite (poison is NaN).
        for (uint16_t b : q) ASSERT_TRUE(std::isfinite(bf16_to_f32(b))) << "q not written";
        if (l.hix > 0) {
          for (uint16_t b : iq) ASSERT_TRUE(std::isfinite(bf16_to_f32(b))) << "iq not written";
        }
        // Placement and V on the host: each token with a slot holds its k / index-key copy and
        // bf16(v); the cache elsewhere keeps its initial bits.
        std::vector<uint16_t> wk = c.cache_k, wv = c.cache_v, wik = c.cache_ik;
        const int64_t row = l.hkv * kD;
        int64_t with_slot = 0;
        for (int64_t i = 0; i < t; ++i) {
          const int64_t slot = slot_of(c, i);
          if (slot < 0) continue;
          ++with_slot;
          for (int64_t e = 0; e < row; ++e) {
            wk[slot * row + e] = k[i * row + e];
            wv[slot * row + e] = f32_to_bf16(summed(c, i, l.off_v + e));
          }
          if (l.hix > 0)
            for (int64_t e = 0; e < kD; ++e) wik[slot * kD + e] = ik[i * kD + e];
        }
        EXPECT_EQ(count_diff(ck, wk), 0) << "K placement";
        EXPECT_EQ(count_diff(cv, wv), 0) << "V placement / rounding";
        EXPECT_EQ(count_diff(cik, wik), 0) << "index-key placement";
        if (t >= 3) {
          EXPECT_GT(with_slot, 0);
          EXPECT_LT(with_slot, t);
        }
        std::printf("[ %-40s ] T=%-3lld S=%lld pdl=%d slots %lld/%lld: %lld %lld %lld %lld "
                    "%lld %lld %lld bytes differ\n",
                    ("attention_inputs " + l.name).c_str(), (long long)t, (long long)s, int(pdl),
                    (long long)with_slot, (long long)t, (long long)dq, (long long)diq,
                    (long long)dk, (long long)dik, (long long)dck, (long long)dcv,
                    (long long)dcik);
      }
}

// q, index q and k of the fused launch against a float64 norm + RoPE of the same summed input
// (the same float angle fl(f_i · pos), as the kernel and the CPU backend form it). Error model
// as QkNormRope.MatchesCpuNormThenRope: the norm's float sum of squares, sqrt, reciprocal, the
// (1 + w) rounding and two products stay within rel = gamma_D/2 + 12u of |y|; RoPE adds the
// float cos / sin roundings, two products and a sum (4u on |y_d| + |y_partner|); then the bf16
// rounding (2^-8 relative, generous).
TEST(AttentionInputs, MatchesFloat64NormRope) {
  for (const Layout& l : {m3_flash(), odd_layout()})
    for (int64_t s : {1, 4}) {
      const int64_t t = 3;
      const Case c = make_case(l, t, s, 900 + uint32_t(s));
      DevCase d(c);
      ASSERT_TRUE(cuda::launch_attention_inputs(fused_params(c, &d, false), stream()).is_ok());
      const auto q = d.q.host(), iq = d.iq.host(), k = d.k.host();
      float inv_freq[64];
      for (int64_t i = 0; i < l.rotary_dim / 2; ++i) {
        const float e = static_cast<float>(2 * i) / static_cast<float>(l.rotary_dim);
        inv_freq[i] = 1.0f / static_cast<float>(std::pow(5e6, static_cast<double>(e)));
      }
      const double rel = gamma(kD) / 2 + 12 * kU;
      struct Group {
        const char* name;
        int64_t off, heads;
        const std::vector<uint16_t>* w;
        const std::vector<uint16_t>* out;
      };
      for (const Group& g : {Group{"q", l.off_q, l.hq, &c.wq, &q},
                             Group{"index q", l.off_iq, l.hix, &c.wiq, &iq},
                             Group{"k", l.off_k, l.hkv, &c.wk, &k}}) {
        std::vector<float> got, want;
        std::vector<double> bound;
        for (int64_t i = 0; i < t; ++i)
          for (int64_t h = 0; h < g.heads; ++h) {
            double x[kD], y[kD], ss = 0;
            for (int64_t e = 0; e < kD; ++e) {
              x[e] = summed(c, i, g.off + h * kD + e);
              ss += x[e] * x[e];
            }
            const double inv = 1.0 / std::sqrt(ss / kD + double(1e-6f));
            for (int64_t e = 0; e < kD; ++e) y[e] = x[e] * inv * (1.0 + bf16_to_f32((*g.w)[e]));
            const int64_t half = l.rot_width / 2;
            for (int64_t e = 0; e < kD; ++e) {
              double r = y[e], b = rel * std::abs(y[e]);
              if (e < l.rot_width) {
                const float ang = inv_freq[e % (l.rotary_dim / 2)] * static_cast<float>(c.pos[i]);
                const double partner = e < half ? -y[e + half] : y[e - half];
                r = y[e] * std::cos(double(ang)) + partner * std::sin(double(ang));
                b = (rel + 4 * kU) * (std::abs(y[e]) + std::abs(partner));
              }
              got.push_back(bf16_to_f32((*g.out)[(i * g.heads + h) * kD + e]));
              want.push_back(static_cast<float>(r));
              // want is r rounded to float: add its half ulp to the bound.
              bound.push_back(b + std::ldexp(std::abs(r) + b, -8) + kU * std::abs(r) + 1e-30);
            }
          }
        expect_close(got, want, bound,
                     std::string("attention_inputs f64 ") + g.name + " " + l.name + " S" +
                         std::to_string(s));
      }
    }
}

// The decode chain as the model launches it with pdl_attention: the attention inputs write this
// step's keys (the index key at each row's position among them), the indexer's scoring runs as
// their programmatic dependent and loads the keys of earlier positions before its wait
// (keys_before_wait), the top-k and the split attention follow as programmatic dependents. Against
// the same kernels launched plainly after a synchronise: block scores, selection and attention
// output bit for bit (the split attention on FMAs with local_blocks 0, on the tensor cores with
// 1). The position rows start as a poison that would win its block's max-pool
// (index keys of 1000 in every dimension), and with local_blocks 0 the query's own block competes
// in the selection, so a key read before its write shows in the scores and the selection.
TEST(AttentionInputs, IndexerChainUnderPdlEqualsSerialLaunches) {
  const Layout l = m3_flash();
  const int64_t top_k = 16, hq = l.hq, hkv = l.hkv, hix = l.hix;
  // pos % 128: 0, 127, 0, 43, 0, 127, 7, 39.
  const std::vector<int64_t> lens = {1, 128, 129, 300, 2049, 4096, 5000, 9000};
  const int64_t t = static_cast<int64_t>(lens.size());
  int64_t max_blocks = 0, pages = 1;  // page 0 unused
  for (int64_t n : lens) max_blocks = std::max(max_blocks, (n + kPage - 1) / kPage), pages += (n + kPage - 1) / kPage;
  std::vector<int32_t> perm(pages - 1), tables(t * max_blocks, -1), pos(t);
  std::iota(perm.begin(), perm.end(), 1);
  std::mt19937 rng(4242);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int64_t b = 0; b < t; ++b) {
    pos[b] = static_cast<int32_t>(lens[b] - 1);
    for (int64_t j = 0; j < (lens[b] + kPage - 1) / kPage; ++j) tables[b * max_blocks + j] = perm[next++];
  }
  std::vector<float> f;
  std::vector<uint16_t> ck, cv, cik, wq, wk, wiq, wik;
  bf16_randn(pages * kPage * hkv * kD, 4243, 1.0f, &f, &ck);
  bf16_randn(pages * kPage * hkv * kD, 4244, 1.0f, &f, &cv);
  bf16_randn(pages * kPage * kD, 4245, 1.0f, &f, &cik);
  bf16_randn(kD, 4246, 0.3f, &f, &wq);
  bf16_randn(kD, 4247, 0.3f, &f, &wk);
  bf16_randn(kD, 4248, 0.3f, &f, &wiq);
  bf16_randn(kD, 4249, 0.3f, &f, &wik);
  for (int64_t b = 0; b < t; ++b) {
    const int64_t slot = int64_t{tables[b * max_blocks + pos[b] / kPage]} * kPage + pos[b] % kPage;
    for (int64_t e = 0; e < kD; ++e) cik[slot * kD + e] = f32_to_bf16(1000.0f);
  }
  const std::vector<float> partial = randn(t * l.ld, 4250, 1.5f);

  struct Out {
    std::vector<float> scores;
    std::vector<int32_t> sel;
    std::vector<uint16_t> attn;
  };
  // cluster_select: the chain with the top-k computed by the clustered split kernel from the
  // block scores (SparseDecodeParams::block_scores; the selection array is then not written).
  auto run = [&](bool chain, int64_t local_blocks, bool cluster_select = false) {
    Dev<float> dpart(partial);
    Dev<uint16_t> dck(ck), dcv(cv), dcik(cik), dwq(wq), dwk(wk), dwiq(wiq), dwik(wik);
    Dev<int32_t> dtab(tables), dpos(pos);
    auto q = Dev<uint16_t>::poisoned(t * hq * kD), iq = Dev<uint16_t>::poisoned(t * hix * kD);
    auto scores = Dev<float>::poisoned(t * hix * max_blocks);
    auto sel = Dev<int32_t>::poisoned(t * hix * top_k);
    auto opart = Dev<float>::poisoned(t * hq * top_k * 4 * kD);
    auto ml = Dev<float>::poisoned(t * hq * top_k * 4 * 2);
    auto attn = Dev<uint16_t>::poisoned(t * hq * kD);
    const cuda::KvCacheView view =
        cuda::bf16_kv_view(dck.ptr(), dcv.ptr(), dcik.ptr(), pages, kPage, hkv, kD, kD);
    cuda::AttentionInputsParams ap;
    ap.partial = dpart.ptr();
    ap.ld = l.ld;
    ap.t = t;
    ap.positions = dpos.ptr();
    ap.off_q = l.off_q, ap.off_k = l.off_k, ap.off_v = l.off_v, ap.off_iq = l.off_iq, ap.off_ik = l.off_ik;
    ap.num_q_heads = hq, ap.num_kv_heads = hkv, ap.num_index_heads = hix;
    ap.q_norm = dwq.ptr(), ap.k_norm = dwk.ptr(), ap.iq_norm = dwiq.ptr(), ap.ik_norm = dwik.ptr();
    ap.q_out = q.ptr();
    ap.iq_out = iq.ptr();
    ap.cache = view;
    ap.block_tables = dtab.ptr();
    ap.max_blocks = max_blocks;
    EXPECT_TRUE(cuda::launch_attention_inputs(ap, stream()).is_ok());
    if (!chain) gpu()->synchronize();
    cuda::IndexerDecodeParams ip;
    ip.iq = iq.ptr();
    ip.cache = view;
    ip.positions = dpos.ptr();
    ip.block_tables = dtab.ptr();
    ip.batch = t;
    ip.num_index_heads = hix;
    ip.max_blocks = max_blocks;
    ip.top_k = top_k;
    ip.local_blocks = local_blocks;
    ip.block_scores = scores.ptr();
    ip.selected = sel.ptr();
    ip.pdl = ip.keys_before_wait = ip.dependent_launch = chain;
    ip.skip_topk = cluster_select;
    EXPECT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    if (!chain) gpu()->synchronize();
    cuda::SparseDecodeParams sp;
    sp.q = q.ptr();
    sp.cache = view;
    sp.positions = dpos.ptr();
    sp.block_tables = dtab.ptr();
    sp.selected = sel.ptr();
    sp.batch = t;
    sp.num_heads = hq;
    sp.max_blocks = max_blocks;
    sp.top_k = top_k;
    sp.scale = 1.0f / std::sqrt(float(kD));
    sp.max_key_splits = 4;
    sp.mma = local_blocks == 1;  // both split kernels: 4 key splits on FMAs, or the tensor cores
    sp.o_partial = opart.ptr();
    sp.ml_partial = ml.ptr();
    sp.out = attn.ptr();
    sp.pdl = sp.dependent_launch = chain;
    if (cluster_select) {
      sp.selected = nullptr;
      sp.block_scores = scores.ptr();
      sp.local_blocks = local_blocks;
      sp.cluster_combine = sp.force_cluster_combine = true;
      sp.dependents_at_start = chain;  // the model's form (its dependents: cuda_real_model_test)
    }
    EXPECT_TRUE(cuda::launch_sparse_decode(sp, stream()).is_ok());
    gpu()->synchronize();
    return Out{scores.host(), sel.host(), attn.host()};
  };
  for (int64_t local_blocks : {0, 1}) {
    const Out ref = run(false, local_blocks);
    // Not vacuous: every row's own block scored from its written key (finite, not the poison's
    // ~1000 · Σ|iq| scale), every attention output written.
    for (int64_t b = 0; b < t; ++b)
      for (int64_t h = 0; h < hix; ++h) {
        const float own = ref.scores[(b * hix + h) * max_blocks + pos[b] / kPage];
        ASSERT_TRUE(std::isfinite(own) && std::abs(own) < 200.0f) << "row " << b << ": " << own;
      }
    for (uint16_t x : ref.attn) ASSERT_TRUE(std::isfinite(bf16_to_f32(x))) << "attention not written";
    for (int round = 0; round < 3; ++round) {
      const Out got = run(true, local_blocks);
      int64_t ds = 0, dsel = 0, da = 0;
      for (size_t i = 0; i < ref.scores.size(); ++i)
        ds += std::memcmp(&ref.scores[i], &got.scores[i], sizeof(float)) != 0;
      for (size_t i = 0; i < ref.sel.size(); ++i) dsel += ref.sel[i] != got.sel[i];
      for (size_t i = 0; i < ref.attn.size(); ++i) da += ref.attn[i] != got.attn[i];
      EXPECT_EQ(ds, 0) << "block scores, local_blocks " << local_blocks;
      EXPECT_EQ(dsel, 0) << "selection, local_blocks " << local_blocks;
      EXPECT_EQ(da, 0) << "attention, local_blocks " << local_blocks;
      std::printf("[ %-40s ] local_blocks %lld round %d: %lld scores, %lld slots, %lld outputs "
                  "differ\n", "indexer chain under PDL", (long long)local_blocks, round,
                  (long long)ds, (long long)dsel, (long long)da);
    }
    if (local_blocks == 1) {  // the tensor-core split (the clustered kernel is one of its forms)
      for (bool chain : {false, true}) {
        const Out got = run(chain, local_blocks, /*cluster_select=*/true);
        int64_t ds = 0, da = 0;
        for (size_t i = 0; i < ref.scores.size(); ++i)
          ds += std::memcmp(&ref.scores[i], &got.scores[i], sizeof(float)) != 0;
        for (size_t i = 0; i < ref.attn.size(); ++i) da += ref.attn[i] != got.attn[i];
        EXPECT_EQ(ds, 0) << "block scores, cluster select, chain " << chain;
        EXPECT_EQ(da, 0) << "attention, cluster select, chain " << chain;
        std::printf("[ %-40s ] chain %d: %lld scores, %lld outputs differ\n",
                    "top-k in the attention's cluster", int(chain), (long long)ds, (long long)da);
      }
    }
  }
}

TEST(AttentionInputs, RefusesBadArguments) {
  const Case c = make_case(odd_layout(), 1, 2, 7);
  DevCase d(c);
  const cuda::AttentionInputsParams good = fused_params(c, &d, false);
  ASSERT_TRUE(cuda::launch_attention_inputs(good, stream()).is_ok());
  cuda::AttentionInputsParams empty = good;
  empty.t = 0;
  empty.partial = nullptr;
  EXPECT_TRUE(cuda::launch_attention_inputs(empty, stream()).is_ok()) << "T = 0 launches nothing";
  struct Bad {
    const char* what;
    void (*mutate)(cuda::AttentionInputsParams&);
  };
  const Bad bad[] = {
      {"head_dim 64", [](cuda::AttentionInputsParams& p) { p.head_dim = 64; }},
      {"index_head_dim 64", [](cuda::AttentionInputsParams& p) { p.index_head_dim = 64; }},
      {"odd rot_width", [](cuda::AttentionInputsParams& p) { p.rot_width = 47; }},
      {"rot_width > 128", [](cuda::AttentionInputsParams& p) { p.rot_width = 130; }},
      {"rotary_dim 0", [](cuda::AttentionInputsParams& p) { p.rotary_dim = 0; }},
      {"rotary_dim 130", [](cuda::AttentionInputsParams& p) { p.rotary_dim = 130; }},
      {"no slices", [](cuda::AttentionInputsParams& p) { p.num_slices = 0; }},
      {"negative T", [](cuda::AttentionInputsParams& p) { p.t = -1; }},
      {"no q heads", [](cuda::AttentionInputsParams& p) { p.num_q_heads = 0; }},
      {"k segment past ld", [](cuda::AttentionInputsParams& p) { p.off_k = p.ld - 127; }},
      {"negative offset", [](cuda::AttentionInputsParams& p) { p.off_v = -1; }},
      {"index key past ld", [](cuda::AttentionInputsParams& p) { p.off_ik = p.ld; }},
      {"cache KV heads", [](cuda::AttentionInputsParams& p) { p.cache.num_kv_heads += 1; }},
      {"cache head_dim", [](cuda::AttentionInputsParams& p) { p.cache.head_dim = 64; }},
      {"cache index dim", [](cuda::AttentionInputsParams& p) { p.cache.index_head_dim = 64; }},
      {"page size 0", [](cuda::AttentionInputsParams& p) { p.cache.page_size = 0; }},
      {"null q_out", [](cuda::AttentionInputsParams& p) { p.q_out = nullptr; }},
      {"null partial", [](cuda::AttentionInputsParams& p) { p.partial = nullptr; }},
      {"null cache V", [](cuda::AttentionInputsParams& p) { p.cache.v = nullptr; }},
      {"null iq_out", [](cuda::AttentionInputsParams& p) { p.iq_out = nullptr; }},
      {"null ik_norm", [](cuda::AttentionInputsParams& p) { p.ik_norm = nullptr; }},
      {"null tables", [](cuda::AttentionInputsParams& p) { p.block_tables = nullptr; }},
  };
  for (const Bad& b : bad) {
    cuda::AttentionInputsParams p = good;
    b.mutate(p);
    const Status st = cuda::launch_attention_inputs(p, stream());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.what;
    EXPECT_NE(st.message().find("[cuda.attention_inputs]"), std::string::npos)
        << b.what << ": " << st.message();
  }
  gpu()->synchronize();
  std::printf("[ %-40s ] %zu bad parameter sets refused\n", "attention_inputs arguments",
              sizeof(bad) / sizeof(bad[0]));
}

}  // namespace
}  // namespace m3::cuda_test

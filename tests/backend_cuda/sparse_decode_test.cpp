// The real-shape decode kernels (bf16 cache): the lightning indexer and block-sparse paged
// attention, against the CPU backend's float32 ops on the same (bf16-representable) data, for a
// batch of sequences of different lengths: 64 query heads over 4 KV heads of 128, index heads
// 4 x 128, pages of 128, top-16 blocks.
#include <algorithm>
#include <numeric>
#include <set>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

// The attention's split kernels: 1, 2 and 4 key splits on float32 FMAs, 1 on the tensor cores.
struct SplitConfig {
  int64_t splits;
  bool mma;
};
constexpr SplitConfig kSplitConfigs[] = {{1, false}, {2, false}, {4, false}, {1, true}};

// Bound on |gpu - cpu| for element i of an attention output, as in cuda_composite_ops_test.cpp
// (scores within gamma_{D+2}·Σ|q||k|·scale, softmax and weighted sum within gamma_{n+8}·Σp|v|,
// both sides) plus the bf16 output rounding (unit roundoff 2^-8; an earlier 2^-9 was wrong: the
// GPU run showed errors of 2^-8·|o|). The tensor-core kernel (mma) rounds P to bf16: every weight
// perturbed by at most 2^-8 relatively adds 2^-7·Σ w|v - o| (as for the prefill's mma kernel).
double attention_bound(const AttentionRef& r, int64_t i, bool mma) {
  const double dev = r.dev[i];
  const double f32b = 2 * (2 * r.delta * dev + gamma(double(r.keys) + 8) * r.pv[i]) +
                      (mma ? std::ldexp(dev, -7) / (1 - std::ldexp(1.0, -8)) : 0);
  return f32b + std::ldexp(std::abs(r.o[i]) + f32b, -8) + 1e-30;
}

TEST(SparseDecode, IndexerAndAttentionMatchCpu) {
  const int64_t H = 64, Hkv = 4, D = 128, Hix = 4, Dix = 128, S = 128, top_k = 16;
  for (int64_t init_blocks : {0, 1}) {
    // Query position = len - 1. 140000 tokens (1094 blocks) takes the indexer's slot-by-slot
    // top-k; the others its rank count (<= 1024 candidate blocks).
    std::vector<int64_t> lens = {1, 300, 2049, 5000, 9000, 140000};
    const int64_t B = static_cast<int64_t>(lens.size());
    int64_t max_blocks = 0, pages = 1;  // page 0 unused
    for (int64_t l : lens) max_blocks = std::max(max_blocks, (l + S - 1) / S), pages += (l + S - 1) / S;
    // Block tables: consecutive pages shuffled globally, -1 past each sequence's end.
    std::vector<int32_t> perm(pages - 1);
    std::iota(perm.begin(), perm.end(), 1);
    std::mt19937 rng(60 + init_blocks);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(B * max_blocks, -1), pos(B);
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      pos[b] = static_cast<int32_t>(lens[b] - 1);
      for (int64_t j = 0; j < (lens[b] + S - 1) / S; ++j) tables[b * max_blocks + j] = perm[next++];
    }
    std::vector<float> kf, vf, ikf, qf, iqf;
    std::vector<uint16_t> kb, vb, ikb, qb, iqb;
    bf16_randn(pages * S * Hkv * D, 61, 1.0f, &kf, &kb);
    bf16_randn(pages * S * Hkv * D, 62, 1.0f, &vf, &vb);
    bf16_randn(pages * S * Dix, 63, 1.0f, &ikf, &ikb);
    bf16_randn(B * H * D, 64, 1.0f, &qf, &qb);
    bf16_randn(B * Hix * Dix, 65, 1.0f, &iqf, &iqb);

    Dev<uint16_t> dk(kb), dv(vb), dik(ikb), dq(qb), diq(iqb);
    Dev<int32_t> dtab(tables), dpos(pos);
    Dev<float> scores(std::vector<float>(B * Hix * max_blocks));
    auto dsel = Dev<int32_t>::poisoned(B * Hix * top_k);
    cuda::KvCacheView cv = cuda::bf16_kv_view(dk.ptr(), dv.ptr(), dik.ptr(), pages, S, Hkv, D, Dix);
    cuda::IndexerDecodeParams ip;
    ip.iq = diq.ptr();
    ip.cache = cv;
    ip.positions = dpos.ptr();
    ip.block_tables = dtab.ptr();
    ip.batch = B;
    ip.num_index_heads = Hix;
    ip.max_blocks = max_blocks;
    ip.top_k = top_k;
    ip.local_blocks = 1;
    ip.init_blocks = init_blocks;
    ip.block_scores = scores.ptr();
    ip.selected = dsel.ptr();
    ip.pdl = init_blocks == 1;  // the scoring as a programmatic dependent (same results)
    ASSERT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    auto gsel = dsel.host();

    // CPU indexer per sequence; selections equal except rounding ties (see
    // cuda_composite_ops_test.cpp for the criterion).
    KvLayerView hv{kf.data(), vf.data(), ikf.data(), pages, S, Hkv, D, Dix};
    int64_t ties = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t nb = (lens[b] + S - 1) / S;
      std::vector<int32_t> sel(Hix * top_k);
      cpu()->indexer_topk({iqf.data() + b * Hix * Dix, hv, pos.data() + b,
                           tables.data() + b * max_blocks, sel.data(), 1, Hix, nb, top_k, 1,
                           init_blocks});
      for (int64_t h = 0; h < Hix; ++h) {
        // Double block scores for the tie check.
        std::vector<double> bs(nb, -INFINITY);
        double mag = 0;
        for (int64_t j = 0; j <= pos[b]; ++j) {
          const float* kr = ikf.data() + (tables[b * max_blocks + j / S] * S + j % S) * Dix;
          double s = 0, a = 0;
          for (int64_t i = 0; i < Dix; ++i) {
            s += double(iqf[(b * Hix + h) * Dix + i]) * kr[i];
            a += std::abs(double(iqf[(b * Hix + h) * Dix + i]) * kr[i]);
          }
          bs[j / S] = std::max(bs[j / S], s);
          mag = std::max(mag, a);
        }
        bs[nb - 1] = INFINITY;
        for (int64_t i = 0; i < std::min(init_blocks, nb); ++i) bs[i] = INFINITY;
        std::set<int32_t> seen;
        for (int64_t s = 0; s < top_k; ++s) {
          const int32_t want = sel[h * top_k + s], got = gsel[(b * Hix + h) * top_k + s];
          if (want == -1 || got == -1) {
            ASSERT_EQ(got, want) << "seq " << b << " head " << h << " slot " << s;
            continue;
          }
          ASSERT_TRUE(seen.insert(got).second) << "duplicate block " << got;
          if (got != want) {
            ASSERT_TRUE(bs[got] == bs[want] || std::abs(bs[got] - bs[want]) <= 2 * gamma(Dix) * mag)
                << "seq " << b << " head " << h << " slot " << s << ": gpu " << got << " cpu "
                << want;
            ++ties;
          }
        }
      }
    }
    std::printf("[ %-40s ] B=%lld exact except %lld rounding ties (init_blocks %lld)\n",
                "indexer_decode bf16 real shapes", (long long)B, (long long)ties,
                (long long)init_blocks);

    // Attention on the GPU's selection, against the CPU op on the same selection, with each
    // block's keys in 1, 2 and 4 CTAs (key splits; more partial states for the combine), and
    // one split on the tensor cores (mma: P in bf16, the bound adds 2^-7·Σ w|v - o| as for the
    // prefill's mma kernel).
    for (const auto& [splits, mma] : kSplitConfigs) {
    Dev<float> opart(std::vector<float>(B * H * top_k * splits * D)),
        ml(std::vector<float>(B * H * top_k * splits * 2));
    auto dout = Dev<uint16_t>::poisoned(B * H * D);
    cuda::SparseDecodeParams ap;
    ap.q = dq.ptr();
    ap.cache = cv;
    ap.positions = dpos.ptr();
    ap.block_tables = dtab.ptr();
    ap.selected = dsel.ptr();
    ap.batch = B;
    ap.num_heads = H;
    ap.max_blocks = max_blocks;
    ap.top_k = top_k;
    ap.scale = 1.0f / std::sqrt(float(D));
    ap.o_partial = opart.ptr();
    ap.ml_partial = ml.ptr();
    ap.max_key_splits = splits;
    ap.force_key_splits = true;
    ap.mma = mma;
    ap.out = dout.ptr();
    ap.pdl = splits != 2;  // the split kernel as a programmatic dependent (same results)
    ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
    auto gout = dout.host();
    if (mma && splits == 1) {
      // The clustered split (the 16 CTAs of a group merge their states in distributed shared
      // memory, no combine launch): the same output bit for bit, with and without PDL.
      for (bool pdl : {false, true}) {
        auto dout2 = Dev<uint16_t>::poisoned(B * H * D);
        cuda::SparseDecodeParams ap2 = ap;
        ap2.cluster_combine = ap2.force_cluster_combine = true;  // B = 6: 384 CTAs
        ap2.pdl = pdl;
        ap2.out = dout2.ptr();
        ASSERT_TRUE(cuda::launch_sparse_decode(ap2, stream()).is_ok());
        EXPECT_TRUE(dout2.host() == gout) << "clustered split, pdl " << pdl;
      }
      // The cluster's own selection needs max_blocks <= 1024 (here 1094) and the cluster.
      cuda::SparseDecodeParams bad = ap;
      bad.block_scores = scores.ptr();
      bad.cluster_combine = bad.force_cluster_combine = true;
      EXPECT_EQ(cuda::launch_sparse_decode(bad, stream()).code(), StatusCode::kInvalidArgument);
      bad.max_blocks = 1024;
      bad.force_cluster_combine = bad.cluster_combine = false;
      EXPECT_EQ(cuda::launch_sparse_decode(bad, stream()).code(), StatusCode::kInvalidArgument);
      // Unforced, at batch 1 (64 CTAs: within the one-CTA-per-SM limit): the first row again.
      auto dout3 = Dev<uint16_t>::poisoned(H * D);
      cuda::SparseDecodeParams ap3 = ap;
      ap3.batch = 1;
      ap3.cluster_combine = true;
      ap3.out = dout3.ptr();
      ASSERT_TRUE(cuda::launch_sparse_decode(ap3, stream()).is_ok());
      const std::vector<uint16_t> first(gout.begin(), gout.begin() + H * D);
      EXPECT_TRUE(dout3.host() == first) << "clustered split at batch 1";
    }
    std::vector<float> got(B * H * D), want(B * H * D);
    std::vector<double> bound(B * H * D);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t nb = (lens[b] + S - 1) / S;
      cpu()->paged_attention({qf.data() + b * H * D, hv, pos.data() + b,
                              tables.data() + b * max_blocks, gsel.data() + b * Hix * top_k,
                              want.data() + b * H * D, 1, H, nb, Hix, top_k, ap.scale});
      // Bound: attention_bound.
      for (int64_t n = 0; n < H; ++n) {
        const int64_t g = n / (H / Hkv);
        std::set<int64_t> blocks;
        for (int64_t s = 0; s < top_k; ++s) {
          const int32_t x = gsel[(b * Hix + g) * top_k + s];
          if (x >= 0 && x <= pos[b] / S) blocks.insert(x);
        }
        const AttentionRef r =
            attention_ref(qf.data() + (b * H + n) * D,
                          kv_rows(blocks, pos[b], tables.data() + b * max_blocks, S, Hkv, g),
                          kf.data(), vf.data(), D, ap.scale);
        for (int64_t i = 0; i < D; ++i) {
          const size_t idx = (b * H + n) * D + i;
          got[idx] = bf16_to_f32(gout[idx]);
          bound[idx] = attention_bound(r, i, mma);
        }
      }
    }
    expect_close(got, want, bound,
                 "sparse_decode bf16 real shapes init" + std::to_string(init_blocks) + " splits" +
                     std::to_string(splits) + (mma ? " mma" : ""));
    }
  }
}

// The indexer's other shapes: 3 and 8 index heads (the two score-kernel instances, 4 and 8
// heads, with unused heads), local_blocks 2 and init_blocks 2, and candidate counts n = 157,
// 313, 782 (the rank count with 4, 2 and 1 lanes per candidate; the test above has 32, 16 and 8)
// and 5. Against the CPU indexer with the tie criterion of IndexerAndAttentionMatchCpu; a second
// launch (the top-k not a programmatic dependent) and a top-k with each row's rank count in one
// CTA instead of spread over several must give the same selection.
TEST(SparseDecode, IndexerHeadCountsAndRankLanesMatchCpu) {
  const int64_t Dix = 128, S = 128, top_k = 16, local_blocks = 2, init_blocks = 2;
  const std::vector<int64_t> lens = {20000, 40000, 100000, 600};
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t max_blocks = 0, pages = 1;
  for (int64_t l : lens)
    max_blocks = std::max(max_blocks, (l + S - 1) / S), pages += (l + S - 1) / S;
  std::vector<int32_t> perm(pages - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(70));
  std::vector<int32_t> tables(B * max_blocks, -1), pos(B);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = static_cast<int32_t>(lens[b] - 1);
    for (int64_t j = 0; j < (lens[b] + S - 1) / S; ++j) tables[b * max_blocks + j] = perm[next++];
  }
  std::vector<float> ikf;
  std::vector<uint16_t> ikb;
  bf16_randn(pages * S * Dix, 71, 1.0f, &ikf, &ikb);
  Dev<uint16_t> dik(ikb);
  Dev<int32_t> dtab(tables), dpos(pos);
  const cuda::KvCacheView cv =
      cuda::bf16_kv_view(nullptr, nullptr, dik.ptr(), pages, S, 1, 128, Dix);
  const KvLayerView hv{nullptr, nullptr, ikf.data(), pages, S, 1, 128, Dix};
  for (int64_t Hix : {3, 8}) {
    std::vector<float> iqf;
    std::vector<uint16_t> iqb;
    bf16_randn(B * Hix * Dix, 72 + static_cast<uint32_t>(Hix), 1.0f, &iqf, &iqb);
    Dev<uint16_t> diq(iqb);
    Dev<float> scores(std::vector<float>(B * Hix * max_blocks));
    auto dsel = Dev<int32_t>::poisoned(B * Hix * top_k);
    cuda::IndexerDecodeParams ip;
    ip.iq = diq.ptr();
    ip.cache = cv;
    ip.positions = dpos.ptr();
    ip.block_tables = dtab.ptr();
    ip.batch = B;
    ip.num_index_heads = Hix;
    ip.max_blocks = max_blocks;
    ip.top_k = top_k;
    ip.local_blocks = local_blocks;
    ip.init_blocks = init_blocks;
    ip.block_scores = scores.ptr();
    ip.selected = dsel.ptr();
    ASSERT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    const auto gsel = dsel.host();
    int64_t ties = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t nb = (lens[b] + S - 1) / S;
      std::vector<int32_t> sel(Hix * top_k);
      cpu()->indexer_topk({iqf.data() + b * Hix * Dix, hv, pos.data() + b,
                           tables.data() + b * max_blocks, sel.data(), 1, Hix, nb, top_k,
                           local_blocks, init_blocks});
      for (int64_t h = 0; h < Hix; ++h) {
        std::vector<double> bs(nb, -INFINITY);
        double mag = 0;
        for (int64_t j = 0; j <= pos[b]; ++j) {
          const float* kr = ikf.data() + (tables[b * max_blocks + j / S] * S + j % S) * Dix;
          double sc = 0, a = 0;
          for (int64_t i = 0; i < Dix; ++i) {
            sc += double(iqf[(b * Hix + h) * Dix + i]) * kr[i];
            a += std::abs(double(iqf[(b * Hix + h) * Dix + i]) * kr[i]);
          }
          bs[j / S] = std::max(bs[j / S], sc);
          mag = std::max(mag, a);
        }
        for (int64_t i = 0; i < local_blocks; ++i) bs[std::max<int64_t>(0, nb - 1 - i)] = INFINITY;
        for (int64_t i = 0; i < std::min(init_blocks, nb); ++i) bs[i] = INFINITY;
        std::set<int32_t> seen;
        for (int64_t s = 0; s < top_k; ++s) {
          const int32_t want = sel[h * top_k + s], got = gsel[(b * Hix + h) * top_k + s];
          if (want == -1 || got == -1) {
            ASSERT_EQ(got, want) << "seq " << b << " head " << h << " slot " << s;
            continue;
          }
          ASSERT_TRUE(seen.insert(got).second) << "duplicate block " << got;
          if (got != want) {
            ASSERT_TRUE(bs[got] == bs[want] || std::abs(bs[got] - bs[want]) <= 2 * gamma(Dix) * mag)
                << "Hix " << Hix << " seq " << b << " head " << h << " slot " << s << ": gpu "
                << got << " cpu " << want;
            ++ties;
          }
        }
      }
    }
    std::printf("[ %-40s ] Hix=%lld exact except %lld rounding ties\n",
                "indexer_decode n=157/313/782/5", (long long)Hix, (long long)ties);
    auto dsel2 = Dev<int32_t>::poisoned(B * Hix * top_k);  // again, top-k a plain launch
    ip.selected = dsel2.ptr();
    ip.dependent_launch = false;
    ASSERT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    EXPECT_EQ(dsel2.host(), gsel) << "Hix " << Hix << ": second run differs";
    // The rank count of each row in one CTA (spread_rank off) instead of up to 16 (this batch:
    // max_blocks 782, so each row's candidates are split 13 ways): the same selection.
    auto dsel3 = Dev<int32_t>::poisoned(B * Hix * top_k);
    ip.selected = dsel3.ptr();
    ip.scores_ready = true;  // the top-k alone, on the same block scores
    ip.spread_rank = false;
    ASSERT_TRUE(cuda::launch_indexer_decode(ip, stream()).is_ok());
    EXPECT_EQ(dsel3.host(), gsel) << "Hix " << Hix << ": one CTA per row differs";
  }
}

// Wide selections through the split attention and its combine: top_k 300 with 1, 2 and 4 key
// splits (300 / 600 / 1200 partial states per head: the combine's 1024-slot chunks run once or
// twice), a 38,400-token sequence selecting 31 of its 300 blocks through 300 slots (duplicates
// are skipped partial states), a short sequence whose selection mixes duplicates, -1 and blocks
// past its query, and groups that select nothing (zero output) or one block of one key. Against
// the CPU op with the bound of the first test; then the same launch again (the combine not a
// programmatic dependent) must give the same bits (fixed reduction orders).
TEST(SparseDecode, WideSelectionsAndCombineChunksMatchCpu) {
  const int64_t H = 64, Hkv = 4, D = 128, S = 128, top_k = 300;
  const std::vector<int64_t> lens = {38400, 1000, 129};
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t max_blocks = 0, pages = 1;
  for (int64_t l : lens)
    max_blocks = std::max(max_blocks, (l + S - 1) / S), pages += (l + S - 1) / S;
  std::vector<int32_t> perm(pages - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::mt19937 rng(66);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(B * max_blocks, -1), pos(B);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = static_cast<int32_t>(lens[b] - 1);
    for (int64_t j = 0; j < (lens[b] + S - 1) / S; ++j) tables[b * max_blocks + j] = perm[next++];
  }
  std::vector<int32_t> sel(B * Hkv * top_k, -1);
  for (int64_t g = 0; g < Hkv; ++g) {
    // 30 blocks of 300 ten times each, shuffled, and in the last slot one block not among them
    // (a live partial state in the combine's second chunk at 4 splits); 3,968 keys per head
    // keep the double-precision reference quick.
    int32_t* s0 = sel.data() + (0 * Hkv + g) * top_k;
    std::vector<int32_t> all(300);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t i = 0; i < top_k - 1; ++i) s0[i] = all[i % 30];
    std::shuffle(s0, s0 + top_k - 1, rng);
    s0[top_k - 1] = all[30];
    int32_t* s1 = sel.data() + (1 * Hkv + g) * top_k;  // blocks 0..7 twice, 250, -1 between
    for (int64_t i = 0; i < 40; ++i) s1[i] = i % 5 == 4 ? -1 : i % 3 == 2 ? 250 : int32_t(i % 8);
    std::shuffle(s1, s1 + 40, rng);
    int32_t* s2 = sel.data() + (2 * Hkv + g) * top_k;  // g 0: nothing; g 1: block 1 (one key)
    if (g == 1) s2[7] = 1;
    if (g >= 2) s2[0] = 1, s2[1] = 0, s2[2] = 1;
  }
  std::vector<float> kf, vf, qf;
  std::vector<uint16_t> kb, vb, qb;
  bf16_randn(pages * S * Hkv * D, 67, 1.0f, &kf, &kb);
  bf16_randn(pages * S * Hkv * D, 68, 1.0f, &vf, &vb);
  bf16_randn(B * H * D, 69, 1.0f, &qf, &qb);
  Dev<uint16_t> dk(kb), dv(vb), dq(qb);
  Dev<int32_t> dtab(tables), dpos(pos), dsel(sel);
  cuda::KvCacheView cv = cuda::bf16_kv_view(dk.ptr(), dv.ptr(), nullptr, pages, S, Hkv, D, 0);
  const float scale = 1.0f / std::sqrt(float(D));
  KvLayerView hv{kf.data(), vf.data(), nullptr, pages, S, Hkv, D, 0};
  std::vector<float> want(B * H * D);
  for (int64_t b = 0; b < B; ++b)
    cpu()->paged_attention({qf.data() + b * H * D, hv, pos.data() + b,
                            tables.data() + b * max_blocks, sel.data() + b * Hkv * top_k,
                            want.data() + b * H * D, 1, H, max_blocks, Hkv, top_k, scale});
  std::vector<double> bound(B * H * D), bound_mma(B * H * D);
  std::vector<bool> empty(B * H, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t n = 0; n < H; ++n) {
      const int64_t g = n / (H / Hkv);
      std::set<int64_t> blocks;
      for (int64_t s = 0; s < top_k; ++s) {
        const int32_t x = sel[(b * Hkv + g) * top_k + s];
        if (x >= 0 && x <= pos[b] / S) blocks.insert(x);
      }
      if (blocks.empty()) {  // no allowed key: the output is exactly zero
        empty[b * H + n] = true;
        continue;
      }
      const AttentionRef r =
          attention_ref(qf.data() + (b * H + n) * D,
                        kv_rows(blocks, pos[b], tables.data() + b * max_blocks, S, Hkv, g),
                        kf.data(), vf.data(), D, scale);
      for (int64_t i = 0; i < D; ++i) {
        bound[(b * H + n) * D + i] = attention_bound(r, i, false);
        bound_mma[(b * H + n) * D + i] = attention_bound(r, i, true);
      }
    }
  for (const auto& [splits, mma] : kSplitConfigs) {
    Dev<float> opart(std::vector<float>(B * H * top_k * splits * D)),
        ml(std::vector<float>(B * H * top_k * splits * 2));
    auto dout = Dev<uint16_t>::poisoned(B * H * D);
    cuda::SparseDecodeParams ap;
    ap.q = dq.ptr();
    ap.cache = cv;
    ap.positions = dpos.ptr();
    ap.block_tables = dtab.ptr();
    ap.selected = dsel.ptr();
    ap.batch = B;
    ap.num_heads = H;
    ap.max_blocks = max_blocks;
    ap.top_k = top_k;
    ap.scale = scale;
    ap.o_partial = opart.ptr();
    ap.ml_partial = ml.ptr();
    ap.max_key_splits = splits;
    ap.force_key_splits = true;
    ap.mma = mma;
    ap.out = dout.ptr();
    ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
    const auto gout = dout.host();
    std::vector<float> got(B * H * D), want_nz(want);
    std::vector<double> bnd(mma ? bound_mma : bound);
    for (size_t i = 0; i < got.size(); ++i) {
      got[i] = bf16_to_f32(gout[i]);
      if (empty[i / D]) {
        ASSERT_EQ(gout[i], 0) << "empty selection, element " << i << " splits " << splits;
        bnd[i] = 1e-30, want_nz[i] = 0.0f;
      }
    }
    const std::string what =
        "sparse_decode top_k 300 splits" + std::to_string(splits) + (mma ? " mma" : "");
    expect_close(got, want_nz, bnd, what);
    // Run to run, and with the combine as a plain launch: identical bits (the poisoned output
    // is rewritten).
    auto dout2 = Dev<uint16_t>::poisoned(B * H * D);
    ap.out = dout2.ptr();
    ap.dependent_launch = false;
    ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
    EXPECT_EQ(dout2.host(), gout) << what << ": second run differs";
  }
}

// No selection (the model's decode where every block fits the top-k, so the indexer is
// skipped): bit for bit the attention of the explicit selection 0, 1, ..., top_k - 1, for
// sequences of 1 to 16 blocks, 1, 2 and 4 key splits, plain and programmatic launches; refused
// where the tables are wider than top_k.
TEST(SparseDecode, EveryBlockWithoutSelectionEqualsTheAscendingSelection) {
  const int64_t H = 64, Hkv = 4, D = 128, S = 128, top_k = 16;
  const std::vector<int64_t> lens = {1, 128, 129, 1000, 2048, 1900};
  const int64_t B = static_cast<int64_t>(lens.size()), max_blocks = top_k;
  int64_t pages = 1;
  for (int64_t l : lens) pages += (l + S - 1) / S;
  std::vector<int32_t> perm(pages - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::mt19937 rng(70);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(B * max_blocks, -1), pos(B), sel(B * Hkv * top_k);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = static_cast<int32_t>(lens[b] - 1);
    for (int64_t j = 0; j < (lens[b] + S - 1) / S; ++j) tables[b * max_blocks + j] = perm[next++];
  }
  for (int64_t i = 0; i < B * Hkv; ++i)
    for (int64_t s = 0; s < top_k; ++s) sel[i * top_k + s] = static_cast<int32_t>(s);
  std::vector<float> kf, vf, qf;
  std::vector<uint16_t> kb, vb, qb;
  bf16_randn(pages * S * Hkv * D, 71, 1.0f, &kf, &kb);
  bf16_randn(pages * S * Hkv * D, 72, 1.0f, &vf, &vb);
  bf16_randn(B * H * D, 73, 1.0f, &qf, &qb);
  Dev<uint16_t> dk(kb), dv(vb), dq(qb);
  Dev<int32_t> dtab(tables), dpos(pos), dsel(sel);
  cuda::KvCacheView cv = cuda::bf16_kv_view(dk.ptr(), dv.ptr(), nullptr, pages, S, Hkv, D, 0);
  for (const auto& [splits, mma] : kSplitConfigs) {
    Dev<float> opart(std::vector<float>(B * H * top_k * splits * D)),
        ml(std::vector<float>(B * H * top_k * splits * 2));
    auto with_sel = Dev<uint16_t>::poisoned(B * H * D), without = Dev<uint16_t>::poisoned(B * H * D);
    cuda::SparseDecodeParams ap;
    ap.q = dq.ptr();
    ap.cache = cv;
    ap.positions = dpos.ptr();
    ap.block_tables = dtab.ptr();
    ap.selected = dsel.ptr();
    ap.batch = B;
    ap.num_heads = H;
    ap.max_blocks = max_blocks;
    ap.top_k = top_k;
    ap.scale = 1.0f / std::sqrt(float(D));
    ap.o_partial = opart.ptr();
    ap.ml_partial = ml.ptr();
    ap.max_key_splits = splits;
    ap.force_key_splits = true;
    ap.mma = mma;
    ap.out = with_sel.ptr();
    ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
    ap.selected = nullptr;
    ap.out = without.ptr();
    ap.pdl = splits == 4;
    ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
    const auto a = with_sel.host(), b = without.host();
    int64_t nonzero = 0;
    for (uint16_t x : b) nonzero += (x & 0x7FFF) != 0;
    EXPECT_EQ(a, b) << "splits " << splits << (mma ? " mma" : "");
    if (mma && splits == 1) {
      // The clustered split on the identity selection too.
      ap.cluster_combine = ap.force_cluster_combine = true;
      ap.out = with_sel.ptr();
      ASSERT_TRUE(cuda::launch_sparse_decode(ap, stream()).is_ok());
      EXPECT_EQ(with_sel.host(), b) << "clustered split, no selection";
      ap.cluster_combine = ap.force_cluster_combine = false;
    }
    EXPECT_GT(nonzero, B * H * D / 2) << "splits " << splits << ": the output is mostly zero";
    ap.max_blocks = top_k + 1;  // wider tables: the identity would miss blocks
    EXPECT_FALSE(cuda::launch_sparse_decode(ap, stream()).is_ok());
  }
  std::printf("[ %-40s ] exact (1, 2, 4 key splits; 1 on the tensor cores)\n",
              "sparse_decode every block, no selection");
}

}  // namespace
}  // namespace m3::cuda_test

#include "backend/cuda/norm/add_rms_norm.h"

namespace m3::cuda_test {
namespace {

// Fused residual add + Gemma RMSNorm (bf16 output) against the CPU add and rms_norm: the
// residual is one IEEE add on both sides (exact match); the normed value carries the float32
// norm bound (gamma_Hd/2 + 12u)·|y| plus the bf16 rounding (unit roundoff 2^-8).
// Rows up to cluster_rows take the cluster kernel (8 CTAs per row; hidden % 32 == 0, <= 8192),
// others one CTA per row: both ways, and a hidden the cluster cannot split (1000: one CTA).
TEST(AddRmsNorm, MatchesCpuAddThenNorm) {
  for (const int64_t cluster_rows : {int64_t{0}, int64_t{16}})
  for (const int64_t hd : {int64_t{6144}, int64_t{8192}, int64_t{1000}})
  for (int64_t t : {1, 5, 33}) {
    if (hd != 6144 && t == 33) continue;
    const std::string tag = " T" + std::to_string(t) + " Hd" + std::to_string(hd) +
                            " cluster_rows " + std::to_string(cluster_rows);
    auto r = randn(t * hd, 70, 2.0f), dlt = randn(t * hd, 71, 1.0f);
    std::vector<float> wf;
    std::vector<uint16_t> wb;
    bf16_randn(hd, 72, 0.3f, &wf, &wb);
    std::vector<float> want_r(r.size()), want(r.size());
    cpu()->add({r.data(), dlt.data(), want_r.data(), t * hd});
    cpu()->rms_norm({want_r.data(), wf.data(), want.data(), t, hd, 1e-6f, true});
    Dev<float> dr(r), dd(dlt);
    Dev<uint16_t> dw(wb);
    auto dout = Dev<uint16_t>::poisoned(t * hd);
    cuda::AddRmsNormParams p;  // by field: the struct grows optional outputs
    p.residual = dr.ptr();
    p.delta = dd.ptr();
    p.weight = dw.ptr();
    p.out = dout.ptr();
    p.t = t;
    p.hidden = hd;
    p.eps = 1e-6f;
    p.cluster_rows = cluster_rows;
    ASSERT_TRUE(cuda::launch_add_rms_norm(p, stream()).is_ok());
    EXPECT_EQ(dr.host(), want_r) << "residual" << tag;
    auto ob = dout.host();
    std::vector<float> got(ob.size());
    std::vector<double> bound(ob.size());
    for (size_t i = 0; i < ob.size(); ++i) {
      got[i] = bf16_to_f32(ob[i]);
      const double f32b = (gamma(hd) / 2 + 12 * kU) * std::abs(want[i]);
      bound[i] = f32b + std::ldexp(std::abs(want[i]) + f32b, -8) + 1e-30;
    }
    expect_close(got, want, bound, "add_rms_norm bf16" + tag);
    // The optional f16 copy (GEMV variant 5's input): the same bf16 values times a power of two
    // per row, exact, with the row's largest magnitude in [2^14, 2^15). Residual 2.0 + delta: the
    // add runs again on the updated residual, so compare against this run's bf16 output.
    auto df = Dev<uint16_t>::poisoned(t * hd);
    auto dinv = Dev<float>::poisoned(t);
    p.out_f16 = df.ptr();
    p.out_inv_scale = dinv.ptr();
    ASSERT_TRUE(cuda::launch_add_rms_norm(p, stream()).is_ok());
    const auto ob2 = dout.host(), of = df.host();
    const auto inv = dinv.host();
    for (int64_t row = 0; row < t; ++row) {
      float mx = 0.0f;
      for (int64_t i = 0; i < hd; ++i) {
        const size_t j = size_t(row * hd + i);
        ASSERT_EQ(f16_to_f32(of[j]) * inv[row], bf16_to_f32(ob2[j]))
            << "f16 copy, row " << row << tag;
        mx = std::max(mx, std::abs(f16_to_f32(of[j])));
      }
      EXPECT_GE(mx, 16384.0f) << "row " << row << tag;
      EXPECT_LT(mx, 32768.0f) << "row " << row << tag;
    }
    p.out_inv_scale = nullptr;  // both or neither
    EXPECT_FALSE(cuda::launch_add_rms_norm(p, stream()).is_ok());
  }
}

}  // namespace
}  // namespace m3::cuda_test

#include "backend/cuda/rope/qk_norm_rope.h"

namespace m3::cuda_test {
namespace {

// Fused per-head Gemma norm + partial RoPE (bf16 out) against the CPU rms_norm then rope. The
// norm differs by at most (gamma_D/2 + 12u)·|y| per element (float vs double sum of squares);
// RoPE mixes two such elements with |cos|, |sin| <= 1 and adds 2u per side; then the bf16
// rounding (unit roundoff 2^-8: 8 significand bits).
TEST(QkNormRope, MatchesCpuNormThenRope) {
  struct C {
    int64_t t, h, rotary_dim, rot_width;
  };
  for (C c : {C{3, 64, 64, 64}, C{5, 4, 64, 64}, C{2, 1, 64, 64}, C{4, 4, 32, 32}}) {
    const int64_t d = 128;
    auto x = randn(c.t * c.h * d, 80, 3.0f);
    std::vector<float> wf;
    std::vector<uint16_t> wb;
    bf16_randn(d, 81, 0.3f, &wf, &wb);
    std::vector<int32_t> pos(c.t);
    for (int64_t i = 0; i < c.t; ++i) pos[i] = static_cast<int32_t>(i * 9973 + 5);
    std::vector<float> y(x.size());
    cpu()->rms_norm({x.data(), wf.data(), y.data(), c.t * c.h, d, 1e-6f, true});
    std::vector<float> want = y;
    cpu()->rope({want.data(), pos.data(), c.t, c.h, d, c.rotary_dim, c.rot_width, 5e6});
    Dev<float> dx(x);
    Dev<uint16_t> dw(wb);
    Dev<int32_t> dp(pos);
    auto dout = Dev<uint16_t>::poisoned(c.t * c.h * d);
    cuda::QkNormRopeParams p;
    p.x = dx.ptr();
    p.weight = dw.ptr();
    p.positions = dp.ptr();
    p.out = dout.ptr();
    p.t = c.t;
    p.h = c.h;
    p.rotary_dim = c.rotary_dim;
    p.rot_width = c.rot_width;
    ASSERT_TRUE(cuda::launch_qk_norm_rope(p, stream()).is_ok());
    auto ob = dout.host();
    std::vector<float> got(ob.size());
    std::vector<double> bound(ob.size());
    const double rel = gamma(d) / 2 + 12 * kU;
    for (int64_t r = 0; r < c.t * c.h; ++r)
      for (int64_t i = 0; i < d; ++i) {
        const size_t k = r * d + i;
        double f32b = rel * std::abs(y[k]);
        if (i < c.rot_width) {
          const size_t partner = i < c.rot_width / 2 ? k + c.rot_width / 2 : k - c.rot_width / 2;
          f32b = (rel + 4 * kU) * (std::abs(y[k]) + std::abs(y[partner]));
        }
        got[k] = bf16_to_f32(ob[k]);
        bound[k] = f32b + std::ldexp(std::abs(want[k]) + f32b, -8) + 1e-30;
      }
    expect_close(got, want, bound,
                 "qk_norm_rope bf16 H" + std::to_string(c.h) + " rot" + std::to_string(c.rot_width));
  }
}

// Four head groups of one fused projection (q 64, k 4, index q 4, index k 1 heads, token stride
// 9856 as in the model) in one launch_qk_norm_rope_multi equal four single launches bit for bit
// (the same per-row arithmetic; the segment only picks pointers).
TEST(QkNormRope, MultiSegmentEqualsSingleLaunches) {
  const int64_t t = 5, d = 128, ld = 9856;
  const int64_t heads[4] = {64, 4, 4, 1}, offs[4] = {0, 8192, 9216, 9728};
  auto x = randn(t * ld, 82, 3.0f);
  std::vector<float> wf;
  std::vector<uint16_t> wb[4];
  for (int i = 0; i < 4; ++i) bf16_randn(d, 83 + i, 0.3f, &wf, &wb[i]);
  std::vector<int32_t> pos(t);
  for (int64_t i = 0; i < t; ++i) pos[i] = static_cast<int32_t>(i * 7919 + 3);
  Dev<float> dx(x);
  Dev<int32_t> dp(pos);
  std::vector<Dev<uint16_t>> dw, single, multi;
  dw.reserve(4), single.reserve(4), multi.reserve(4);  // ptr()s are kept below
  for (int i = 0; i < 4; ++i) dw.emplace_back(wb[i]);
  cuda::QkNormRopeParams segs[4];
  for (int i = 0; i < 4; ++i) {
    single.push_back(Dev<uint16_t>::poisoned(t * heads[i] * d));
    multi.push_back(Dev<uint16_t>::poisoned(t * heads[i] * d));
    cuda::QkNormRopeParams& p = segs[i];
    p.x = dx.ptr() + offs[i];
    p.ld_x = ld;
    p.weight = dw[i].ptr();
    p.positions = dp.ptr();
    p.t = t;
    p.h = heads[i];
    p.out = single[i].ptr();
    ASSERT_TRUE(cuda::launch_qk_norm_rope(p, stream()).is_ok());
    p.out = multi[i].ptr();
  }
  ASSERT_TRUE(cuda::launch_qk_norm_rope_multi(segs, 4, stream()).is_ok());
  int64_t differ = 0;
  for (int i = 0; i < 4; ++i) {
    const auto a = single[i].host(), b = multi[i].host();
    for (size_t k = 0; k < a.size(); ++k) differ += a[k] != b[k];
  }
  std::printf("[ %-40s ] %lld of %lld values differ\n", "qk_norm_rope 4 segments vs 4 launches",
              (long long)differ, (long long)(t * 73 * d));
  EXPECT_EQ(differ, 0);
  EXPECT_FALSE(cuda::launch_qk_norm_rope_multi(segs, 5, stream()).is_ok());
}

}  // namespace
}  // namespace m3::cuda_test

#include "backend/cuda/kv/kv_write_bf16.h"
#include "backend/cuda/moe/moe_combine.h"
#include "backend/cuda/gemm/quant_gemv.h"

namespace m3::cuda_test {
namespace {

// bf16 KV write: K and index keys copied, V rounded to bf16 (RNE), at page block_table[pos/S];
// a -1 page writes nothing. Exact.
TEST(KvWriteBf16, ExactAtThePage) {
  const int64_t b = 3, pages = 5, S = 128, hkv = 4, d = 128, dix = 128, max_blocks = 3;
  std::vector<int32_t> pos = {0, 300, 200}, tables = {2, -1, -1, 0, 1, 4, 3, -1, -1};
  // seq 2: position 200 -> block 1 -> page -1: skipped.
  std::vector<float> kf, ikf;
  std::vector<uint16_t> kb, ikb;
  bf16_randn(b * hkv * d, 90, 1.0f, &kf, &kb);
  bf16_randn(b * dix, 91, 1.0f, &ikf, &ikb);
  const int64_t ld_v = 1000;
  auto v = randn(b * ld_v, 92);
  const std::vector<uint16_t> zero_kv(pages * S * hkv * d, 0), zero_ik(pages * S * dix, 0);
  Dev<uint16_t> ck(zero_kv), cv(zero_kv), cik(zero_ik), dk(kb), dik(ikb);
  Dev<float> dv(v);
  Dev<int32_t> dpos(pos), dtab(tables);
  cuda::KvWriteBf16Params p;
  p.cache = cuda::bf16_kv_view(ck.ptr(), cv.ptr(), cik.ptr(), pages, S, hkv, d, dix);
  p.k = dk.ptr();
  p.v = dv.ptr();
  p.ld_v = ld_v;
  p.idx_k = dik.ptr();
  p.positions = dpos.ptr();
  p.block_tables = dtab.ptr();
  p.batch = b;
  p.max_blocks = max_blocks;
  ASSERT_TRUE(cuda::launch_kv_write_bf16(p, stream()).is_ok());
  std::vector<uint16_t> wk = zero_kv, wv = zero_kv, wik = zero_ik;
  for (int64_t s = 0; s < b; ++s) {
    const int32_t page = tables[s * max_blocks + pos[s] / S];
    if (page < 0) continue;
    const int64_t slot = page * S + pos[s] % S;
    for (int64_t i = 0; i < hkv * d; ++i) {
      wk[slot * hkv * d + i] = kb[s * hkv * d + i];
      wv[slot * hkv * d + i] = f32_to_bf16(v[s * ld_v + i]);
    }
    for (int64_t i = 0; i < dix; ++i) wik[slot * dix + i] = ikb[s * dix + i];
  }
  EXPECT_EQ(ck.host(), wk);
  EXPECT_EQ(cv.host(), wv);
  EXPECT_EQ(cik.host(), wik);
  std::printf("[ %-40s ] exact\n", "kv_write_bf16");
}

// MoE combine: Σ_s w·contrib in ascending slot order plus the shared expert, the same float
// operations as the CPU reference: exact.
TEST(MoeCombine, ExactSlotOrder) {
  const int64_t t = 5, k = 4, hd = 6144;
  auto contrib = randn(t * k * hd, 93), w = randn(t * k, 94), shared = randn(t * hd, 95);
  std::vector<float> want(t * hd);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < hd; ++j) {
      float o = 0;
      for (int64_t s = 0; s < k; ++s) {
        const float c = contrib[(i * k + s) * hd + j] * w[i * k + s];
        o = s == 0 ? c : o + c;
      }
      want[i * hd + j] = o + shared[i * hd + j];
    }
  Dev<float> dc(contrib), dw(w), ds(shared);
  auto out = Dev<float>::poisoned(t * hd);
  ASSERT_TRUE(cuda::launch_moe_combine({dc.ptr(), dw.ptr(), ds.ptr(), out.ptr(), t, k, hd}, stream()).is_ok());
  EXPECT_EQ(out.host(), want);
  std::printf("[ %-40s ] exact\n", "moe_combine");
}

// The norm's fused delta sources (the split-K sum of a GEMV's partials, the MoE combine) equal
// the separate epilogue / combine launch followed by the plain norm, bit for bit: residual, bf16
// output, f16 copy and its factors. Also: at most one source, and bad counts refused.
TEST(AddRmsNorm, FusedDeltaSourcesEqualSeparateLaunches) {
  const int64_t hd = 6144;
  std::vector<float> wf;
  std::vector<uint16_t> wb;
  bf16_randn(hd, 96, 0.3f, &wf, &wb);
  Dev<uint16_t> dw(wb);
  for (const int64_t cluster_rows : {int64_t{0}, int64_t{16}})
  for (int64_t t : {1, 3, 8}) {
    for (int64_t sources : {1, 2, 4, 5}) {  // slices, or top-k for the MoE case
      for (bool moe : {false, true}) {
        const auto r0 = randn(t * hd, 97 + t, 2.0f);
        const auto parts = randn(sources * t * hd, 98 + sources, 1.0f);
        const auto wts = randn(t * sources, 99);
        const auto shared = randn(t * hd, 100);
        Dev<float> dp(parts), dwt(wts), dsh(shared);
        // Reference: delta stored by the existing launch, then the norm reads it.
        Dev<float> ref_r(r0);
        auto delta = Dev<float>::poisoned(t * hd);
        if (moe) {
          ASSERT_TRUE(cuda::launch_moe_combine({dp.ptr(), dwt.ptr(), dsh.ptr(), delta.ptr(), t,
                                                sources, hd}, stream()).is_ok());
        } else {
          cuda::GemvEpilogueParams e;
          e.kind = cuda::GemvEpilogue::kStoreF32;
          e.partial = dp.ptr();
          e.num_slices = sources;
          e.num_rows = t;
          e.n = hd;
          e.y = delta.ptr();
          e.ldy = hd;
          ASSERT_TRUE(cuda::launch_quant_gemv_epilogue(e, stream()).is_ok());
        }
        auto ref_out = Dev<uint16_t>::poisoned(t * hd), ref_f16 = Dev<uint16_t>::poisoned(t * hd);
        auto ref_inv = Dev<float>::poisoned(t);
        cuda::AddRmsNormParams p;
        p.residual = ref_r.ptr();
        p.delta = delta.ptr();
        p.weight = dw.ptr();
        p.out = ref_out.ptr();
        p.t = t;
        p.hidden = hd;
        p.out_f16 = ref_f16.ptr();
        p.out_inv_scale = ref_inv.ptr();
        p.cluster_rows = cluster_rows;
        // As a programmatic dependent of the kernel that writes its delta (the epilogue lets its
        // dependents start at its own start): the norm must wait for it before it reads.
        p.pdl = true;
        ASSERT_TRUE(cuda::launch_add_rms_norm(p, stream()).is_ok());
        p.pdl = false;
        // Fused.
        Dev<float> got_r(r0);
        auto got_out = Dev<uint16_t>::poisoned(t * hd), got_f16 = Dev<uint16_t>::poisoned(t * hd);
        auto got_inv = Dev<float>::poisoned(t);
        p.residual = got_r.ptr();
        p.out = got_out.ptr();
        p.out_f16 = got_f16.ptr();
        p.out_inv_scale = got_inv.ptr();
        p.delta = delta.ptr();
        if (moe) {
          p.moe_contrib = dp.ptr();
          p.moe_weights = dwt.ptr();
          p.moe_shared = dsh.ptr();
          p.moe_top_k = sources;
        } else {
          p.delta_partial = dp.ptr();
          p.delta_slices = sources;
        }
        EXPECT_FALSE(cuda::launch_add_rms_norm(p, stream()).is_ok()) << "two delta sources";
        p.delta = nullptr;
        ASSERT_TRUE(cuda::launch_add_rms_norm(p, stream()).is_ok());
        const std::string what = std::string(moe ? "moe top-k " : "slices ") +
                                 std::to_string(sources) + " T" + std::to_string(t) +
                                 " cluster_rows " + std::to_string(cluster_rows);
        EXPECT_EQ(got_r.host(), ref_r.host()) << "residual, " << what;
        EXPECT_EQ(got_out.host(), ref_out.host()) << "bf16 out, " << what;
        EXPECT_EQ(got_f16.host(), ref_f16.host()) << "f16 copy, " << what;
        EXPECT_EQ(got_inv.host(), ref_inv.host()) << "f16 factors, " << what;
        if (moe) {
          p.moe_top_k = 0;
        } else {
          p.delta_slices = 0;
        }
        EXPECT_FALSE(cuda::launch_add_rms_norm(p, stream()).is_ok()) << "zero count, " << what;
      }
    }
  }
  std::printf("[ %-40s ] exact\n", "add_rms_norm fused delta sources");
}

}  // namespace
}  // namespace m3::cuda_test

// Prefill-chunk attention at the real shapes (src/backend/cuda/attention/sparse_prefill.h): the
// indexer for T query tokens of one sequence and block-sparse (or dense causal) paged attention
// of the chunk, against the CPU backend's float32 indexer_topk and paged_attention on the same
// bf16-representable data. The scratch limit is small so that several sub-chunks run.
// Selections must be equal except rounding ties (criterion of sparse_decode_test.cpp); the
// attention bound is the one derived there (scores within gamma_{D+2}·Σ|q||k|·scale, softmax and
// weighted sum within gamma_{n+8}·Σp|v|, both sides, plus the bf16 output rounding 2^-8).
#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

struct Case {
  int64_t context;  // tokens in the sequence after the chunk
  int64_t t;        // chunk tokens (the last t positions)
  bool dense;
  int64_t init_blocks;
  int64_t scratch;
  int variant;      // PrefillAttentionKernel: 0 per-token decode kernels; 1 tensor cores (P rounded
                    // to bf16: see the bound); 2 tiled tensor cores (the same bound; also checked
                    // against variant 1 on the same selection)
  int indexer_variant = 0;  // PrefillIndexerKernel: 0 per-token decode indexer; 1 cuBLASLt scores
                            // + max-pool; 2 fused block scores
};

class PrefillAttention : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillAttention, MatchesCpu) {
  const Case c = GetParam();
  const int64_t H = 64, Hkv = 4, D = 128, Hix = 4, Dix = 128, S = 128, top_k = 16;
  const int64_t nb = (c.context + S - 1) / S, pages = nb + 3;
  std::vector<int32_t> table(nb);
  std::iota(table.begin(), table.end(), 2);
  std::mt19937 rng(70);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> pos(c.t);
  for (int64_t i = 0; i < c.t; ++i) pos[i] = static_cast<int32_t>(c.context - c.t + i);
  std::vector<float> kf, vf, ikf, qf, iqf;
  std::vector<uint16_t> kb, vb, ikb, qb, iqb;
  bf16_randn(pages * S * Hkv * D, 71, 1.0f, &kf, &kb);
  bf16_randn(pages * S * Hkv * D, 72, 1.0f, &vf, &vb);
  bf16_randn(pages * S * Dix, 73, 1.0f, &ikf, &ikb);
  bf16_randn(c.t * H * D, 74, 1.0f, &qf, &qb);
  bf16_randn(c.t * Hix * Dix, 75, 1.0f, &iqf, &iqb);

  // The unwritten tail of the last block holds NaN bit patterns on the GPU (never read as
  // values: keys past a token's position must not reach the output even with weight 0).
  for (int64_t j = c.context; j < nb * S; ++j)
    for (int64_t i = 0; i < Hkv * D; ++i) {
      kb[(table[j / S] * S + j % S) * Hkv * D + i] = 0x7FC0;
      vb[(table[j / S] * S + j % S) * Hkv * D + i] = 0x7FC0;
    }
  for (int64_t j = c.context; j < nb * S; ++j)
    for (int64_t i = 0; i < Dix; ++i) ikb[(table[j / S] * S + j % S) * Dix + i] = 0x7FC0;
  Dev<uint16_t> dk(kb), dv(vb), dik(ikb), dq(qb), diq(iqb);
  Dev<int32_t> dtab(table), dpos(pos);
  auto dsel = Dev<int32_t>::poisoned(c.t * Hix * top_k);
  auto dout = Dev<uint16_t>::poisoned(c.t * H * D);
  static cuda::CachingAllocator alloc;
  cuda::PrefillAttentionParams p;
  p.q = dq.ptr();
  p.iq = diq.ptr();
  p.cache = cuda::bf16_kv_view(dk.ptr(), dv.ptr(), dik.ptr(), pages, S, Hkv, D, Dix);
  p.positions = dpos.ptr();
  p.block_table = dtab.ptr();
  p.t = c.t;
  p.num_heads = H;
  p.num_index_heads = Hix;
  p.num_blocks = nb;
  p.top_k = top_k;
  p.local_blocks = 1;
  p.init_blocks = c.init_blocks;
  p.dense = c.dense;
  p.scale = 1.0f / std::sqrt(float(D));
  p.selected = dsel.ptr();
  p.out = dout.ptr();
  p.kernel = static_cast<cuda::PrefillAttentionKernel>(c.variant);
  p.indexer = static_cast<cuda::PrefillIndexerKernel>(c.indexer_variant);
  static auto gemm = cuda::PrefillGemm::create(&alloc, 16 << 20);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  p.gemm = gemm->get();
  Status st = cuda::launch_prefill_attention(p, &alloc, stream(), c.scratch);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  auto gout = dout.host();

  KvLayerView hv{kf.data(), vf.data(), ikf.data(), pages, S, Hkv, D, Dix};
  std::vector<int32_t> gsel;
  if (!c.dense) {
    gsel = dsel.host();
    std::vector<int32_t> sel(c.t * Hix * top_k);
    cpu()->indexer_topk({iqf.data(), hv, pos.data(), table.data(), sel.data(), c.t, Hix, nb, top_k,
                         1, c.init_blocks});
    int64_t ties = 0;
    for (int64_t t = 0; t < c.t; ++t) {
      const int64_t qblk = pos[t] / S;
      for (int64_t h = 0; h < Hix; ++h) {
        std::vector<double> bs(qblk + 1, -INFINITY);
        double mag = 0;
        for (int64_t j = 0; j <= pos[t]; ++j) {
          const float* kr = ikf.data() + (table[j / S] * S + j % S) * Dix;
          double s = 0, a = 0;
          for (int64_t i = 0; i < Dix; ++i) {
            s += double(iqf[(t * Hix + h) * Dix + i]) * kr[i];
            a += std::abs(double(iqf[(t * Hix + h) * Dix + i]) * kr[i]);
          }
          bs[j / S] = std::max(bs[j / S], s);
          mag = std::max(mag, a);
        }
        bs[qblk] = INFINITY;
        for (int64_t i = 0; i < std::min(c.init_blocks, qblk + 1); ++i) bs[i] = INFINITY;
        std::set<int32_t> seen;
        for (int64_t s = 0; s < top_k; ++s) {
          const size_t idx = static_cast<size_t>((t * Hix + h) * top_k + s);
          const int32_t want = sel[idx], got = gsel[idx];
          if (want == -1 || got == -1) {
            ASSERT_EQ(got, want) << "token " << t << " head " << h << " slot " << s;
            continue;
          }
          ASSERT_TRUE(seen.insert(got).second) << "duplicate block " << got;
          if (got != want) {
            // Each side's score is within gamma_{Dix+2}·Σ|q||k| of the exact one (the tensor
            // cores of indexer variants 1 and 2: 2·gamma, truncating accumulation): 3·gamma
            // apart.
            ASSERT_TRUE(bs[got] == bs[want] ||
                        std::abs(bs[got] - bs[want]) <= 3 * gamma(Dix + 2) * mag)
                << "token " << t << " head " << h << " slot " << s << ": gpu " << got << " cpu "
                << want;
            ++ties;
          }
        }
      }
    }
    std::printf("[ %-40s ] T=%lld ctx=%lld exact except %lld rounding ties\n",
                c.indexer_variant == 2   ? "prefill indexer v2 (fused) real shapes"
                : c.indexer_variant == 1 ? "prefill indexer v1 (gemm) real shapes"
                                         : "prefill indexer v0 real shapes",
                (long long)c.t, (long long)c.context, (long long)ties);
  }

  std::vector<float> want(c.t * H * D), got(c.t * H * D);
  cpu()->paged_attention({qf.data(), hv, pos.data(), table.data(), c.dense ? nullptr : gsel.data(),
                          want.data(), c.t, H, nb, Hix, top_k, p.scale});
  std::vector<double> bound(want.size());
  for (int64_t t = 0; t < c.t; ++t) {
    for (int64_t n = 0; n < H; ++n) {
      const int64_t g = n / (H / Hkv);
      std::set<int64_t> blocks;
      if (c.dense) {
        for (int64_t b = 0; b <= pos[t] / S; ++b) blocks.insert(b);
      } else {
        for (int64_t s = 0; s < top_k; ++s) {
          const int32_t x = gsel[(t * Hix + g) * top_k + s];
          if (x >= 0 && x <= pos[t] / S) blocks.insert(x);
        }
      }
      const AttentionRef r = attention_ref(qf.data() + (t * H + n) * D,
                                           kv_rows(blocks, pos[t], table.data(), S, Hkv, g),
                                           kf.data(), vf.data(), D, p.scale);
      for (int64_t i = 0; i < D; ++i) {
        const double o = r.o[i], pv = r.pv[i], dev = r.dev[i], delta = r.delta;
        const size_t idx = static_cast<size_t>((t * H + n) * D + i);
        got[idx] = bf16_to_f32(gout[idx]);
        // Variant 1 rounds P to bf16 (for both the weights and their sum): the weights move by
        // at most 2·2^-8/(1 - 2^-8) relatively, so the mean moves by at most that · Σw|v - o|.
        const double f32b = 2 * (2 * delta * dev + gamma(double(r.keys) + 8) * pv) +
                            (c.variant >= 1 ? std::ldexp(dev, -7) / (1 - std::ldexp(1.0, -8)) : 0);
        bound[idx] = f32b + std::ldexp(std::abs(o) + f32b, -8) + 1e-30;
      }
    }
  }
  char what[96];
  std::snprintf(what, sizeof(what), "prefill attention v%d %s T=%lld ctx=%lld init%lld",
                c.variant, c.dense ? "dense" : "sparse", (long long)c.t, (long long)c.context,
                (long long)c.init_blocks);
  expect_close(got, want, bound, what);

  if (c.variant == 2) {
    // The tiled kernel against kTensorCore on the same selection: both within `bound` of the
    // exact result, so within twice that of each other.
    auto dref = Dev<uint16_t>::poisoned(c.t * H * D);
    cuda::PrefillAttentionParams r = p;
    r.out = dref.ptr();
    st = cuda::launch_prefill_attention_mma(r, c.dense ? nullptr : dsel.ptr(), top_k, stream());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const auto gref = dref.host();
    std::vector<float> ref(gref.size());
    std::vector<double> bound2(bound.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = bf16_to_f32(gref[i]);
      bound2[i] = 2 * bound[i];
    }
    std::snprintf(what, sizeof(what), "prefill attention v2 vs v1 %s T=%lld ctx=%lld",
                  c.dense ? "dense" : "sparse", (long long)c.t, (long long)c.context);
    expect_close(got, ref, bound2, what);
    // Both paths of the tiled kernel (every tile staged through shared memory / every tile per
    // warp from the cache) give the same values.
    for (const int64_t limit : {int64_t{0}, int64_t{1} << 40}) {
      r.tiled_union_limit = limit;
      st = cuda::launch_prefill_attention_tiled(r, c.dense ? nullptr : dsel.ptr(), top_k,
                                                stream());
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const auto g2 = dref.host();
      for (size_t i = 0; i < g2.size(); ++i)
        ASSERT_EQ(bf16_to_f32(g2[i]), got[i]) << "union limit " << limit << " element " << i;
    }
  }
}

constexpr int64_t kMiB = 1 << 20;
INSTANTIATE_TEST_SUITE_P(
    Chunks, PrefillAttention,
    ::testing::Values(Case{40, 40, false, 0, 4 * kMiB, 0},       // first chunk, one block
                      Case{2948, 48, false, 0, 4 * kMiB, 0},     // 24 blocks > top-16
                      Case{2400, 130, false, 1, 64 * kMiB, 0},   // chunk spans a block boundary
                      Case{700, 64, true, 0, 16 * kMiB, 0},      // dense causal
                      Case{40, 40, false, 0, 4 * kMiB, 1},
                      Case{2948, 48, false, 0, 4 * kMiB, 1},
                      Case{2400, 130, false, 1, 64 * kMiB, 1},
                      Case{700, 64, true, 0, 16 * kMiB, 1},
                      // cuBLASLt indexer (sub-chunks of different causal widths)
                      Case{2948, 48, false, 0, 4 * kMiB, 1, 1},
                      Case{2400, 130, false, 1, 64 * kMiB, 1, 1},
                      // Tiled attention + fused indexer: first chunk (position 0, T not a
                      // multiple of the 8-token tile), mid-page start with sub-chunks, a chunk
                      // across a block boundary, dense mid-page and dense from position 0, and
                      // a long context where a tile's union of selected blocks is large.
                      Case{37, 37, false, 0, 4 * kMiB, 2, 2},
                      Case{2948, 45, false, 0, 16 * 1024, 2, 2},
                      Case{2400, 130, false, 1, 64 * kMiB, 2, 2},
                      Case{700, 61, true, 0, 16 * kMiB, 2},
                      Case{300, 300, true, 0, 16 * kMiB, 2},
                      Case{16500, 23, false, 1, 1 * kMiB, 2, 2},
                      // Mixed: the tiled attention on the cuBLASLt indexer's selection.
                      Case{2948, 48, false, 0, 4 * kMiB, 2, 1}));

// The fused indexer's block scores against the float64 reference and against kGemmScores's
// (gather + cuBLASLt + max-pool) on the same inputs: a chunk that starts mid-page, rows not a
// multiple of the 128-row tile, missing pages (-1 in the table) and a NaN page tail. Scores are
// bf16 products accumulated in float32 on the tensor cores: within 2·gamma_{Dix+2}·Σ|q||k| of
// the exact dot product (truncating accumulation), so the max over a block's keys too; the two
// GPU paths within twice that of each other. -inf entries (past b_q, missing pages) must match
// exactly.
TEST(PrefillIndexerFused, BlockScoresMatchGemmAndCpu) {
  const int64_t Hix = 4, Dix = 128, S = 128;
  const int64_t context = 5000, T = 77, nb = (context + S - 1) / S, pages = nb + 2;
  std::vector<int32_t> table(nb);
  std::iota(table.begin(), table.end(), 1);
  std::mt19937 rng(80);
  std::shuffle(table.begin(), table.end(), rng);
  table[3] = -1;
  table[nb - 5] = -1;
  std::vector<int32_t> pos(T);
  for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(context - T + i);
  std::vector<float> ikf, iqf;
  std::vector<uint16_t> ikb, iqb;
  bf16_randn(pages * S * Dix, 81, 1.0f, &ikf, &ikb);
  bf16_randn(T * Hix * Dix, 82, 1.0f, &iqf, &iqb);
  for (int64_t j = context; j < nb * S; ++j)
    for (int64_t i = 0; i < Dix; ++i) ikb[(table[j / S] * S + j % S) * Dix + i] = 0x7FC0;
  Dev<uint16_t> dik(ikb), diq(iqb), dummy(std::vector<uint16_t>(8));
  Dev<int32_t> dtab(table), dpos(pos);
  const cuda::KvCacheView cache =
      cuda::bf16_kv_view(dummy.ptr(), dummy.ptr(), dik.ptr(), pages, S, 4, 128, Dix);
  auto dfused = Dev<float>::poisoned(T * Hix * nb);
  Status st = cuda::launch_index_block_scores_fused(diq.ptr(), cache, dpos.ptr(), dtab.ptr(), T,
                                                    Hix, nb, dfused.ptr(), stream());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // kGemmScores's path over every block.
  static cuda::CachingAllocator alloc;
  static auto gemm = cuda::PrefillGemm::create(&alloc, 16 << 20);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  Dev<uint16_t> dkeys(std::vector<uint16_t>(static_cast<size_t>(nb * S * Dix)));
  Dev<float> dscores(std::vector<float>(static_cast<size_t>(T * Hix * nb * S)));
  auto dgemm = Dev<float>::poisoned(T * Hix * nb);
  st = cuda::launch_gather_index_keys(cache, dtab.ptr(), nb, dkeys.ptr(), stream());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  cuda::PrefillLinearParams lp;
  lp.x = diq.ptr();
  lp.ldx = Dix;
  lp.m = T * Hix;
  lp.w.format = cuda::QuantFormat::kBf16;
  lp.w.w = reinterpret_cast<const uint8_t*>(dkeys.ptr());
  lp.w.n = nb * S;
  lp.w.k = Dix;
  lp.y = dscores.ptr();
  lp.ldy = nb * S;
  lp.out = cuda::PrefillOut::kF32;
  st = (*gemm)->linear(lp, stream());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  st = cuda::launch_index_maxpool(dscores.ptr(), nb * S, nb, dpos.ptr(), dtab.ptr(), pages, T, Hix,
                                  nb, dgemm.ptr(), stream());
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const auto fused = dfused.host(), viagemm = dgemm.host();

  std::vector<float> got, want, other;
  std::vector<double> bound, bound2;
  int64_t neg = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hix; ++h)
      for (int64_t b = 0; b < nb; ++b) {
        const size_t idx = static_cast<size_t>((t * Hix + h) * nb + b);
        double best = -INFINITY, mag = 0;
        if (b <= pos[t] / S && table[b] >= 0) {
          for (int64_t j = b * S; j < std::min<int64_t>((b + 1) * S, pos[t] + 1); ++j) {
            const float* kr = ikf.data() + (table[b] * S + j % S) * Dix;
            double s = 0, a = 0;
            for (int64_t i = 0; i < Dix; ++i) {
              s += double(iqf[(t * Hix + h) * Dix + i]) * kr[i];
              a += std::abs(double(iqf[(t * Hix + h) * Dix + i]) * kr[i]);
            }
            best = std::max(best, s);
            mag = std::max(mag, a);
          }
        }
        if (std::isinf(best)) {
          ASSERT_TRUE(std::isinf(fused[idx]) && fused[idx] < 0)
              << "t " << t << " h " << h << " block " << b << ": " << fused[idx];
          ASSERT_TRUE(std::isinf(viagemm[idx]) && viagemm[idx] < 0) << "t " << t << " b " << b;
          ++neg;
          continue;
        }
        got.push_back(fused[idx]);
        want.push_back(static_cast<float>(best));
        other.push_back(viagemm[idx]);
        bound.push_back(2 * gamma(Dix + 2) * mag + 1e-30);
        bound2.push_back(4 * gamma(Dix + 2) * mag + 1e-30);
      }
  std::printf("[ %-40s ] %lld -inf entries match\n", "prefill indexer v2 block scores",
              (long long)neg);
  expect_close(got, want, bound, "indexer v2 block scores vs cpu");
  std::vector<float> wantd(other.begin(), other.end());
  expect_close(got, wantd, bound2, "indexer v2 vs v1 block scores");
}

}  // namespace
}  // namespace m3::cuda_test

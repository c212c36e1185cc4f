// The DSpark draft forward on the CPU backend: against the double-precision reference of
// dspark_reference.h, bidirectional in-block attention, the sliding window (and the pages it lets
// the cache release), the Markov correction and a caller's sampler, truncation, and input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dspark_reference.h"
#include "model/minimax_m3/dspark/dspark_attention.h"
#include "model/minimax_m3/dspark/dspark_draft.h"

namespace m3 {
namespace {

using minimax_m3::dspark::DSparkConfig;
using minimax_m3::dspark::DSparkContextCache;
using minimax_m3::dspark::DSparkDraft;
using minimax_m3::dspark::DSparkProposal;
using minimax_m3::dspark::TargetSharedWeights;

const std::string kPrefix = "language_model.model.dspark.";
const std::string kEmbed = "language_model.model.embed_tokens.weight";
const std::string kLmHead = "language_model.lm_head.weight";

struct DraftHarness {
  MiniMaxM3Config target_cfg = testing::dspark_target_config();
  testing::MemoryWeightSource target_src = testing::random_weights(target_cfg, 11);
  DSparkConfig cfg;
  testing::MemoryWeightSource src;
  CpuBackend backend{2};
  std::unique_ptr<DSparkDraft> draft;

  explicit DraftHarness(const DSparkConfig& c = testing::tiny_dspark_config(), uint32_t seed = 5)
      : cfg(c), src(testing::random_dspark_weights(c, seed)) {
    auto shared = TargetSharedWeights::load(target_src, target_cfg, &backend);
    EXPECT_TRUE(shared.is_ok()) << shared.status().to_string();
    if (!shared.is_ok()) return;
    auto d =
        DSparkDraft::load(cfg, target_cfg, src, "test draft", std::move(shared).value(), &backend);
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    if (d.is_ok()) draft = std::move(d).value();
  }

  // A cache holding `features` [n, width], appended in chunks of the given sizes (summing to n).
  std::unique_ptr<DSparkContextCache> cache_with(const std::vector<float>& features, int64_t n,
                                                 std::vector<int64_t> chunks = {},
                                                 int64_t page_size = 128) {
    auto cache = draft->new_cache(page_size);
    if (chunks.empty()) chunks = {n};
    const int64_t w = draft->config().feature_width();
    int64_t at = 0;
    for (int64_t c : chunks) {
      Status st = draft->append_context(
          std::span<const float>(features.data() + at * w, static_cast<size_t>(c * w)), c,
          cache.get());
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      at += c;
    }
    EXPECT_EQ(at, n);
    EXPECT_EQ(cache->length(), n);
    return cache;
  }

  DSparkProposal propose(int32_t anchor, DSparkContextCache& cache,
                         const minimax_m3::dspark::DraftSampler& sampler = {}) {
    auto r = draft->propose(anchor, cache, sampler);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? std::move(r).value() : DSparkProposal{};
  }
};

bool bitwise_equal(const DSparkProposal& a, const DSparkProposal& b) {
  return a.tokens == b.tokens && a.logits == b.logits && a.base_logits == b.base_logits &&
         a.anchor_position == b.anchor_position;
}

// Largest |a - b| over slot `slot`'s row of [B, V] logits.
double max_slot_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t slot,
                     int64_t vocab) {
  double m = 0;
  for (int64_t i = slot * vocab; i < (slot + 1) * vocab; ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// Tolerance against the double reference. Error model: every float32 op is within a few units
// of roundoff u = 2^-24 of its exact value, and a dot product of length K adds at most K·u
// relative to the sum of the magnitudes of its terms (worst case, no cancellation). The longest
// reduction is fc's K = 3·64 = 192, so a stage adds <= 192·u ≈ 1.1e-5 relative. The path from
// the features to a logit has about 32 such stages (fc, hidden_norm, K/V, norms and RoPE; per
// layer q/k/v, attention's dot, softmax and sum, o_proj, norm, gate/up, SwiGLU, down, residual
// adds; final norm, lm_head, the Markov lookup and product). RMSNorm rescales the residual
// stream, so errors add per stage rather than compound: <= 32·1.1e-5 ≈ 3.7e-4 relative, taken
// against 1 + |logit| (the logits and the Markov bias are O(1) here). Observed: about 1e-6. A
// wrong mask, norm, RoPE pairing or position moves logits by O(0.1-1).
constexpr double kRelTol = 32 * 192 * 5.96e-8;

void expect_matches_reference(DraftHarness& hx, int64_t n, std::vector<int64_t> chunks,
                              int32_t anchor, uint32_t seed) {
  const DSparkConfig& c = hx.draft->config();
  const auto features = testing::random_features(n, c.feature_width(), seed);
  auto cache = hx.cache_with(features, n, chunks);
  DSparkProposal got = hx.propose(anchor, *cache);
  ASSERT_EQ(got.tokens.size(), static_cast<size_t>(c.block_size));
  EXPECT_EQ(got.anchor_position, n);
  const auto kv = testing::dspark_ref::context_kv(c, hx.src, kPrefix, features, n);
  const auto want = testing::dspark_ref::propose(c, hx.src, kPrefix, hx.target_src, kEmbed, kLmHead,
                                                 kv, n, anchor, got.tokens);
  const int64_t v = c.vocab_size;
  double worst = 0;
  for (int64_t k = 0; k < c.block_size; ++k) {
    int64_t ref_best = 0;
    for (int64_t i = 0; i < v; ++i) {
      const double tb = kRelTol * (1 + std::abs(want.base[k][i]));
      const double tl = kRelTol * (1 + std::abs(want.logits[k][i]));
      const double eb = std::abs(got.base_logits[k * v + i] - want.base[k][i]);
      const double el = std::abs(got.logits[k * v + i] - want.logits[k][i]);
      ASSERT_LE(eb, tb) << "base logit slot " << k << " token " << i << " (n = " << n << ")";
      ASSERT_LE(el, tl) << "corrected logit slot " << k << " token " << i << " (n = " << n << ")";
      worst = std::max({worst, eb, el});
      if (want.logits[k][i] > want.logits[k][ref_best]) ref_best = i;
    }
    // Greedy drafting takes the corrected argmax, unless the reference's top two are within the
    // tolerance of each other.
    const int32_t tok = got.tokens[static_cast<size_t>(k)];
    const double gap = want.logits[k][ref_best] - want.logits[k][tok];
    EXPECT_LE(gap, 2 * kRelTol * (1 + std::abs(want.logits[k][ref_best]))) << "slot " << k;
  }
  std::printf("n = %lld: max |float32 - reference| = %.3g\n", static_cast<long long>(n), worst);
}

TEST(DSparkForward, MatchesReference) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  // No context; context inside the window; a context longer than the 16-position window,
  // appended in three chunks.
  expect_matches_reference(hx, 0, {}, 17, 1);
  expect_matches_reference(hx, 5, {}, 4000, 2);
  expect_matches_reference(hx, 40, {9, 1, 30}, 123, 3);
}

TEST(DSparkForward, MarkovCorrectionIsSequential) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  const DSparkConfig& c = hx.draft->config();
  const int64_t n = 12, v = c.vocab_size, r = c.markov_rank;
  auto cache = hx.cache_with(testing::random_features(n, c.feature_width(), 4), n);
  // A sampler that takes the second-best token: the chain must follow its choices.
  std::vector<int64_t> slots;
  auto second_best = [&](std::span<const float> logits, int64_t slot) {
    slots.push_back(slot);
    int32_t best = minimax_m3::dspark::greedy_token(logits), second = best == 0 ? 1 : 0;
    for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i)
      if (i != best && logits[i] > logits[second]) second = i;
    return second;
  };
  const int32_t anchor = 77;
  DSparkProposal got = hx.propose(anchor, *cache, second_best);
  EXPECT_EQ(slots, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  const std::vector<float>& w1 = hx.src.get(kPrefix + "markov_head.markov_w1.weight");
  const std::vector<float>& w2 = hx.src.get(kPrefix + "markov_head.markov_w2.weight");
  int32_t prev = anchor;
  for (int64_t k = 0; k < c.block_size; ++k) {
    // logits_k - base_k = markov_w2 · markov_w1[prev], prev = anchor, then the sampled drafts.
    double moved = 0;
    for (int64_t i = 0; i < v; ++i) {
      double bias = 0;
      for (int64_t j = 0; j < r; ++j) bias += static_cast<double>(w2[i * r + j]) * w1[prev * r + j];
      const double delta = static_cast<double>(got.logits[k * v + i]) - got.base_logits[k * v + i];
      // One float32 dot of length r = 8 plus one add, on O(1) values.
      ASSERT_NEAR(delta, bias, 1e-5 * (1 + std::abs(got.base_logits[k * v + i])))
          << "slot " << k << " token " << i;
      moved = std::max(moved, std::abs(bias));
    }
    EXPECT_GT(moved, 0.1) << "the Markov term must matter in this test";
    const std::span<const float> row(got.logits.data() + k * v, static_cast<size_t>(v));
    EXPECT_EQ(got.tokens[k], second_best(row, k));
    EXPECT_NE(got.tokens[k], minimax_m3::dspark::greedy_token(row));
    prev = got.tokens[k];
  }
  // The base logits do not depend on the sampler; the corrected ones do from slot 1 on.
  auto cache2 = hx.cache_with(testing::random_features(n, c.feature_width(), 4), n);
  DSparkProposal greedy = hx.propose(anchor, *cache2);
  EXPECT_EQ(greedy.base_logits, got.base_logits);
  EXPECT_EQ(max_slot_diff(greedy.logits, got.logits, 0, v), 0.0);
  EXPECT_GT(max_slot_diff(greedy.logits, got.logits, 1, v), 1e-3);
}

TEST(DSparkForward, BlockAttentionIsBidirectional) {
  // Slot 0 is the earliest position of the block; under a causal mask it would not see the noise
  // slots. Changing the noise token (slots 1..6 only) must change slot 0's output.
  DSparkConfig other = testing::tiny_dspark_config();
  other.noise_token_id = 3;
  DraftHarness a, b(other);
  ASSERT_TRUE(a.draft && b.draft);
  const int64_t n = 10, v = a.cfg.vocab_size;
  const auto f = testing::random_features(n, a.draft->config().feature_width(), 6);
  auto ca = a.cache_with(f, n), cb = b.cache_with(f, n);
  DSparkProposal pa = a.propose(9, *ca), pb = b.propose(9, *cb);
  EXPECT_GT(max_slot_diff(pa.base_logits, pb.base_logits, 0, v), 1e-3);

  // The same on the attention alone: perturbing the last slot's K/V changes the first slot's
  // output, and every slot's.
  const int64_t blk = 7, nh = 4, hkv = 2, d = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0, 1);
  std::vector<float> q(blk * nh * d), k(blk * hkv * d), vv(blk * hkv * d);
  for (auto* x : {&q, &k, &vv})
    for (float& e : *x) e = dist(rng);
  auto run = [&](const std::vector<float>& kk, const std::vector<float>& vals) {
    std::vector<float> out(blk * nh * d);
    minimax_m3::dspark::BlockAttentionParams p;
    p.q = q.data();
    p.block_k = kk.data();
    p.block_v = vals.data();
    p.cache.num_kv_heads = hkv;
    p.cache.head_dim = d;
    p.cache.page_size = 128;
    p.anchor_pos = 0;  // no context
    p.block = blk;
    p.num_heads = nh;
    p.window = 16;
    p.scale = 0.25f;
    p.out = out.data();
    minimax_m3::dspark::block_attention(p);
    return out;
  };
  const auto base = run(k, vv);
  auto k2 = k, v2 = vv;
  for (int64_t i = (blk - 1) * hkv * d; i < blk * hkv * d; ++i) {
    k2[i] += 1.0f;
    v2[i] += 1.0f;
  }
  const auto moved = run(k2, v2);
  for (int64_t s = 0; s < blk; ++s) {
    double m = 0;
    for (int64_t i = s * nh * d; i < (s + 1) * nh * d; ++i)
      m = std::max(m, std::abs(static_cast<double>(moved[i]) - base[i]));
    EXPECT_GT(m, 1e-3) << "slot " << s << " does not see the last slot";
  }
}

TEST(DSparkForward, ContextOutsideTheWindowHasNoEffect) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  const DSparkConfig& c = hx.draft->config();
  const int64_t n = 40, w = c.feature_width(), v = c.vocab_size;
  // Slot k at position n + k reads context positions >= n + k - W + 1 >= n - W + 1 = 25.
  const int64_t first_seen = n - c.sliding_window + 1;
  const auto f = testing::random_features(n, w, 7);
  auto g = f;
  for (int64_t i = 0; i < first_seen * w; ++i) g[i] = -3.0f * g[i] + 1.0f;
  auto cf = hx.cache_with(f, n), cg = hx.cache_with(g, n);
  const DSparkProposal pf = hx.propose(5, *cf), pg = hx.propose(5, *cg);
  EXPECT_TRUE(bitwise_equal(pf, pg));
  // The first position inside the window does matter.
  auto h = f;
  for (int64_t i = first_seen * w; i < (first_seen + 1) * w; ++i) h[i] = -3.0f * h[i] + 1.0f;
  auto ch = hx.cache_with(h, n);
  EXPECT_GT(max_slot_diff(pf.base_logits, hx.propose(5, *ch).base_logits, 0, v), 1e-4);
}

TEST(DSparkForward, ReleasedPagesDoNotChangeTheDraft) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  const DSparkConfig& c = hx.draft->config();
  const int64_t n = 100;
  const auto f = testing::random_features(n, c.feature_width(), 8);
  // Pages of 4 positions: a 16-position window lets most of them go; one page of 128 keeps all.
  auto small = hx.cache_with(f, n, {1, 7, 30, 62}, 4);
  auto whole = hx.cache_with(f, n, {}, 128);
  EXPECT_LE(small->pages_in_use(), small->capacity_pages());
  EXPECT_EQ(small->capacity_pages(), 16 / 4 + 3);
  EXPECT_GT(small->first_held_position(), 0);
  EXPECT_TRUE(bitwise_equal(hx.propose(42, *small), hx.propose(42, *whole)));
  // Rolling back within a page is allowed; rolling back to where the window was released is
  // refused, and changes nothing.
  Status far = small->truncate(40);
  EXPECT_FALSE(far.is_ok());
  EXPECT_NE(far.message().find("released"), std::string::npos) << far.message();
  EXPECT_EQ(small->length(), n);
  EXPECT_TRUE(small->truncate(n - 4).is_ok());
  EXPECT_FALSE(small->truncate(n).is_ok()) << "growing by truncate";
}

TEST(DSparkForward, TruncateThenAppendEqualsAFreshCache) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  const DSparkConfig& c = hx.draft->config();
  const int64_t w = c.feature_width();
  const auto f = testing::random_features(38, w, 9);
  auto rejected = testing::random_features(8, w, 10);
  // Commit 30 positions; then a verify's 8 rows of which only 3 are accepted: roll back to 33.
  auto cache = hx.cache_with(f, 30, {}, 8);
  const DSparkProposal before = hx.propose(11, *cache);
  ASSERT_TRUE(hx.draft->append_context(rejected, 8, cache.get()).is_ok());
  ASSERT_TRUE(cache->truncate(30).is_ok());
  EXPECT_TRUE(bitwise_equal(before, hx.propose(11, *cache)));
  ASSERT_TRUE(
      hx.draft->append_context(std::span<const float>(f.data() + 30 * w, 8 * w), 8, cache.get())
          .is_ok());
  auto fresh = hx.cache_with(f, 38, {}, 8);
  EXPECT_TRUE(bitwise_equal(hx.propose(12, *cache), hx.propose(12, *fresh)));
  ASSERT_TRUE(cache->truncate(0).is_ok());
  auto empty = hx.draft->new_cache(4);
  EXPECT_TRUE(bitwise_equal(hx.propose(13, *cache), hx.propose(13, *empty)));
}

TEST(DSparkForward, BadInputIsRefused) {
  DraftHarness hx;
  ASSERT_TRUE(hx.draft);
  const DSparkConfig& c = hx.draft->config();
  auto cache = hx.draft->new_cache();
  auto bad_anchor = hx.draft->propose(static_cast<int32_t>(c.vocab_size), *cache);
  ASSERT_FALSE(bad_anchor.is_ok());
  EXPECT_NE(bad_anchor.status().message().find("anchor token 4096"), std::string::npos);
  auto bad_sampler =
      hx.draft->propose(1, *cache, [](std::span<const float>, int64_t) { return -1; });
  ASSERT_FALSE(bad_sampler.is_ok());
  EXPECT_NE(bad_sampler.status().message().find("sampler returned token -1"), std::string::npos);
  std::vector<float> f(static_cast<size_t>(c.feature_width() * 2 - 1));
  Status st = hx.draft->append_context(f, 2, cache.get());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("feature values"), std::string::npos) << st.message();
  EXPECT_EQ(cache->length(), 0);
}

}  // namespace
}  // namespace m3

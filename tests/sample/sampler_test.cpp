// Each sampling knob against a direct computation written independently of the sampler: full
// sort, normalised probabilities, the textbook definitions.
#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace m3 {
namespace {

SampleResult run(const std::vector<float>& logits, const SamplingParams& p, RngKey key = {},
                 const PenaltyState* pen = nullptr, std::vector<int32_t> min_mask = {}) {
  SamplerScratch scratch;
  SampleInput in;
  in.logits = logits;
  in.params = &p;
  in.penalties = pen;
  in.min_tokens_mask = min_mask;
  in.rng = key;
  return sample_token(in, &scratch);
}

// Reference: the kept set and the pick, from the definitions.
int32_t reference_pick(std::vector<float> z, const SamplingParams& p, double u) {
  const int32_t v = static_cast<int32_t>(z.size());
  for (float& x : z) x /= p.temperature;
  double mx = *std::max_element(z.begin(), z.end());
  std::vector<double> prob(v);
  double s = 0;
  for (int32_t i = 0; i < v; ++i) s += (prob[i] = std::exp(z[i] - mx));
  for (auto& x : prob) x /= s;
  std::vector<int32_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
  });
  int32_t keep = (p.top_k > 0 && p.top_k < v) ? p.top_k : v;
  double mass = 0;
  for (int32_t i = 0; i < keep; ++i) mass += prob[order[i]];
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int32_t i = 0; i < keep; ++i) {
      cum += prob[order[i]] / mass;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::vector<double> kept(v, 0.0);
  const double pmax = prob[order[0]];
  for (int32_t i = 0; i < keep; ++i) {
    if (prob[order[i]] >= p.min_p * pmax) kept[order[i]] = prob[order[i]];
  }
  const double total = std::accumulate(kept.begin(), kept.end(), 0.0);
  double cum = 0;
  int32_t last = -1;
  for (int32_t t = 0; t < v; ++t) {
    if (kept[t] == 0) continue;
    cum += kept[t];
    last = t;
    if (cum > u * total) return t;
  }
  return last;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(run({1.0f, 3.0f, 2.0f, 3.0f}, p).token, 1);
  p.temperature = 1e-6f;  // below the greedy threshold
  EXPECT_EQ(run({1.0f, 3.0f, 2.0f, 3.5f}, p).token, 3);
}

TEST(Sampler, MatchesReferenceOnRandomLogitsAndKnobs) {
  std::mt19937 rng(123);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int num_distinct = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int32_t v = 2 + rng() % 300;
    std::vector<float> logits(v);
    for (auto& x : logits) x = normal(rng);
    SamplingParams p;
    p.temperature = 0.2f + (rng() % 100) / 40.0f;
    p.top_k = (rng() % 3 == 0) ? 0 : 1 + rng() % v;
    p.top_p = (rng() % 3 == 0) ? 1.0f : 0.05f + (rng() % 95) / 100.0f;
    p.min_p = (rng() % 3 == 0) ? 0.0f : (rng() % 50) / 100.0f;
    RngKey key{rng(), rng() % 4, rng() % 1000};
    const int32_t got = run(logits, p, key).token;
    const int32_t want = reference_pick(logits, p, uniform01(key));
    ASSERT_EQ(got, want) << "trial " << trial << " V=" << v << " T=" << p.temperature
                         << " top_k=" << p.top_k << " top_p=" << p.top_p
                         << " min_p=" << p.min_p;
    num_distinct += got != 0;
  }
  EXPECT_GT(num_distinct, 1000);  // not degenerate
}

TEST(Sampler, LargeVocabTopPUsesGrowingPartialSortCorrectly) {
  // > 1024 candidates in the top_p set forces the prefix to grow.
  std::mt19937 rng(5);
  std::vector<float> logits(50000);
  for (auto& x : logits) x = static_cast<float>(rng() % 1000) / 1000.0f;
  SamplingParams p;
  p.top_p = 0.9f;
  for (uint64_t c = 0; c < 20; ++c) {
    RngKey key{42, 0, c};
    EXPECT_EQ(run(logits, p, key).token, reference_pick(logits, p, uniform01(key)));
  }
  p.top_k = 3000;
  for (uint64_t c = 0; c < 20; ++c) {
    RngKey key{43, 0, c};
    EXPECT_EQ(run(logits, p, key).token, reference_pick(logits, p, uniform01(key)));
  }
}

TEST(Sampler, TopKOneIsGreedyAndMinPOneKeepsOnlyTheMax) {
  std::vector<float> logits{0.5f, 2.0f, 1.9f, -1.0f};
  SamplingParams p;
  p.top_k = 1;
  for (uint64_t c = 0; c < 50; ++c) EXPECT_EQ(run(logits, p, {7, 0, c}).token, 1);
  p.top_k = 0;
  p.min_p = 1.0f;
  for (uint64_t c = 0; c < 50; ++c) EXPECT_EQ(run(logits, p, {7, 0, c}).token, 1);
}

TEST(Sampler, EmpiricalFrequenciesMatchSoftmax) {
  // 20000 draws; each frequency within 5 standard deviations sqrt(p(1-p)/N) of softmax(z / T).
  std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f};
  SamplingParams p;
  p.temperature = 1.5f;
  const int n = 20000;
  std::vector<int> count(4, 0);
  for (int i = 0; i < n; ++i) ++count[run(logits, p, {99, 0, static_cast<uint64_t>(i)}).token];
  double s = 0;
  for (float x : logits) s += std::exp(x / 1.5);
  for (int t = 0; t < 4; ++t) {
    const double want = std::exp(logits[t] / 1.5) / s;
    const double sd = std::sqrt(want * (1 - want) / n);
    EXPECT_NEAR(count[t] / static_cast<double>(n), want, 5 * sd) << "token " << t;
  }
}

TEST(Sampler, SameKeySameTokenDifferentStreamsDiffer) {
  std::vector<float> logits(64, 0.0f);  // uniform: every token equally likely
  SamplingParams p;
  std::vector<int32_t> a, b, c;
  for (uint64_t i = 0; i < 32; ++i) {
    a.push_back(run(logits, p, {1234, 0, i}).token);
    b.push_back(run(logits, p, {1234, 0, i}).token);
    c.push_back(run(logits, p, {1234, 1, i}).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  std::vector<float> logits{2.0f, -1.0f, 0.5f, 3.0f};
  PenaltyState st;
  std::vector<int32_t> prompt{0, 1};
  st.set_prompt(prompt);
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  std::vector<float> z = logits;
  apply_penalties(z, p, st);
  EXPECT_EQ(z, (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}));
  st.add_output(3);
  st.add_output(3);  // counted once for repetition
  z = logits;
  apply_penalties(z, p, st);
  EXPECT_EQ(z, (std::vector<float>{1.0f, -2.0f, 0.5f, 1.5f}));
}

TEST(Sampler, PresenceAndFrequencyPenaltiesFollowOpenAI) {
  std::vector<float> logits{1.0f, 1.0f, 1.0f};
  PenaltyState st;
  std::vector<int32_t> prompt{2, 2, 2};  // prompt tokens do not count for presence/frequency
  st.set_prompt(prompt);
  st.add_output(0);
  st.add_output(0);
  st.add_output(1);
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> z = logits;
  apply_penalties(z, p, st);
  // token 0: 1 - 0.5 - 2 * 0.25 = 0; token 1: 1 - 0.5 - 0.25 = 0.25; token 2 untouched.
  EXPECT_FLOAT_EQ(z[0], 0.0f);
  EXPECT_FLOAT_EQ(z[1], 0.25f);
  EXPECT_FLOAT_EQ(z[2], 1.0f);
  // Greedy picks the unpenalised token.
  p.temperature = 0;
  EXPECT_EQ(run(logits, p, {}, &st).token, 2);
}

TEST(Sampler, LogitBiasIsAddedBeforeSampling) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 5.0f}};
  EXPECT_EQ(run({1.0f, 4.0f, 2.0f}, p).token, 0);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(run({1.0f, 4.0f, 2.0f}, p).token, 2);
}

TEST(Sampler, MinTokensMasksEosUntilReached) {
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  PenaltyState st;
  std::vector<float> logits{0.0f, 5.0f, 1.0f};  // 1 = EOS is the argmax
  EXPECT_EQ(run(logits, p, {}, &st, {1}).token, 2);
  st.add_output(2);
  EXPECT_EQ(run(logits, p, {}, &st, {1}).token, 2);
  st.add_output(2);
  EXPECT_EQ(run(logits, p, {}, &st, {1}).token, 1);
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0.5f;  // processing must not change reported logprobs
  p.repetition_penalty = 3.0f;
  p.logprobs = true;
  p.top_logprobs = 3;
  PenaltyState st;
  st.add_output(1);
  SampleResult r = run(logits, p, {1, 0, 0}, &st);
  double lse = 0;
  for (float x : logits) lse += std::exp(static_cast<double>(x));
  lse = std::log(lse);
  EXPECT_NEAR(r.logprob, logits[r.token] - lse, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);  // tie 1 vs 3: lower id first
  EXPECT_EQ(r.top_logprobs[1].token, 3);
  EXPECT_EQ(r.top_logprobs[2].token, 2);
  EXPECT_NEAR(r.top_logprobs[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(r.top_logprobs[2].logprob, 2.0 - lse, 1e-6);
}

TEST(Sampler, AllMaskedIsAnInternalErrorNotACrash) {
  SamplingParams p;
  p.min_tokens = 1;
  PenaltyState st;
  EXPECT_THROW(run({0.0f, 0.0f}, p, {}, &st, {0, 1}), InternalError);
  p.temperature = 0;  // greedy too
  EXPECT_THROW(run({0.0f, 0.0f}, p, {}, &st, {0, 1}), InternalError);
}

}  // namespace
}  // namespace m3

// verify_draft (sample/speculative_verify.h) on the worked examples of block verification (Sun et
// al. 2024), edge cases, and the exact law of the emitted tokens, by Monte Carlo over the
// uniforms with fixed seeds.
#include "sample/speculative_verify.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "sample/sampler.h"

namespace m3 {
namespace {

using Dist = std::vector<double>;

struct Mc {
  std::mt19937_64 rng{12345};
  std::uniform_real_distribution<double> u{0.0, 1.0};
  VerifyUniforms uniforms() {
    VerifyUniforms v;
    v.accept = [this](int32_t) { return u(rng); };
    v.residual = [this] { return u(rng); };
    return v;
  }
};

int32_t draw(const Dist& d, double u) {
  return draw_from_mass(d, 1.0, u);
}

// Expected accepted drafts over drafts drawn from q, with p and q the same at every position
// (a context-free binary example: BV's M_b(a) = 1/3, M_s(a) = 2/3, γ = 2).
double mean_accepted(VerifyMethod m, int64_t runs) {
  const Dist p = {1.0 / 3, 2.0 / 3}, q = {2.0 / 3, 1.0 / 3};
  Mc mc;
  double sum = 0;
  for (int64_t r = 0; r < runs; ++r) {
    std::vector<int32_t> x = {draw(q, mc.u(mc.rng)), draw(q, mc.u(mc.rng))};
    sum += verify_draft(m, x, std::vector<Dist>{q, q}, std::vector<Dist>{p, p, p}, mc.uniforms())
               .num_accepted;
  }
  return sum / static_cast<double>(runs);
}

TEST(SpeculativeVerify, BlockBeatsTokenWiseOnThePapersExample) {
  const int64_t runs = 200000;  // standard error of a mean below 0.002
  EXPECT_NEAR(mean_accepted(VerifyMethod::kTokenWise, runs), 10.0 / 9, 0.01);
  EXPECT_NEAR(mean_accepted(VerifyMethod::kBlock, runs), 11.0 / 9, 0.01);
}

TEST(SpeculativeVerify, WorkedExampleOfTwoDraftsOverThreeTokens) {
  // Vocabulary {A, B, C}; X_1 = A. Position 2 (given A): p_2 = (.1, .8, .1), q_2 = (.3, .4, .3).
  const Dist p1 = {.3, .5, .2}, q1 = {.6, .2, .2}, p2 = {.1, .8, .1}, q2 = {.3, .4, .3};
  const Dist p3 = {1.0 / 3, 1.0 / 3, 1.0 / 3};
  Mc mc;
  // X_2 = B: ρ_2 = 1, τ = 2 with certainty under block verification.
  for (int i = 0; i < 1000; ++i) {
    auto r = verify_draft(VerifyMethod::kBlock, std::vector<int32_t>{0, 1},
                          std::vector<Dist>{q1, q2}, std::vector<Dist>{p1, p2, p3}, mc.uniforms());
    ASSERT_EQ(r.num_accepted, 2);
  }
  // X_2 = A: block gives τ = 2 w.p. 1/6, never 1, else τ = 0 with Y = B; token-wise 1/6, 1/3, 1/2.
  const int runs = 120000;
  std::map<int, int> block, token;
  int block_y_not_b = 0;
  for (int i = 0; i < runs; ++i) {
    auto b = verify_draft(VerifyMethod::kBlock, std::vector<int32_t>{0, 0},
                          std::vector<Dist>{q1, q2}, std::vector<Dist>{p1, p2, p3}, mc.uniforms());
    ++block[b.num_accepted];
    if (b.num_accepted == 0 && b.next_token != 1) ++block_y_not_b;
    auto t = verify_draft(VerifyMethod::kTokenWise, std::vector<int32_t>{0, 0},
                          std::vector<Dist>{q1, q2}, std::vector<Dist>{p1, p2, p3}, mc.uniforms());
    ++token[t.num_accepted];
  }
  EXPECT_EQ(block[1], 0);
  EXPECT_EQ(block_y_not_b, 0);
  EXPECT_NEAR(block[2] / double(runs), 1.0 / 6, 0.006);
  EXPECT_NEAR(block[0] / double(runs), 5.0 / 6, 0.006);
  EXPECT_NEAR(token[2] / double(runs), 1.0 / 6, 0.006);
  EXPECT_NEAR(token[1] / double(runs), 1.0 / 3, 0.006);
  EXPECT_NEAR(token[0] / double(runs), 1.0 / 2, 0.006);
}

TEST(SpeculativeVerify, Edges) {
  Mc mc;
  const Dist p = {.2, .3, .5};
  for (VerifyMethod m : {VerifyMethod::kTokenWise, VerifyMethod::kBlock}) {
    // q = p: every draft is accepted.
    for (int i = 0; i < 200; ++i) {
      std::vector<int32_t> x = {draw(p, mc.u(mc.rng)), draw(p, mc.u(mc.rng)),
                                draw(p, mc.u(mc.rng))};
      auto r = verify_draft(m, x, std::vector<Dist>(3, p), std::vector<Dist>(4, p), mc.uniforms());
      ASSERT_EQ(r.num_accepted, 3);
    }
    // Disjoint supports: nothing accepted, Y from p_1's support.
    const Dist q = {1.0, 0.0, 0.0}, pd = {0.0, .4, .6};
    for (int i = 0; i < 200; ++i) {
      auto r = verify_draft(m, std::vector<int32_t>{0, 0}, std::vector<Dist>{q, q},
                            std::vector<Dist>{pd, pd, pd}, mc.uniforms());
      ASSERT_EQ(r.num_accepted, 0);
      ASSERT_NE(r.next_token, 0);
    }
    // One-hot p and q (greedy): accept while equal, then the target's argmax.
    const Dist a = {1, 0, 0}, b = {0, 1, 0}, c = {0, 0, 1};
    auto r = verify_draft(m, std::vector<int32_t>{0, 1, 2}, std::vector<Dist>{a, b, c},
                          std::vector<Dist>{a, b, b, a}, mc.uniforms());
    EXPECT_EQ(r.num_accepted, 2);
    EXPECT_EQ(r.next_token, 1);
    // Tiny ratios over 7 drafts do not underflow into a wrong answer.
    const Dist lo = {1e-300, 1 - 1e-300, 0}, hi = {1 - 1e-300, 1e-300, 0};
    r = verify_draft(m, std::vector<int32_t>(7, 0), std::vector<Dist>(7, hi),
                     std::vector<Dist>(8, lo), mc.uniforms());
    EXPECT_EQ(r.num_accepted, 0);
    EXPECT_EQ(r.next_token, 1);
  }
}

}  // namespace
}  // namespace m3

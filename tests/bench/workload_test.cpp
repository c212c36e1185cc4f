// Workload lengths and ids stay in their ranges; Poisson arrivals have the statistics of a
// Poisson process (bounds derived from the sampling distribution, 5 standard deviations).
#include "bench/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace m3::bench {
namespace {

TEST(bench_workload, RandomLengthsCoverTheRangeAndNoMore) {
  WorkloadOptions o;
  o.num_prompts = 1000;
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.5;
  o.vocab_size = 300;
  auto w = make_workload(o);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 1000u);
  int min_in = 1 << 30, max_in = 0, min_out = 1 << 30, max_out = 0;
  for (const BenchRequest& r : *w) {
    ASSERT_GE(r.input_len, 50);
    ASSERT_LE(r.input_len, 100);
    ASSERT_GE(r.output_len, 10);
    ASSERT_LE(r.output_len, 20);
    ASSERT_EQ(r.prompt_ids.size(), static_cast<size_t>(r.input_len));
    for (int32_t id : r.prompt_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 300);
    }
    min_in = std::min(min_in, r.input_len);
    max_in = std::max(max_in, r.input_len);
    min_out = std::min(min_out, r.output_len);
    max_out = std::max(max_out, r.output_len);
  }
  // Each end of [50, 100] is missed by 1000 uniform draws with probability (50/51)^1000 < 1e-8.
  EXPECT_EQ(min_in, 50);
  EXPECT_EQ(max_in, 100);
  EXPECT_EQ(min_out, 10);
  EXPECT_EQ(max_out, 20);
}

TEST(bench_workload, RatioZeroAndFixedAreExact) {
  WorkloadOptions o;
  o.num_prompts = 50;
  o.input_len = 32;
  o.output_len = 8;
  for (DatasetKind kind : {DatasetKind::kRandom, DatasetKind::kFixed}) {
    o.dataset = kind;
    o.range_ratio = kind == DatasetKind::kFixed ? 0.9 : 0.0;  // fixed ignores the ratio
    auto w = make_workload(o);
    ASSERT_TRUE(w.is_ok());
    std::set<std::vector<int32_t>> distinct;
    for (const BenchRequest& r : *w) {
      EXPECT_EQ(r.input_len, 32);
      EXPECT_EQ(r.output_len, 8);
      distinct.insert(r.prompt_ids);
    }
    EXPECT_EQ(distinct.size(), 50u);  // distinct prompts: no prefix-cache shortcut
  }
}

TEST(bench_workload, FullRatioReachesOneToken) {
  WorkloadOptions o;
  o.num_prompts = 2000;
  o.input_len = 4;
  o.output_len = 4;
  o.range_ratio = 1.0;
  auto w = make_workload(o);
  ASSERT_TRUE(w.is_ok());
  std::set<int> lens;
  for (const BenchRequest& r : *w) lens.insert(r.input_len);
  EXPECT_EQ(lens, (std::set<int>{1, 2, 3, 4}));
}

TEST(bench_workload, TextPromptsHaveInputLenWords) {
  WorkloadOptions o;
  o.num_prompts = 20;
  o.input_len = 16;
  o.output_len = 4;
  o.token_ids = false;
  auto w = make_workload(o);
  ASSERT_TRUE(w.is_ok());
  for (const BenchRequest& r : *w) {
    EXPECT_TRUE(r.prompt_ids.empty());
    std::istringstream in(r.prompt_text);
    int words = 0;
    for (std::string word; in >> word;) ++words;
    EXPECT_EQ(words, 16);
  }
}

TEST(bench_workload, SeedDeterminesTheWorkload) {
  WorkloadOptions o;
  o.num_prompts = 10;
  o.input_len = 64;
  o.output_len = 16;
  o.range_ratio = 0.5;
  auto a = make_workload(o), b = make_workload(o);
  o.seed = 2;
  auto c = make_workload(o);
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].prompt_ids, (*b)[i].prompt_ids);
  EXPECT_NE((*a)[0].prompt_ids, (*c)[0].prompt_ids);
}

TEST(bench_workload, BadOptionsNameTheFlag) {
  WorkloadOptions o;
  o.num_prompts = 0;
  auto w = make_workload(o);
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(w.status().message().find("--num-prompts"), std::string::npos);
  o.num_prompts = 1;
  o.range_ratio = 1.5;
  w = make_workload(o);
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(w.status().message().find("--random-range-ratio"), std::string::npos);
}

TEST(bench_arrivals, PoissonGapsHaveExponentialStatistics) {
  const int n = 20001;  // 20000 gaps
  const double rate = 4.0;
  const std::vector<double> t = poisson_arrivals(n, rate, 42);
  ASSERT_EQ(t.size(), static_cast<size_t>(n));
  EXPECT_EQ(t[0], 0.0);
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) {
    ASSERT_GE(t[i], t[i - 1]);
    gaps.push_back(t[i] - t[i - 1]);
  }
  const double m = static_cast<double>(gaps.size());
  double sum = 0;
  for (double g : gaps) sum += g;
  const double mean = sum / m;
  double sq = 0;
  for (double g : gaps) sq += (g - mean) * (g - mean);
  const double sd = std::sqrt(sq / m);
  // Exp(rate): mean 1/rate, sd 1/rate. The sample mean has sd (1/rate)/sqrt(m) = 0.0018.
  EXPECT_NEAR(mean, 1.0 / rate, 5 * (1.0 / rate) / std::sqrt(m));
  // The sample variance has relative sd sqrt((mu4/sigma^4 - 1)/m) = sqrt(8/m) = 0.02, so the
  // sd's is about 0.01; 5 of those, plus the mean's 5 x 0.007 relative slack: 0.09.
  EXPECT_NEAR(sd / mean, 1.0, 0.09);
  // P(gap > mean) = e^-1; the observed fraction has sd sqrt(p(1-p)/m) = 0.0034.
  int above = 0;
  for (double g : gaps) above += g > 1.0 / rate;
  const double p = std::exp(-1.0);
  EXPECT_NEAR(above / m, p, 5 * std::sqrt(p * (1 - p) / m));
  EXPECT_EQ(poisson_arrivals(n, rate, 42), t);  // the seed fixes the schedule
}

TEST(bench_arrivals, InfiniteRateSendsAllAtOnce) {
  const std::vector<double> t = poisson_arrivals(5, INFINITY, 1);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
}

}  // namespace
}  // namespace m3::bench

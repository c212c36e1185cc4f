// Percentiles and aggregates against values computed by hand (numpy's linear interpolation:
// rank = p/100 * (n-1)).
#include "bench/stats.h"

#include <gtest/gtest.h>

namespace m3::bench {
namespace {

// Sums of a few decimal fractions: exact up to a few ulps of the result.
constexpr double kEps = 1e-9;

TEST(bench_stats, PercentileInterpolatesBetweenRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_NEAR(percentile(v, 0), 1.0, kEps);
  EXPECT_NEAR(percentile(v, 50), 2.5, kEps);   // rank 1.5
  EXPECT_NEAR(percentile(v, 90), 3.7, kEps);   // rank 2.7
  EXPECT_NEAR(percentile(v, 99), 3.97, kEps);  // rank 2.97
  EXPECT_NEAR(percentile(v, 100), 4.0, kEps);
  EXPECT_NEAR(percentile({7.5}, 99), 7.5, kEps);
  EXPECT_EQ(percentile({}, 50), 0.0);
}

TEST(bench_stats, SummaryMeanStdAndExtremes) {
  const Summary s = summarize({1, 2, 3, 4});
  EXPECT_EQ(s.count, 4u);
  EXPECT_NEAR(s.mean, 2.5, kEps);
  EXPECT_NEAR(s.median, 2.5, kEps);
  EXPECT_NEAR(s.std, 1.118033988749895, kEps);  // sqrt(1.25): population std
  EXPECT_NEAR(s.p95, 3.85, kEps);               // rank 2.85
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.max, 4.0);
  const Summary empty = summarize({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.mean, 0.0);
}

RequestResult ok(int prompt, int output, double ttft, double latency, std::vector<double> itl) {
  RequestResult r;
  r.success = true;
  r.http_status = 200;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.itl_s = std::move(itl);
  return r;
}

TEST(bench_stats, AggregateCountsOnlySuccessfulRequests) {
  std::vector<RequestResult> rs;
  rs.push_back(ok(10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}));  // TPOT 0.4/4 = 100 ms
  rs.push_back(ok(20, 3, 0.2, 0.6, {0.2, 0.2}));            // TPOT 0.4/2 = 200 ms
  rs.push_back(ok(5, 1, 0.3, 0.3, {}));                     // one token: no TPOT
  RequestResult failed;
  failed.http_status = 500;
  failed.prompt_tokens = 30;
  failed.error = "boom";
  rs.push_back(failed);

  const Aggregate a = aggregate(rs, 2.0);
  EXPECT_EQ(a.completed, 3);
  EXPECT_EQ(a.failed, 1);
  EXPECT_EQ(a.total_input_tokens, 35);
  EXPECT_EQ(a.total_output_tokens, 9);
  EXPECT_NEAR(a.request_throughput, 1.5, kEps);
  EXPECT_NEAR(a.input_throughput, 17.5, kEps);
  EXPECT_NEAR(a.output_throughput, 4.5, kEps);
  EXPECT_NEAR(a.total_throughput, 22.0, kEps);
  EXPECT_NEAR(a.concurrency, 0.7, kEps);  // (0.5 + 0.6 + 0.3) / 2

  EXPECT_EQ(a.ttft_ms.count, 3u);
  EXPECT_NEAR(a.ttft_ms.mean, 200.0, kEps);
  EXPECT_NEAR(a.ttft_ms.median, 200.0, kEps);
  EXPECT_NEAR(a.ttft_ms.p99, 298.0, kEps);  // rank 1.98 of {100, 200, 300}

  EXPECT_EQ(a.tpot_ms.count, 2u);
  EXPECT_NEAR(a.tpot_ms.mean, 150.0, kEps);
  EXPECT_NEAR(a.tpot_ms.p90, 190.0, kEps);  // rank 0.9 of {100, 200}

  EXPECT_EQ(a.itl_ms.count, 6u);  // every gap of every request
  EXPECT_NEAR(a.itl_ms.mean, 800.0 / 6.0, kEps);
  EXPECT_NEAR(a.itl_ms.median, 100.0, kEps);  // rank 2.5 of {100 x4, 200 x2}
  EXPECT_NEAR(a.itl_ms.p90, 200.0, kEps);     // rank 4.5
  EXPECT_NEAR(a.itl_ms.max, 200.0, kEps);

  EXPECT_NEAR(a.e2e_ms.mean, 1400.0 / 3.0, kEps);
  EXPECT_NEAR(a.e2e_ms.median, 500.0, kEps);
}

TEST(bench_stats, AggregateOfNothingIsZeros) {
  const Aggregate a = aggregate({}, 0.0);
  EXPECT_EQ(a.completed, 0);
  EXPECT_EQ(a.request_throughput, 0.0);
  EXPECT_EQ(a.ttft_ms.mean, 0.0);
}

}  // namespace
}  // namespace m3::bench

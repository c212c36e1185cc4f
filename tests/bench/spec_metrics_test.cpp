// The speculative counters read from a /metrics body, and the run's summary from two reads.
#include "bench/spec_metrics.h"

#include <gtest/gtest.h>

namespace m3::bench {
namespace {

constexpr const char* kBefore = R"(# HELP m3serve:spec_draft_tokens_total Draft tokens verified by the target.
# TYPE m3serve:spec_draft_tokens_total counter
m3serve:spec_draft_tokens_total{model_name="m3-tiny"} 70
m3serve:spec_accepted_tokens_total{model_name="m3-tiny"} 30
# TYPE m3serve:spec_accept_length histogram
m3serve:spec_accept_length_bucket{model_name="m3-tiny",le="1"} 2
m3serve:spec_accept_length_bucket{model_name="m3-tiny",le="+Inf"} 10
m3serve:spec_accept_length_sum{model_name="m3-tiny"} 40
m3serve:spec_accept_length_count{model_name="m3-tiny"} 10
m3serve:num_requests_running{model_name="m3-tiny"} 0
)";

TEST(SpecMetrics, ParsesTheFourSeries) {
  const SpecCounters c = parse_spec_counters(kBefore);
  EXPECT_TRUE(c.present);
  EXPECT_EQ(c.verify_steps, 10);
  EXPECT_EQ(c.committed_tokens, 40);
  EXPECT_EQ(c.draft_tokens, 70);
  EXPECT_EQ(c.accepted_tokens, 30);
}

TEST(SpecMetrics, SumsSeriesAndSkipsQuotedBraces) {
  // Two label sets (e.g. DP ranks), a '}' inside a label value, CRLF line ends, another prefix.
  const SpecCounters c = parse_spec_counters(
      "sglang:spec_accept_length_sum{a=\"x}y\"} 6\r\n"
      "sglang:spec_accept_length_sum{a=\"z\"} 4\r\n"
      "sglang:spec_accept_length_count{a=\"x}y\"} 2\r\n"
      "sglang:spec_accept_length_count{a=\"z\"} 3\r\n");
  EXPECT_TRUE(c.present);
  EXPECT_EQ(c.committed_tokens, 10);
  EXPECT_EQ(c.verify_steps, 5);
}

TEST(SpecMetrics, AbsentWithoutTheHistogram) {
  EXPECT_FALSE(parse_spec_counters("").present);
  EXPECT_FALSE(parse_spec_counters("m3serve:num_requests_running 0\n").present);
  EXPECT_FALSE(parse_spec_counters("m3serve:spec_accept_length_sum nan\n").present);
  EXPECT_FALSE(spec_between(SpecCounters{}, parse_spec_counters("garbage {\n")).present);
}

TEST(SpecMetrics, TheRunIsTheDifference) {
  const SpecCounters before = parse_spec_counters(kBefore);
  SpecCounters after = before;
  after.verify_steps += 20;
  after.committed_tokens += 70;  // 50 accepted + 20 target tokens
  after.draft_tokens += 120;
  after.accepted_tokens += 50;
  const SpecSummary s = spec_between(before, after);
  ASSERT_TRUE(s.present);
  EXPECT_EQ(s.verify_steps, 20);
  EXPECT_EQ(s.draft_tokens, 120);
  EXPECT_EQ(s.accepted_tokens, 50);
  EXPECT_DOUBLE_EQ(s.mean_accept_length, 3.5);
  EXPECT_DOUBLE_EQ(s.acceptance_rate, 50.0 / 120.0);
  // No verify step in between: nothing to report.
  EXPECT_FALSE(spec_between(before, before).present);
  // A server whose first verify step came during the run exported nothing before it.
  const SpecSummary first = spec_between(SpecCounters{}, before);
  ASSERT_TRUE(first.present);
  EXPECT_DOUBLE_EQ(first.mean_accept_length, 4.0);
}

}  // namespace
}  // namespace m3::bench

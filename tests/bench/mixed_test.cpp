// --dataset mixed: the workload's shape, its flags, and the split of the streams' inter-token
// gaps into idle and loaded by the arriving prompts' in-flight intervals.
#include <gtest/gtest.h>

#include "bench/bench_command.h"
#include "bench/mixed_itl.h"
#include "bench/workload.h"

namespace m3::bench {
namespace {

TEST(bench_mixed, StreamsFirstThenTheLongPrompts) {
  WorkloadOptions o;
  o.dataset = DatasetKind::kMixed;
  o.mixed_streams = 3;
  o.num_prompts = 2;
  o.input_len = 7;
  o.output_len = 50;
  o.mixed_prompt_len = 300;
  o.mixed_prompt_output_len = 2;
  auto w = make_workload(o);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_EQ(w->size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const BenchRequest& r = (*w)[i];
    EXPECT_EQ(r.stream, i < 3) << i;
    EXPECT_EQ(r.input_len, i < 3 ? 7 : 300) << i;
    EXPECT_EQ(r.output_len, i < 3 ? 50 : 2) << i;
    EXPECT_EQ(r.prompt_ids.size(), static_cast<size_t>(r.input_len)) << i;
  }
  o.mixed_streams = 0;
  EXPECT_FALSE(make_workload(o).is_ok());
}

TEST(bench_mixed, Flags) {
  auto f = parse_bench_flags({"--dataset", "mixed", "--mixed-streams", "8", "--mixed-prompt-len",
                              "8192", "--mixed-prompt-output-len", "4", "--mixed-delay", "2.5",
                              "--num-prompts", "6", "--request-rate", "0.5"});
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->workload.dataset, DatasetKind::kMixed);
  EXPECT_EQ(f->workload.mixed_streams, 8);
  EXPECT_EQ(f->workload.mixed_prompt_len, 8192);
  EXPECT_EQ(f->workload.mixed_prompt_output_len, 4);
  EXPECT_DOUBLE_EQ(f->run.arrival_delay_s, 2.5);
  EXPECT_EQ(f->workload.num_prompts, 6);
  auto alone = parse_bench_flags({"--mixed-streams", "3"});
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find("--mixed-streams needs --dataset mixed"),
            std::string::npos);
  EXPECT_FALSE(parse_bench_flags({"--dataset", "mixed", "--mixed-delay", "-1"}).is_ok());
}

RequestResult stream(double start, double ttft, std::vector<double> gaps) {
  RequestResult r;
  r.success = true;
  r.start_s = start;
  r.ttft_s = ttft;
  r.itl_s = std::move(gaps);
  double e2e = ttft;
  for (double g : r.itl_s) e2e += g;
  r.latency_s = e2e;
  return r;
}

RequestResult arrival(double start, double latency) {
  RequestResult r;
  r.success = true;
  r.start_s = start;
  r.latency_s = latency;
  return r;
}

TEST(bench_mixed, GapsOverlappingAnArrivalAreLoaded) {
  // Stream chunks at 1.0, 1.1, 1.2, ..., 2.0 (ten gaps of 0.1 s); one arrival in flight over
  // [1.25, 1.45] and another over [1.44, 1.62]: merged [1.25, 1.62], overlapping the gaps
  // (1.2, 1.3], (1.3, 1.4], (1.4, 1.5], (1.5, 1.6], (1.6, 1.7]. A second stream whose one long
  // gap (1.0, 1.9] spans both.
  std::vector<RequestResult> rs;
  rs.push_back(stream(0.5, 0.5, std::vector<double>(10, 0.1)));
  rs.push_back(stream(0.0, 1.0, {0.9}));
  rs.push_back(arrival(1.25, 0.20));
  rs.push_back(arrival(1.44, 0.18));
  RequestResult failed = arrival(0.0, 10.0);
  failed.success = false;  // a failed arrival loads nothing
  rs.push_back(failed);
  const MixedItl m = split_itl_by_load(rs, 2);
  EXPECT_EQ(m.idle_ms.count, 5u);
  EXPECT_EQ(m.loaded_ms.count, 6u);
  EXPECT_NEAR(m.idle_ms.max, 100.0, 1e-6);
  EXPECT_NEAR(m.loaded_ms.max, 900.0, 1e-6);
  EXPECT_GT(m.p99_ratio, 8.0);
  EXPECT_NEAR(m.p99_ratio, m.loaded_ms.p99 / m.idle_ms.p99, 1e-12);
}

TEST(bench_mixed, NoArrivalMeansEveryGapIsIdle) {
  std::vector<RequestResult> rs = {stream(0.0, 0.1, {0.01, 0.02, 0.03})};
  const MixedItl m = split_itl_by_load(rs, 1);
  EXPECT_EQ(m.idle_ms.count, 3u);
  EXPECT_EQ(m.loaded_ms.count, 0u);
  EXPECT_EQ(m.p99_ratio, 0.0);  // undefined without both sides
}

}  // namespace
}  // namespace m3::bench

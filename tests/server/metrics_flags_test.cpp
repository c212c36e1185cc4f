#include <gtest/gtest.h>

#include "server/handlers/routes.h"
#include "server/metrics.h"

namespace m3::server {
namespace {

TEST(Metrics, RequiredNamesAndHistograms) {
  Metrics m("m3-tiny");
  m.time_to_first_token.observe(0.003);
  m.time_to_first_token.observe(0.3);
  m.inter_token_latency.observe(0.02);
  m.count_finished("stop");
  BackendStats s;
  s.num_requests_running = 3;
  s.num_requests_waiting = 2;
  s.kv_pages_used = 10;
  s.kv_pages_cached = 4;
  s.kv_pages_total = 100;
  s.prefix_cache_hit_tokens_total = 256;
  std::string text = m.render(s, true, false);
  for (const char* line :
       {"m3serve:num_requests_running{model_name=\"m3-tiny\"} 3",
        "m3serve:num_requests_waiting{model_name=\"m3-tiny\"} 2",
        "m3serve:kv_pages_used{model_name=\"m3-tiny\"} 10",
        "m3serve:kv_pages_cached{model_name=\"m3-tiny\"} 4",
        "m3serve:kv_pages_total{model_name=\"m3-tiny\"} 100",
        "m3serve:prefix_cache_hit_tokens_total{model_name=\"m3-tiny\"} 256",
        "# TYPE m3serve:time_to_first_token_seconds histogram",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.005\"} 1",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.25\"} 1",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"0.5\"} 2",
        "m3serve:time_to_first_token_seconds_bucket{model_name=\"m3-tiny\",le=\"+Inf\"} 2",
        "m3serve:time_to_first_token_seconds_count{model_name=\"m3-tiny\"} 2",
        "# TYPE m3serve:inter_token_latency_seconds histogram",
        "m3serve:request_success_total{model_name=\"m3-tiny\",finished_reason=\"stop\"} 1"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
}

// With attention data parallelism the KV pool and prefix-cache series are per DP rank, labelled
// dp_rank, and the unlabelled totals are not emitted (sum() over the ranks is the total); with one
// rank nothing is labelled.
TEST(Metrics, KvSeriesPerDpRank) {
  Metrics m("m3-tiny");
  BackendStats s;
  s.num_requests_running = 3;
  s.kv_pages_used = 30;
  s.kv_pages_total = 200;
  s.prefix_cache_hit_tokens_total = 256;
  s.num_preemptions_total = 2;
  s.dp_ranks = {{10, 4, 100, 256, 0}, {20, 0, 100, 0, 2}};
  const std::string text = m.render(s, true, false);
  for (const char* line :
       {"m3serve:num_requests_running{model_name=\"m3-tiny\"} 3",
        "m3serve:kv_pages_used{model_name=\"m3-tiny\",dp_rank=\"0\"} 10",
        "m3serve:kv_pages_used{model_name=\"m3-tiny\",dp_rank=\"1\"} 20",
        "m3serve:kv_pages_cached{model_name=\"m3-tiny\",dp_rank=\"0\"} 4",
        "m3serve:kv_pages_total{model_name=\"m3-tiny\",dp_rank=\"1\"} 100",
        "m3serve:kv_cache_usage_perc{model_name=\"m3-tiny\",dp_rank=\"0\"} 0.1",
        "m3serve:kv_cache_usage_perc{model_name=\"m3-tiny\",dp_rank=\"1\"} 0.2",
        "m3serve:prefix_cache_hit_tokens_total{model_name=\"m3-tiny\",dp_rank=\"0\"} 256",
        "m3serve:num_preemptions_total{model_name=\"m3-tiny\",dp_rank=\"1\"} 2"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
  for (const char* total : {"m3serve:kv_pages_used{model_name=\"m3-tiny\"}",
                            "m3serve:prefix_cache_hit_tokens_total{model_name=\"m3-tiny\"}"}) {
    EXPECT_EQ(text.find(total), std::string::npos) << total;
  }
  s.dp_ranks.clear();
  EXPECT_EQ(m.render(s, true, false).find("dp_rank"), std::string::npos);
}

// Speculative decoding: the engine's counts of tokens committed per verify step become a
// cumulative histogram; the series are absent without a draft.
TEST(Metrics, SpeculativeAcceptLength) {
  Metrics m("m3-tiny");
  BackendStats s;
  EXPECT_EQ(m.render(s, true, false).find("spec_"), std::string::npos);
  s.spec_accept_length_counts = {0, 5, 2, 0, 3};  // 5 steps of 1 token, 2 of 2, 3 of 4
  s.spec_draft_tokens_total = 30;
  s.spec_accepted_tokens_total = 11;
  const std::string text = m.render(s, true, false);
  for (const char* line :
       {"# TYPE m3serve:spec_accept_length histogram",
        "m3serve:spec_accept_length_bucket{model_name=\"m3-tiny\",le=\"1\"} 5",
        "m3serve:spec_accept_length_bucket{model_name=\"m3-tiny\",le=\"2\"} 7",
        "m3serve:spec_accept_length_bucket{model_name=\"m3-tiny\",le=\"3\"} 7",
        "m3serve:spec_accept_length_bucket{model_name=\"m3-tiny\",le=\"4\"} 10",
        "m3serve:spec_accept_length_bucket{model_name=\"m3-tiny\",le=\"+Inf\"} 10",
        "m3serve:spec_accept_length_sum{model_name=\"m3-tiny\"} 21",
        "m3serve:spec_accept_length_count{model_name=\"m3-tiny\"} 10",
        "m3serve:spec_draft_tokens_total{model_name=\"m3-tiny\"} 30",
        "m3serve:spec_accepted_tokens_total{model_name=\"m3-tiny\"} 11"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
}

// HiCache: host pages, hit tokens by tier and the load-back histogram (cumulative buckets),
// absent without --enable-hierarchical-cache.
TEST(Metrics, HiCacheSeries) {
  Metrics m("m3-tiny");
  BackendStats s;
  EXPECT_EQ(m.render(s, true, false).find("hicache"), std::string::npos);
  s.hicache_enabled = true;
  s.hicache_host_pages_used = 17;
  s.hicache_host_hit_tokens_total = 640;
  s.hicache_disk_hit_tokens_total = 128;
  s.hicache_load_seconds_bounds = {0.001, 0.01};
  s.hicache_load_seconds_counts = {2, 1, 1};
  s.hicache_load_seconds_sum = 0.5;
  const std::string text = m.render(s, true, false);
  for (const char* line :
       {"# TYPE m3serve:hicache_host_pages_used gauge",
        "m3serve:hicache_host_pages_used{model_name=\"m3-tiny\"} 17",
        "# TYPE m3serve:hicache_hit_tokens_total counter",
        "m3serve:hicache_hit_tokens_total{model_name=\"m3-tiny\",tier=\"host\"} 640",
        "m3serve:hicache_hit_tokens_total{model_name=\"m3-tiny\",tier=\"disk\"} 128",
        "# TYPE m3serve:hicache_load_seconds histogram",
        "m3serve:hicache_load_seconds_bucket{model_name=\"m3-tiny\",le=\"0.001\"} 2",
        "m3serve:hicache_load_seconds_bucket{model_name=\"m3-tiny\",le=\"0.01\"} 3",
        "m3serve:hicache_load_seconds_bucket{model_name=\"m3-tiny\",le=\"+Inf\"} 4",
        "m3serve:hicache_load_seconds_sum{model_name=\"m3-tiny\"} 0.5",
        "m3serve:hicache_load_seconds_count{model_name=\"m3-tiny\"} 4"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
  }
}

TEST(Auth, BearerComparison) {
  EXPECT_TRUE(authorized("sk-1", "Bearer sk-1"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-2"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-1x"));
  EXPECT_TRUE(authorized("sk-1", "bearer sk-1"));  // the scheme is case-insensitive
  EXPECT_FALSE(authorized("sk-1", "bearer SK-1"));  // the key is not
  EXPECT_FALSE(authorized("sk-1", ""));
}

}  // namespace
}  // namespace m3::server

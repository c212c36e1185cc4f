#include "router/router_flags.h"

#include <gtest/gtest.h>

namespace m3::router {
namespace {

Result<RouterFlags> parse(std::vector<std::string> args) {
  return parse_router_flags(args);
}

TEST(RouterFlags, DefaultsAreSglangRouters) {
  Result<RouterFlags> f = parse({});
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->policy, PolicyKind::kCacheAware);
  EXPECT_DOUBLE_EQ(f->cache_threshold, 0.5);
  EXPECT_EQ(f->balance_abs_threshold, 32);
  EXPECT_DOUBLE_EQ(f->balance_rel_threshold, 1.0001);
  EXPECT_EQ(f->port, 30000);
  EXPECT_TRUE(f->worker_urls.empty());
}

TEST(RouterFlags, ParsesEveryFlag) {
  Result<RouterFlags> f = parse({"--worker-urls", "http://a:1", "http://b:2/", "--policy",
                                 "power_of_two", "--cache-threshold=0.25",
                                 "--balance-abs-threshold", "8", "--balance-rel-threshold", "1.5",
                                 "--eviction-interval", "2.5", "--max-tree-size", "1000",
                                 "--host", "0.0.0.0", "--port", "0", "--api-key", "k",
                                 "--health-check-interval-secs", "0.5",
                                 "--health-check-timeout-secs", "2", "--retry-max-retries", "4",
                                 "--request-timeout-secs", "30", "--random-seed", "9"});
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->worker_urls, (std::vector<std::string>{"http://a:1", "http://b:2/"}));
  EXPECT_EQ(f->policy, PolicyKind::kPowerOfTwo);
  EXPECT_DOUBLE_EQ(f->cache_threshold, 0.25);
  EXPECT_EQ(f->balance_abs_threshold, 8);
  EXPECT_DOUBLE_EQ(f->balance_rel_threshold, 1.5);
  EXPECT_DOUBLE_EQ(f->eviction_interval_s, 2.5);
  EXPECT_EQ(f->max_tree_size, 1000);
  EXPECT_EQ(f->host, "0.0.0.0");
  EXPECT_EQ(f->port, 0);
  EXPECT_EQ(f->api_key, "k");
  EXPECT_DOUBLE_EQ(f->health_check_interval_s, 0.5);
  EXPECT_DOUBLE_EQ(f->health_check_timeout_s, 2);
  EXPECT_EQ(f->max_attempts, 4);
  EXPECT_DOUBLE_EQ(f->request_timeout_s, 30);
  EXPECT_EQ(f->seed, 9u);
  for (const char* p : {"cache_aware", "round_robin", "random", "power_of_two"}) {
    Result<RouterFlags> g = parse({"--policy", p});
    ASSERT_TRUE(g);
    EXPECT_STREQ(policy_name(g->policy), p);
  }
}

void expect_error(std::vector<std::string> args, const std::string& needle) {
  Result<RouterFlags> f = parse(args);
  ASSERT_FALSE(f) << "accepted: " << args[0];
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().message();
}

TEST(RouterFlags, BadInputNamesTheFlagAndValue) {
  expect_error({"--policy", "least_busy"}, "--policy 'least_busy'");
  expect_error({"--cache-threshold", "1.5"}, "--cache-threshold '1.5'");
  expect_error({"--cache-threshold", "abc"}, "--cache-threshold 'abc'");
  expect_error({"--balance-abs-threshold", "-1"}, "--balance-abs-threshold '-1'");
  expect_error({"--balance-rel-threshold", "0.5"}, "--balance-rel-threshold '0.5'");
  expect_error({"--max-tree-size", "0"}, "--max-tree-size '0'");
  expect_error({"--eviction-interval", "0"}, "--eviction-interval '0'");
  expect_error({"--port", "70000"}, "--port '70000'");
  expect_error({"--port"}, "--port needs a value");
  expect_error({"--retry-max-retries", "0"}, "--retry-max-retries '0'");
  expect_error({"--worker-urls", "https://a:1"}, "https://a:1");
  expect_error({"--worker-urls", "a:1"}, "a:1");
  expect_error({"--tp", "2"}, "unknown option '--tp'");
  expect_error({"--bogus"}, "unknown option '--bogus'");
  expect_error({"--worker-urls", "http://a:1", "stray"}, "stray");
}

}  // namespace
}  // namespace m3::router

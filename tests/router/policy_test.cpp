#include "router/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "router/cache_aware_policy.h"

namespace m3::router {
namespace {

std::vector<Candidate> idle(int n) {
  std::vector<Candidate> c;
  for (int i = 0; i < n; ++i) c.push_back({static_cast<uint64_t>(i + 1), 0, 0});
  return c;
}

TEST(LeastLoaded, BreaksTiesByProcessedThenId) {
  std::vector<Candidate> c = {{3, 2, 0}, {1, 1, 5}, {2, 1, 4}};
  EXPECT_EQ(c[least_loaded(c)].worker_id, 2u);  // load 1, fewer processed
  c[2].processed = 5;
  EXPECT_EQ(c[least_loaded(c)].worker_id, 1u);  // equal: the lower id
}

TEST(RoundRobinPolicy, CyclesOverTheCandidates) {
  RoundRobinPolicy p;
  const auto c = idle(3);
  std::vector<uint64_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(p.select("x", c).worker_id);
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 2, 3, 1, 2, 3}));
}

TEST(RandomPolicy, IsReproducibleFromItsSeedAndCoversEveryone) {
  RandomPolicy a(42), b(42);
  std::map<uint64_t, int> counts;
  const auto c = idle(4);
  for (int i = 0; i < 400; ++i) {
    const uint64_t x = a.select("", c).worker_id;
    EXPECT_EQ(x, b.select("", c).worker_id);
    ++counts[x];
  }
  EXPECT_EQ(counts.size(), 4u);
  for (const auto& [id, n] : counts) EXPECT_GT(n, 50) << id;  // 100 expected each
}

TEST(PowerOfTwoPolicy, NeverPicksTheBusiestOfThree) {
  // Of any two distinct candidates, the less loaded wins: the busiest can never be chosen.
  PowerOfTwoPolicy p(1);
  std::vector<Candidate> c = {{1, 5, 0}, {2, 9, 0}, {3, 0, 0}};
  std::map<uint64_t, int> counts;
  for (int i = 0; i < 300; ++i) ++counts[p.select("", c).worker_id];
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_GT(counts[3], counts[1]);  // 3 wins whenever drawn: 2 pairs of 3, worker 1 one
  EXPECT_EQ(p.select("", {{7, 3, 0}}).worker_id, 7u);
}

CacheAwareConfig config(double threshold = 0.5, int64_t abs = 32, double rel = 1.0001) {
  CacheAwareConfig c;
  c.cache_threshold = threshold;
  c.balance_abs_threshold = abs;
  c.balance_rel_threshold = rel;
  c.max_tree_size = 1 << 20;
  return c;
}

TEST(CacheAwarePolicy, SendsAConversationBackToItsWorker) {
  CacheAwarePolicy p(config());
  std::vector<Candidate> c = idle(3);
  const std::string turn1 = "user: tell me about rivers\n";
  const Selection first = p.select(turn1, c);
  EXPECT_FALSE(first.by_cache);  // nothing known: the least loaded (lowest id)
  EXPECT_EQ(first.worker_id, 1u);
  // Another conversation while worker 1 is busier: it goes elsewhere.
  c[0].load = 1;
  const Selection other = p.select("user: something else entirely\n", c);
  EXPECT_EQ(other.worker_id, 2u);
  EXPECT_FALSE(other.by_cache);
  // Turn 2 of the first conversation: worker 1 despite its higher load (balanced: 1 - 0 <= 32).
  const std::string turn2 = turn1 + "user: lakes?\n";  // 27 of 40 bytes match worker 1
  const Selection second = p.select(turn2, c);
  EXPECT_EQ(second.worker_id, 1u);
  EXPECT_TRUE(second.by_cache);
  EXPECT_EQ(second.matched_bytes, turn1.size());
  EXPECT_EQ(second.text_bytes, turn2.size());
}

TEST(CacheAwarePolicy, AShortMatchGoesToTheLeastLoaded) {
  CacheAwarePolicy p(config(0.5));
  std::vector<Candidate> c = idle(2);
  EXPECT_EQ(p.select("abcdefghij", c).worker_id, 1u);
  c[0].load = 3;
  // 4 of 10 bytes match worker 1's tree: below the threshold, so worker 2 (idle).
  const Selection s = p.select("abcdXXXXXX", c);
  EXPECT_EQ(s.worker_id, 2u);
  EXPECT_FALSE(s.by_cache);
  // Exactly at the threshold (5 of 10) follows the match (>=).
  const Selection t = p.select("abcdeYYYYY", c);
  EXPECT_EQ(t.worker_id, 1u);
  EXPECT_TRUE(t.by_cache);
}

// Worker 1 knows the prefix; with loads (l1, l2), where does its extension go?
uint64_t route_known_prefix(int64_t l1, int64_t l2) {
  CacheAwarePolicy p(config(0.5, /*abs=*/4, /*rel=*/1.5));
  std::vector<Candidate> c = idle(2);
  EXPECT_EQ(p.select("shared prefix text", c).worker_id, 1u);
  c[0].load = l1;
  c[1].load = l2;
  return p.select("shared prefix text, more", c).worker_id;
}

TEST(CacheAwarePolicy, ImbalanceOverridesTheMatch) {
  // max - min = 5 > 4 and 5 > 1.5 * 0: imbalanced, so the least loaded despite the match
  // (with min 0 the relative test always holds).
  EXPECT_EQ(route_known_prefix(5, 0), 2u);
  // max - min = 4: not over the absolute threshold, so the match wins.
  EXPECT_EQ(route_known_prefix(8, 4), 1u);
  // Over the absolute threshold (6 > 4) but not the relative one (20 <= 1.5 * 14): balanced.
  EXPECT_EQ(route_known_prefix(20, 14), 1u);
  // Over both (10 > 4 and 20 > 15): the least loaded.
  EXPECT_EQ(route_known_prefix(20, 10), 2u);
  // The less loaded worker holding the prefix is followed whatever the thresholds.
  EXPECT_EQ(route_known_prefix(0, 50), 1u);
}

TEST(CacheAwarePolicy, ForgetsARemovedWorkerAndBoundsItsTrees) {
  CacheAwareConfig cfg = config();
  cfg.max_tree_size = 100;
  CacheAwarePolicy p(cfg);
  std::vector<Candidate> c = idle(2);
  EXPECT_EQ(p.select("conversation one", c).worker_id, 1u);
  p.forget_worker(1);
  c.erase(c.begin());
  c.push_back({3, 0, 0});
  // Worker 1 is gone; its tree too, so nothing matches anywhere.
  const Selection s = p.select("conversation one, turn two", c);
  EXPECT_FALSE(s.by_cache);
  // Many long texts: the hard bound (twice the cap) holds between evictions, and evict()
  // brings every tree to the cap.
  for (int i = 0; i < 50; ++i) p.select(std::string(60, static_cast<char>('a' + i % 26)) +
                                            std::to_string(i), c);
  for (const TreeStats& t : p.tree_stats()) EXPECT_LE(t.tree_bytes, 200u);
  p.evict();
  for (const TreeStats& t : p.tree_stats()) EXPECT_LE(t.tree_bytes, 100u);
}

}  // namespace
}  // namespace m3::router

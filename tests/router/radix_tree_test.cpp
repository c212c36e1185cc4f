#include "router/radix_tree.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace m3::router {
namespace {

TEST(ApproxRadixTree, MatchesTheLongestInsertedPrefix) {
  ApproxRadixTree t;
  EXPECT_EQ(t.match("hello"), 0u);
  t.insert("hello world");
  EXPECT_EQ(t.match("hello world"), 11u);
  EXPECT_EQ(t.match("hello there"), 6u);  // "hello " then 't' != 'w'
  EXPECT_EQ(t.match("help"), 3u);
  EXPECT_EQ(t.match("xyz"), 0u);
  EXPECT_EQ(t.match(""), 0u);
  EXPECT_EQ(t.match("hello world and more"), 11u);
  EXPECT_EQ(t.size_bytes(), 11u);
  EXPECT_TRUE(t.check_invariants());
}

TEST(ApproxRadixTree, SplitsEdgesAndSharesPrefixes) {
  ApproxRadixTree t;
  t.insert("abcdef");
  t.insert("abcxyz");
  // "abc" shared, "def" and "xyz" below it.
  EXPECT_EQ(t.size_bytes(), 9u);
  EXPECT_EQ(t.node_count(), 3u);
  EXPECT_EQ(t.match("abcdef"), 6u);
  EXPECT_EQ(t.match("abcxy"), 5u);
  t.insert("ab");  // a prefix of an edge: one more split, no new bytes
  EXPECT_EQ(t.size_bytes(), 9u);
  EXPECT_EQ(t.node_count(), 4u);
  t.insert("abcdef");  // again: nothing changes
  EXPECT_EQ(t.size_bytes(), 9u);
  EXPECT_TRUE(t.check_invariants());
}

TEST(ApproxRadixTree, EvictsLeastRecentlyUsedLeavesFirst) {
  ApproxRadixTree t;
  t.insert("common prefix: old branch");
  t.insert("common prefix: new branch");
  t.insert("unrelated");
  // Touch "new branch" and "unrelated": "old branch" is the least recently used leaf.
  EXPECT_EQ(t.match("common prefix: new branch"), 25u);
  EXPECT_EQ(t.match("unrelated"), 9u);
  // A match without touch leaves the order alone: "unrelated" stays newer than "old branch".
  EXPECT_EQ(t.match("common prefix: old branch", /*touch=*/false), 25u);
  const size_t before = t.size_bytes();
  const size_t removed = t.evict_to(before - 1);
  EXPECT_EQ(removed, std::string("old branch").size());
  EXPECT_EQ(t.match("common prefix: old branch"), 15u);  // the shared part stays
  EXPECT_EQ(t.match("common prefix: new branch"), 25u);
  EXPECT_TRUE(t.check_invariants());
  // Down to nothing: every node goes, parents after their children.
  t.evict_to(0);
  EXPECT_EQ(t.size_bytes(), 0u);
  EXPECT_EQ(t.node_count(), 0u);
  EXPECT_EQ(t.match("unrelated"), 0u);
  EXPECT_TRUE(t.check_invariants());
}

TEST(ApproxRadixTree, StaysWithinTheBoundUnderRandomTraffic) {
  // Conversations that grow turn by turn, as agents send them; eviction after every insert
  // keeps the tree at the bound, and the most recent conversation is still matched whole.
  std::mt19937_64 rng(7);
  ApproxRadixTree t;
  constexpr size_t kBound = 4000;
  std::vector<std::string> convs(20);
  for (int step = 0; step < 2000; ++step) {
    std::string& c = convs[rng() % convs.size()];
    for (int i = 0; i < 20; ++i) c.push_back(static_cast<char>('a' + rng() % 4));
    if (c.size() > 600) c.clear();
    t.insert(c);
    t.evict_to(kBound);
    ASSERT_LE(t.size_bytes(), kBound);
    ASSERT_EQ(t.match(c), c.size());
  }
  EXPECT_TRUE(t.check_invariants());
}

TEST(ApproxRadixTree, DestroysADeepChainWithoutRecursion) {
  // Prefixes of one string, longest first: each insert splits the top node, so this builds a
  // chain of 10000 nodes in linear walks (and destroying it recursively could overflow the stack).
  ApproxRadixTree t;
  const std::string s(10000, 'a');
  for (size_t n = s.size(); n > 0; --n) t.insert(std::string_view(s).substr(0, n));
  EXPECT_EQ(t.node_count(), 10000u);
  EXPECT_EQ(t.size_bytes(), 10000u);
  EXPECT_EQ(t.match(s), 10000u);
}

}  // namespace
}  // namespace m3::router

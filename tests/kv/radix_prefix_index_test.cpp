#include "kv/radix_prefix_index.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace m3 {
namespace {

constexpr int32_t P = 4;

std::vector<int32_t> seq(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

// A sequence's pages: alloc, index the full ones, then release the sequence's references.
std::vector<PageId> fill(PagePool& pool, RadixPrefixIndex& index, const std::vector<int32_t>& t,
                         bool release = true) {
  std::vector<PageId> pages;
  EXPECT_TRUE(pool.alloc(static_cast<int32_t>(t.size()) / P, &pages));
  std::vector<PageId> canon = index.insert(t, pages);
  EXPECT_EQ(canon, pages);
  if (release) {
    for (PageId p : pages) pool.decref(p);
  }
  return pages;
}

TEST(RadixPrefixIndex, MatchIsPageGranularAndBounded) {
  PagePool pool(8);
  RadixPrefixIndex index(&pool, P);
  std::vector<PageId> pages = fill(pool, index, seq(0, 12));  // 3 pages
  EXPECT_EQ(index.num_nodes(), 3);
  EXPECT_EQ(pool.num_cached_only(), 3);

  std::vector<int32_t> q = seq(0, 12);
  EXPECT_EQ(index.match(q, 10), pages);
  EXPECT_EQ(index.match(q, 2), (std::vector<PageId>{pages[0], pages[1]}));
  q[9] = 99;  // differs inside page 2: pages 0-1 match
  EXPECT_EQ(index.match(q, 10), (std::vector<PageId>{pages[0], pages[1]}));
  q[3] = 99;  // differs inside page 0: nothing
  EXPECT_TRUE(index.match(q, 10).empty());
  // A partial last page never matches.
  EXPECT_EQ(index.match(seq(0, 7), 10), (std::vector<PageId>{pages[0]}));
}

TEST(RadixPrefixIndex, InsertReturnsCanonicalPagesForDuplicates) {
  PagePool pool(8);
  RadixPrefixIndex index(&pool, P);
  std::vector<PageId> first = fill(pool, index, seq(0, 8), /*release=*/false);
  std::vector<PageId> dup;
  ASSERT_TRUE(pool.alloc(2, &dup));
  std::vector<PageId> canon = index.insert(seq(0, 8), dup);
  EXPECT_EQ(canon, first);                 // the first inserter wins
  EXPECT_EQ(pool.refcount(dup[0]), 1);     // duplicates took no index reference
  EXPECT_EQ(pool.refcount(first[0]), 2);   // sequence + index
  EXPECT_EQ(index.num_nodes(), 2);
}

TEST(RadixPrefixIndex, EvictsLruLeavesOnlyWhenUnreferenced) {
  PagePool pool(8);
  RadixPrefixIndex index(&pool, P);
  // Tree: A=[0..3] -> B=[4..7] -> C=[8..11], and A -> D=[100..103]
  std::vector<PageId> abc = fill(pool, index, seq(0, 12));
  std::vector<int32_t> ad = seq(0, 4);
  auto d_tokens = seq(100, 4);
  ad.insert(ad.end(), d_tokens.begin(), d_tokens.end());
  std::vector<PageId> d;
  ASSERT_TRUE(pool.alloc(1, &d));
  std::vector<PageId> ad_pages{abc[0], d[0]};
  index.insert(ad, ad_pages);  // reuses A, adds D
  pool.decref(d[0]);
  EXPECT_EQ(index.num_nodes(), 4);
  EXPECT_EQ(pool.num_free(), 4);

  index.match(seq(0, 12), 3);  // touch A, B, C: D is least recently used
  EXPECT_EQ(index.evict(1), 1);
  EXPECT_EQ(index.match(ad, 2).size(), 1u);  // D gone, A still there
  // A live sequence holding A and B pins them: only C can go.
  pool.incref(abc[0]);
  pool.incref(abc[1]);
  EXPECT_EQ(index.evict(10), 1);
  EXPECT_EQ(index.num_nodes(), 2);
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.decref(abc[0]);
  pool.decref(abc[1]);
  EXPECT_EQ(pool.num_cached_only(), 2);
  index.evict_all();
  EXPECT_EQ(index.num_nodes(), 0);
  EXPECT_EQ(pool.num_free(), 8);
}

TEST(RadixPrefixIndex, DestructorReturnsEveryReference) {
  PagePool pool(6);
  {
    RadixPrefixIndex index(&pool, P);
    fill(pool, index, seq(0, 16));
    EXPECT_EQ(pool.num_free(), 2);
  }
  EXPECT_EQ(pool.num_free(), 6);
}

// Random insert/match/evict against a brute-force model: the index must return exactly the
// longest indexed prefix and the pool must balance.
TEST(RadixPrefixIndex, RandomAgainstBruteForce) {
  std::mt19937 rng(7);
  PagePool pool(64);
  RadixPrefixIndex index(&pool, P);
  for (int iter = 0; iter < 500; ++iter) {
    const int32_t pages = 1 + rng() % 4;
    std::vector<int32_t> t(pages * P);
    for (auto& x : t) x = rng() % 3;  // tiny alphabet: many shared prefixes
    std::vector<PageId> m = index.match(t, pages);
    for (PageId p : m) pool.incref(p);
    const int32_t need = pages - static_cast<int32_t>(m.size());
    if (pool.num_free() < need) index.evict(need - pool.num_free());
    if (pool.num_free() < need) {
      for (PageId p : m) pool.decref(p);
      continue;
    }
    std::vector<PageId> all = m;
    ASSERT_TRUE(pool.alloc(need, &all));
    std::vector<PageId> canon = index.insert(t, all);
    ASSERT_EQ(canon, all) << "matched prefix + fresh pages must be canonical";
    EXPECT_EQ(index.match(t, pages), all);
    for (PageId p : all) pool.decref(p);
    ASSERT_EQ(pool.num_free() + pool.num_cached_only(), 64);
    ASSERT_EQ(pool.num_cached_only(), index.num_nodes());
  }
  index.evict_all();
  EXPECT_EQ(pool.num_free(), 64);
}

}  // namespace
}  // namespace m3

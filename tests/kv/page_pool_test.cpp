#include "kv/page_pool.h"

#include <gtest/gtest.h>

#include "core/status.h"

namespace m3 {
namespace {

TEST(PagePool, AllocIsAllOrNothingAndDeterministic) {
  PagePool pool(4);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.alloc(3, &pages));
  EXPECT_EQ(pages, (std::vector<PageId>{0, 1, 2}));
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_FALSE(pool.alloc(2, &pages));  // only 1 free: nothing taken
  EXPECT_EQ(pages.size(), 3u);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_used(), 3);
}

TEST(PagePool, RefcountReturnsPageAtZero) {
  PagePool pool(2);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.alloc(1, &pages));
  pool.incref(pages[0]);
  EXPECT_EQ(pool.refcount(pages[0]), 2);
  pool.decref(pages[0]);
  EXPECT_EQ(pool.num_free(), 1);
  pool.decref(pages[0]);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_THROW(pool.decref(pages[0]), InternalError);  // double free is caught
  EXPECT_THROW(pool.incref(7), InternalError);
}

TEST(PagePool, CachedOnlyCountsPagesHeldByTheIndexAlone) {
  PagePool pool(3);
  std::vector<PageId> pages;
  ASSERT_TRUE(pool.alloc(2, &pages));
  // The index takes a reference and marks the page; the sequence still holds it.
  pool.incref(pages[0]);
  pool.set_cached(pages[0], true);
  EXPECT_EQ(pool.num_cached_only(), 0);
  EXPECT_EQ(pool.num_used(), 2);
  pool.decref(pages[0]);  // the sequence lets go: only the index holds it
  EXPECT_EQ(pool.num_cached_only(), 1);
  EXPECT_EQ(pool.num_used(), 1);
  pool.incref(pages[0]);  // a new sequence hits the cache
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.decref(pages[0]);
  pool.set_cached(pages[0], false);  // eviction
  EXPECT_EQ(pool.num_cached_only(), 0);
  pool.decref(pages[0]);
  EXPECT_EQ(pool.num_free(), 2);
}

}  // namespace
}  // namespace m3

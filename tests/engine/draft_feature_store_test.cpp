// DraftFeatureStore (engine/draft_feature_store.h): which pages a speculative request may read
// from the prefix cache. A page counts only when the features of all its positions were recorded
// in order, at the page's own positions, since its last write without features.
#include "engine/draft_feature_store.h"

#include <gtest/gtest.h>

#include <vector>

namespace m3 {
namespace {

constexpr int32_t kLayers = 2, kHidden = 3, kPage = 4;

// [kLayers, T, kHidden] rows whose values name (layer, position, channel).
std::vector<float> rows(int64_t first_pos, int64_t T) {
  std::vector<float> r;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < kHidden; ++c) r.push_back(float(l * 10000 + (first_pos + t) * 10 + c));
    }
  }
  return r;
}

TEST(DraftFeatureStore, WholePagesWrittenInOrderAreCoveredAndReadBack) {
  DraftFeatureStore store(kLayers, kHidden, kPage, 8);
  const std::vector<PageId> pages = {5, 2, 7};
  // Positions 0..6 in a chunk of 3 then 4 (rows 1.. of a slice whose row 0 is something else).
  store.write(pages, 0, 3, rows(0, 3), 3, 0);
  EXPECT_EQ(store.covered_prefix(pages), 0);
  store.write(pages, 3, 4, rows(2, 5), 5, 1);
  EXPECT_TRUE(store.covers(5, 0));
  EXPECT_FALSE(store.covers(2, 1)) << "positions 4..6 of 4..7";
  EXPECT_EQ(store.covered_prefix(pages), 1);
  store.write(pages, 7, 1, rows(7, 1), 1, 0);
  EXPECT_EQ(store.covered_prefix(pages), 2);
  EXPECT_FALSE(store.covers(2, 0)) << "page 2 holds positions 4..7, not 0..3";
  const std::vector<float> back = store.read(pages, 2);
  EXPECT_EQ(back, rows(0, 8));
  EXPECT_EQ(store.num_allocated(), 2);
}

TEST(DraftFeatureStore, GapsRewritesAndReuseRestartThePage) {
  DraftFeatureStore store(kLayers, kHidden, kPage, 4);
  const std::vector<PageId> a = {1};
  store.write(a, 0, 2, rows(0, 2), 2, 0);
  store.write(a, 3, 1, rows(3, 1), 1, 0);  // a gap at 2: not recorded
  EXPECT_FALSE(store.covers(1, 0));
  store.write(a, 2, 2, rows(2, 2), 2, 0);
  EXPECT_TRUE(store.covers(1, 0));
  // A rollback rewrites position 1: the entry holds 0..1 again, then grows.
  store.write(a, 1, 1, rows(1, 1), 1, 0);
  EXPECT_FALSE(store.covers(1, 0));
  store.write(a, 2, 2, rows(2, 2), 2, 0);
  EXPECT_TRUE(store.covers(1, 0));
  // The page reused as another sequence's second page: restarted at position 4.
  const std::vector<PageId> b = {0, 1};
  store.write(b, 4, 4, rows(4, 4), 4, 0);
  EXPECT_FALSE(store.covers(1, 0));
  EXPECT_TRUE(store.covers(1, 1));
  // Reused again at index 1 but written from its middle (no start): not covered.
  store.invalidate(b, 4, 1);
  EXPECT_FALSE(store.covers(1, 1));
  store.write(b, 5, 3, rows(5, 3), 3, 0);
  EXPECT_FALSE(store.covers(1, 1));
}

TEST(DraftFeatureStore, WritesWithoutFeaturesInvalidateFromTheirPosition) {
  DraftFeatureStore store(kLayers, kHidden, kPage, 4);
  const std::vector<PageId> pages = {0, 1, 2};
  store.write(pages, 0, 12, rows(0, 12), 12, 0);
  EXPECT_EQ(store.covered_prefix(pages), 3);
  store.invalidate(pages, 6, 3);  // positions 6..8: pages 1 and 2
  EXPECT_TRUE(store.covers(0, 0));
  EXPECT_FALSE(store.covers(1, 1));
  EXPECT_FALSE(store.covers(2, 2));
  EXPECT_EQ(store.covered_prefix(pages), 1);
  // Page 1 still holds 4..5: writing 6..7 again completes it.
  store.write(pages, 6, 2, rows(6, 2), 2, 0);
  EXPECT_TRUE(store.covers(1, 1));
}

TEST(DraftFeatureStore, AdoptMovesFeaturesToTheIndexedDuplicate) {
  DraftFeatureStore store(kLayers, kHidden, kPage, 4);
  // Page 3 was indexed by a sequence without features; page 0 holds the same tokens with them.
  store.invalidate(std::vector<PageId>{3}, 0, 4);
  store.write(std::vector<PageId>{0}, 0, 4, rows(0, 4), 4, 0);
  store.adopt(3, 0, 0);
  EXPECT_TRUE(store.covers(3, 0));
  EXPECT_FALSE(store.covers(0, 0));
  EXPECT_EQ(store.read(std::vector<PageId>{3}, 1), rows(0, 4));
  // An indexed page that has its features keeps them.
  store.write(std::vector<PageId>{1}, 0, 4, rows(100, 4), 4, 0);
  store.adopt(3, 1, 0);
  EXPECT_EQ(store.read(std::vector<PageId>{3}, 1), rows(0, 4));
}

}  // namespace
}  // namespace m3

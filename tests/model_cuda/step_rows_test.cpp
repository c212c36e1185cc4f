// The rows of a step of the real-shape CUDA model (step_rows.h): without --dp the one-rank layout
// (one-token slices first), with --dp every group's rows group by group, packed (general path) or
// at a fixed stride (decode path, padded to the bucket), and the decode stride per group. No GPU.
#include "model/minimax_m3/cuda/step_rows.h"

#include <gtest/gtest.h>

#include <vector>

namespace m3::minimax_m3 {
namespace {

// A batch of slices with these token counts and groups (the tokens' values do not matter).
struct Batch {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<ModelSlice> slices;
  Batch(const std::vector<int64_t>& counts, const std::vector<int32_t>& groups) {
    tokens.resize(counts.size());
    slices.resize(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) {
      tokens[i].assign(static_cast<size_t>(counts[i]), 5);
      slices[i].tokens = tokens[i];
      slices[i].dp_group = groups[i];
    }
  }
};

TEST(StepRows, OneGroupPutsTheOneTokenSlicesFirst) {
  Batch b({3, 1, 4, 1}, {0, 0, 0, 0});
  const StepRows p = plan_step_rows(b.slices, 1);
  ASSERT_EQ(p.slices.size(), 4u);
  const std::vector<size_t> order = {1, 3, 0, 2};
  const std::vector<int64_t> offsets = {0, 1, 2, 5};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p.slices[i].index, order[i]);
    EXPECT_EQ(p.slices[i].offset, offsets[i]);
  }
  EXPECT_EQ(p.rows, 9);
  EXPECT_EQ(p.max_group, 9);
  EXPECT_EQ(p.group_first, std::vector<int64_t>({0}));
  EXPECT_EQ(p.group_tokens, std::vector<int64_t>({9}));
  EXPECT_EQ(p.group_decode, std::vector<int64_t>({2}));
  // The decode layout of one group is the same rows, padded to the bucket.
  const StepRows d = plan_step_rows(b.slices, 1, decode_group_stride(p.max_group, 1, 256));
  EXPECT_EQ(d.rows, 16);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(d.slices[i].offset, offsets[i]);
}

TEST(StepRows, GroupsArePackedInGroupOrderOnTheGeneralPath) {
  // Slices interleaved over the groups, group 1 with a prefill chunk beside a decode row.
  Batch b({1, 200, 1, 1, 37}, {1, 1, 0, 0, 0});
  const StepRows p = plan_step_rows(b.slices, 2);
  ASSERT_EQ(p.slices.size(), 5u);
  // Group 0: slices 2, 3 (one token each), then 4; group 1: slice 0, then 1.
  const std::vector<size_t> order = {2, 3, 4, 0, 1};
  const std::vector<int64_t> offsets = {0, 1, 2, 39, 40};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p.slices[i].index, order[i]) << i;
    EXPECT_EQ(p.slices[i].offset, offsets[i]) << i;
    EXPECT_EQ(p.slices[i].group, b.slices[order[i]].dp_group);
  }
  EXPECT_EQ(p.group_first, std::vector<int64_t>({0, 39}));
  EXPECT_EQ(p.group_tokens, std::vector<int64_t>({39, 201}));
  EXPECT_EQ(p.group_decode, std::vector<int64_t>({2, 1}));
  EXPECT_EQ(p.rows, 240);
  EXPECT_EQ(p.max_group, 201);
}

TEST(StepRows, TheDecodePathGivesEveryGroupTheBucketOfTheLargest) {
  // Three decode rows in group 0, one in group 1, none in group 2, one in group 3.
  Batch b({1, 1, 1, 1, 1}, {0, 1, 0, 3, 0});
  const StepRows packed = plan_step_rows(b.slices, 4);
  EXPECT_EQ(packed.max_group, 3);
  const int64_t stride = decode_group_stride(packed.max_group, 4, 64);
  EXPECT_EQ(stride, 4);
  const StepRows p = plan_step_rows(b.slices, 4, stride);
  EXPECT_EQ(p.rows, 16);
  EXPECT_EQ(p.group_first, std::vector<int64_t>({0, 4, 8, 12}));
  EXPECT_EQ(p.group_tokens, std::vector<int64_t>({3, 1, 0, 1}));
  const std::vector<size_t> order = {0, 2, 4, 1, 3};
  const std::vector<int64_t> offsets = {0, 1, 2, 4, 12};
  ASSERT_EQ(p.slices.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p.slices[i].index, order[i]) << i;
    EXPECT_EQ(p.slices[i].offset, offsets[i]) << i;
  }
  // The stride depends only on the largest group: the same rows (and graph) for any placement.
  Batch other({1, 1, 1}, {2, 2, 2});
  EXPECT_EQ(decode_group_stride(plan_step_rows(other.slices, 4).max_group, 4, 64), 4);
}

TEST(StepRows, DecodeStrideBucketsAndCapsAtTheBuffers) {
  EXPECT_EQ(decode_group_stride(1, 1, 256), 1);
  EXPECT_EQ(decode_group_stride(3, 1, 256), 4);
  EXPECT_EQ(decode_group_stride(200, 1, 256), 256);
  EXPECT_EQ(decode_group_stride(257, 1, 256), 0);  // the general path
  EXPECT_EQ(decode_group_stride(40, 1, 48), 48);   // a bucket beyond the buffers: capped
  EXPECT_EQ(decode_group_stride(5, 2, 16), 8);
  EXPECT_EQ(decode_group_stride(9, 2, 16), 0);     // 2 x 16 rows do not fit 16
  EXPECT_EQ(decode_group_stride(20, 2, 48), 24);   // 2 x 32 do not either: 24 each
  EXPECT_EQ(decode_group_stride(0, 2, 16), 0);
}

}  // namespace
}  // namespace m3::minimax_m3

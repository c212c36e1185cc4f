// model/minimax_m3_cuda/shard_plan.h: the ranks of a tensor-parallel group partition every split
// dimension of MiniMax-M3.1-Flash exactly (disjoint, covering, in rank order), expert parallel
// partitions the experts, and layouts that cannot work are refused with the field named.
#include "model/minimax_m3_cuda/shard_plan.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "model/minimax_m3/dummy_weights.h"

namespace m3::minimax_m3 {
namespace {

// The spans of all ranks tile [0, total) in order.
void expect_tiles(int64_t world, int64_t total, const std::function<Span(int64_t)>& span,
                  const std::string& what) {
  int64_t next = 0;
  for (int64_t r = 0; r < world; ++r) {
    const Span s = span(r);
    EXPECT_EQ(s.begin, next) << what << " rank " << r;
    EXPECT_EQ(s.size(), total / world) << what << " rank " << r;
    next = s.end;
  }
  EXPECT_EQ(next, total) << what;
}

TEST(ShardPlan, TensorParallelTilesEverySplitDimension) {
  const MiniMaxM3Config c = builtin_m3_flash_config(60);
  for (int64_t world : {1, 2, 4}) {
    for (int64_t r = 0; r < world; ++r)
      ASSERT_TRUE(check_parallel_layout(c, {world, r, false}).is_ok()) << world << " " << r;
    auto at = [&](int64_t r) { return shard_for_rank(c, {world, r, false}); };
    expect_tiles(world, c.num_attention_heads, [&](int64_t r) { return at(r).q_heads; }, "q heads");
    expect_tiles(world, c.num_key_value_heads, [&](int64_t r) { return at(r).kv_heads; }, "kv heads");
    expect_tiles(world, c.index_n_heads, [&](int64_t r) { return at(r).index_heads; }, "index heads");
    expect_tiles(world, c.dense_intermediate_size, [&](int64_t r) { return at(r).dense_inter; }, "dense");
    expect_tiles(world, c.shared_intermediate_size, [&](int64_t r) { return at(r).shared_inter; }, "shared");
    expect_tiles(world, c.intermediate_size, [&](int64_t r) { return at(r).expert_inter; }, "expert inter");
    for (int64_t r = 0; r < world; ++r) {
      EXPECT_EQ(at(r).experts.begin, 0);
      EXPECT_EQ(at(r).experts.end, c.num_local_experts);
      // A rank's query heads are exactly the 16 of each of its KV heads.
      EXPECT_EQ(at(r).q_heads.begin, at(r).kv_heads.begin * 16);
      EXPECT_EQ(at(r).q_heads.size(), at(r).kv_heads.size() * 16);
    }
  }
}

TEST(ShardPlan, ExpertParallelKeepsWholeExperts) {
  const MiniMaxM3Config c = builtin_m3_flash_config(8);
  const int64_t world = 4;
  auto at = [&](int64_t r) { return shard_for_rank(c, {world, r, true}); };
  ASSERT_TRUE(check_parallel_layout(c, {world, 3, true}).is_ok());
  expect_tiles(world, c.num_local_experts, [&](int64_t r) { return at(r).experts; }, "experts");
  for (int64_t r = 0; r < world; ++r) {
    EXPECT_EQ(at(r).expert_inter.begin, 0);
    EXPECT_EQ(at(r).expert_inter.end, c.intermediate_size);
  }
}

TEST(ShardPlan, RefusesLayoutsThatCannotWork) {
  const MiniMaxM3Config c = builtin_m3_flash_config(4);
  auto message = [&](ParallelLayout l) {
    const Status s = check_parallel_layout(c, l);
    EXPECT_FALSE(s.is_ok());
    return s.message();
  };
  EXPECT_NE(message({8, 0, false}).find("num_key_value_heads"), std::string::npos);  // 4 KV heads
  EXPECT_NE(message({3, 0, false}).find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(message({2, 2, false}).find("outside a group of 2"), std::string::npos);
  EXPECT_NE(message({0, 0, false}).find("outside"), std::string::npos);
  MiniMaxM3Config odd = c;
  odd.num_local_experts = 126;  // 126 experts over 4 ranks
  EXPECT_NE(check_parallel_layout(odd, {4, 0, true}).message().find("num_local_experts"),
            std::string::npos);
  EXPECT_TRUE(check_parallel_layout(odd, {4, 0, false}).is_ok());  // TP MoE does not split experts
  MiniMaxM3Config narrow = c;
  narrow.intermediate_size = 96;  // 48 per rank of 2: not whole 32-element blocks
  EXPECT_NE(check_parallel_layout(narrow, {2, 0, false}).message().find("intermediate_size"),
            std::string::npos);
  EXPECT_TRUE(check_parallel_layout(narrow, {2, 0, true}).is_ok());  // EP keeps experts whole
}

}  // namespace
}  // namespace m3::minimax_m3

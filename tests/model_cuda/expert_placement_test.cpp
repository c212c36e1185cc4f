// Expert placement of the GPU ranks under --ep (model/minimax_m3/expert_placement.h) on
// MiniMax-M3.1-Flash's config: each expert lives on exactly one expert-parallel rank, the local
// slot map inverts, the intermediate slices of the ranks sharing an expert tile it, and the bytes
// of routed experts per GPU at --ep 2/4/8 are the whole model's split as the placement says.
#include "model/minimax_m3/expert_placement.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {
namespace {

const std::vector<std::pair<int, int>> kLayouts = {{2, 2}, {4, 4}, {8, 8}, {4, 2}, {8, 2}, {8, 4}};

TEST(ExpertPlacement, EveryExpertHasOneOwnerAndItsSlicesTileIt) {
  const MiniMaxM3Config c = builtin_m3_flash_config(60);
  const int64_t experts = c.num_local_experts, inter = c.intermediate_size;
  for (auto [tp, ep] : kLayouts) {
    ASSERT_TRUE(check_tensor_parallel(c, tp, ep).is_ok()) << tp << " " << ep;
    // covered[e]: intermediate columns of expert e held over all ranks (each exactly once).
    std::vector<std::vector<int>> covered(static_cast<size_t>(experts),
                                          std::vector<int>(static_cast<size_t>(inter), 0));
    for (int r = 0; r < tp; ++r) {
      const ExpertPlacement p = place_experts(c, r, tp, ep);
      EXPECT_EQ(p.num_experts, experts);
      EXPECT_EQ(p.count, experts / ep) << "tp " << tp << " ep " << ep;
      EXPECT_EQ(p.ep_rank, r / (tp / ep));
      EXPECT_EQ(p.inter_count, inter / (tp / ep));
      for (int64_t e = 0; e < experts; ++e) {
        const int64_t slot = p.local_slot(e);
        EXPECT_EQ(p.holds(e), expert_owner(c, ep, e) == p.ep_rank) << e;
        if (slot < 0) continue;
        EXPECT_LT(slot, p.count);
        EXPECT_EQ(p.global_id(slot), e);
        for (int64_t i = p.inter_begin; i < p.inter_begin + p.inter_count; ++i)
          ++covered[static_cast<size_t>(e)][static_cast<size_t>(i)];
      }
      for (int64_t s = 0; s < p.count; ++s) EXPECT_EQ(p.local_slot(p.global_id(s)), s);
    }
    int64_t wrong = 0;
    for (const auto& cols : covered)
      for (int n : cols) wrong += n != 1;
    EXPECT_EQ(wrong, 0) << "tp " << tp << " ep " << ep << ": columns held other than once";
  }
}

// Each rank's partial MoE output (its own experts' slots only, as the GPU combine skips the
// others) summed over the ranks is the unsharded output. Integer-valued terms: exact in float32
// whatever the order, so equality is the check.
TEST(ExpertPlacement, LocalSlotsSummedOverRanksGiveEveryExpertOnce) {
  const MiniMaxM3Config c = builtin_m3_flash_config(60);
  const int64_t experts = c.num_local_experts, k = c.num_experts_per_tok, tokens = 64;
  std::mt19937 rng(5);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < k; ++s)  // distinct experts per token, as top-k chooses them
      ids[static_cast<size_t>(t * k + s)] = static_cast<int32_t>((t * 37 + s * 17 + rng() % 7) % experts);
  const auto value = [](int64_t t, int64_t e) { return static_cast<float>((t * 131 + e * 7) % 61); };
  for (auto [tp, ep] : kLayouts) {
    if (tp != ep) continue;  // whole experts: one rank's share is the whole expert
    for (int64_t t = 0; t < tokens; ++t) {
      float whole = 0, summed = 0;
      for (int64_t s = 0; s < k; ++s) whole += value(t, ids[static_cast<size_t>(t * k + s)]);
      for (int r = 0; r < tp; ++r) {
        const ExpertPlacement p = place_experts(c, r, tp, ep);
        for (int64_t s = 0; s < k; ++s) {
          const int32_t e = ids[static_cast<size_t>(t * k + s)];
          if (p.local_slot(e) >= 0) summed += value(t, e);
        }
      }
      ASSERT_EQ(summed, whole) << "token " << t << " --ep " << ep;
    }
  }
}

// Routed expert bytes per GPU of M3.1-Flash (57 MoE layers, 128 experts of 3072 x 6144 NVFP4).
TEST(ExpertPlacement, FlashRoutedExpertBytesPerGpu) {
  const MiniMaxM3Config c = builtin_m3_flash_config(60);
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.is_moe_layer(i);
  ASSERT_EQ(moe_layers, 57);
  // One whole expert: gate|up 6144 x 6144 and down 6144 x 3072 at 9/16 byte a weight + 2 floats.
  const int64_t one_expert = (2 * 3072 + 3072) * int64_t{6144} * 9 / 16 + 2 * 4;
  const int64_t whole = real_shape_routed_expert_bytes(c, place_experts(c, 0, 1, 1));
  EXPECT_EQ(whole, moe_layers * 128 * one_expert);
  for (auto [tp, ep] : kLayouts) {
    int64_t sum = 0;
    for (int r = 0; r < tp; ++r) {
      const int64_t b = real_shape_routed_expert_bytes(c, place_experts(c, r, tp, ep));
      EXPECT_EQ(b, real_shape_routed_expert_bytes(c, place_experts(c, 0, tp, ep))) << "balanced";
      sum += b;
    }
    // Every weight and scale once; each extra intermediate slice of an expert brings its own two
    // multipliers.
    const int64_t extra = moe_layers * 128 * 2 * 4 * (tp / ep - 1);
    EXPECT_EQ(sum, whole + extra) << "tp " << tp << " ep " << ep;
    if (tp == ep) {
      EXPECT_EQ(sum / tp, moe_layers * (128 / ep) * one_expert);
      std::printf("[ %-36s ] --ep %d: %lld experts a layer, %.2f GB of routed experts per GPU\n",
                  "expert placement M3.1-Flash", ep, static_cast<long long>(128 / ep),
                  static_cast<double>(sum / tp) / 1e9);
    }
  }
}

}  // namespace
}  // namespace m3::minimax_m3

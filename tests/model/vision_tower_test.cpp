// The vision tower and projector (float32) against the same arithmetic in double precision, the
// merge-window grouping, 3-D RoPE's dependence on patch positions, and weight loading by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "tiny_vision.h"

namespace m3 {
namespace {

std::vector<float> random_patches(int64_t n, int64_t values, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> p(size_t(n * values));
  for (float& v : p) v = d(rng);
  return p;
}

VisionTower make_tower(const VisionConfig& c, uint32_t seed, Backend* backend = nullptr,
                       const std::string& prefix = "") {
  testing::MemoryWeightSource src;
  testing::add_random_vision_weights(src, c, seed, prefix);
  auto w = load_vision_weights(src, c);
  EXPECT_TRUE(w.is_ok()) << w.status().message();
  return VisionTower(c, std::move(w).value(), backend);
}

// Error model (as for the text model's tests): each float32 op is within a few u = 2^-24 of its
// exact value and a dot product of length K adds at most K·u relative to the sum of its terms'
// magnitudes. The longest reduction is the merge MLP's K = 4·48 = 192. The path from patches to
// an output has about 2 + 14 per layer + 4 = 34 such stages (patch linear, pre-LN; per layer LN1,
// q/k/v, RoPE, scores, softmax, weighted sum, out_proj, residual, LN2, fc1, GELU, fc2, residual;
// projector, GELU, merge linears). LayerNorm rescales the residual stream, so stage errors add
// rather than compound: <= 34·192·u ≈ 3.9e-4 relative to 1 + |value| (outputs are O(1) here).
// A wrong position, RoPE pairing, merge order or norm moves outputs by O(0.1-1).
constexpr double kRelTol = 34 * 192 * 5.96e-8;

TEST(VisionTower, Float32MatchesDoublePrecisionWithinTheErrorModel) {
  const VisionConfig c = testing::tiny_vision_config();
  CpuBackend cpu(2);
  for (Backend* backend : {static_cast<Backend*>(nullptr), static_cast<Backend*>(&cpu)}) {
    VisionTower tower = make_tower(c, 5, backend);
    for (auto [gh, gw] : {std::pair{2, 2}, std::pair{4, 6}, std::pair{6, 2}}) {
      const auto patches = random_patches(int64_t(gh) * gw, c.patch_values(), uint32_t(gh * 10 + gw));
      auto got = tower.encode(patches, 1, gh, gw);
      auto ref = tower.encode_reference(patches, 1, gh, gw);
      ASSERT_TRUE(got.is_ok() && ref.is_ok());
      ASSERT_EQ(got->size(), size_t(gh * gw / 4 * c.text_hidden_size));
      ASSERT_EQ(got->size(), ref->size());
      double worst = 0, magnitude = 0;
      for (size_t i = 0; i < got->size(); ++i) {
        const double e = std::abs(double((*got)[i]) - (*ref)[i]);
        ASSERT_LE(e, kRelTol * (1 + std::abs((*ref)[i]))) << "grid " << gh << "x" << gw << " @" << i;
        worst = std::max(worst, e);
        magnitude = std::max(magnitude, std::abs((*ref)[i]));
      }
      EXPECT_GT(magnitude, 0.05);  // the outputs are not trivially zero
      std::printf("grid %dx%d: max |float32 - double| = %.3g (max |out| %.3g)\n", gh, gw, worst,
                  magnitude);
    }
  }
}

TEST(VisionTower, OutputsFollowMergeWindows) {
  // Without encoder layers no patch sees another: output row j depends on window j's 4 patches
  // (consecutive in the input) only.
  VisionConfig c = testing::tiny_vision_config();
  c.num_hidden_layers = 0;
  VisionTower tower = make_tower(c, 7);
  auto patches = random_patches(16, c.patch_values(), 3);
  auto base = tower.encode(patches, 1, 4, 4);
  patches[size_t(5 * c.patch_values() + 11)] += 1.0f;  // patch 5 belongs to window 1
  auto moved = tower.encode(patches, 1, 4, 4);
  ASSERT_TRUE(base.is_ok() && moved.is_ok());
  const int64_t T = c.text_hidden_size;
  for (int64_t row = 0; row < 4; ++row) {
    double diff = 0;
    for (int64_t i = 0; i < T; ++i) diff += std::abs((*base)[size_t(row * T + i)] - (*moved)[size_t(row * T + i)]);
    if (row == 1) {
      EXPECT_GT(diff, 1e-3) << "window 1 must change";
    } else {
      EXPECT_EQ(diff, 0.0) << "window " << row << " must not change";
    }
  }
}

TEST(VisionTower, RopeMakesPositionsMatter) {
  // With attention, the same 16 patches laid out as a 4x4 or a 2x8 grid differ only in their
  // (h, w) positions, which reach the model through 3-D RoPE alone: the outputs must differ.
  // Without layers (no attention, so no RoPE) they must be identical.
  VisionConfig c = testing::tiny_vision_config();
  const auto patches = random_patches(16, c.patch_values(), 4);
  auto max_diff = [&](const VisionTower& t) {
    auto square = t.encode_reference(patches, 1, 4, 4);
    auto wide = t.encode_reference(patches, 1, 2, 8);
    EXPECT_TRUE(square.is_ok() && wide.is_ok());
    double d = 0;
    for (size_t i = 0; i < square->size(); ++i) d = std::max(d, std::abs((*square)[i] - (*wide)[i]));
    return d;
  };
  EXPECT_GT(max_diff(make_tower(c, 9)), 1e-3);
  c.num_hidden_layers = 0;
  EXPECT_EQ(max_diff(make_tower(c, 9)), 0.0);
}

TEST(VisionTower, WeightsAreFoundByTheirCheckpointNames) {
  const VisionConfig c = testing::tiny_vision_config();
  testing::MemoryWeightSource src;
  testing::add_random_vision_weights(src, c, 1, "model.");
  auto prefix = find_vision_prefix(src);
  ASSERT_TRUE(prefix.is_ok());
  EXPECT_EQ(*prefix, "model.");
  EXPECT_TRUE(load_vision_weights(src, c).is_ok());
  // A missing tensor and a wrong shape are errors naming the tensor.
  src.tensors.erase("model.vision_tower.vision_model.encoder.layers.1.mlp.fc2.bias");
  auto missing = load_vision_weights(src, c);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("layers.1.mlp.fc2.bias"), std::string::npos);
  testing::MemoryWeightSource none;
  EXPECT_FALSE(find_vision_prefix(none).is_ok());
  // Bad grids are refused.
  VisionTower tower = make_tower(c, 2);
  EXPECT_FALSE(tower.encode(random_patches(6, c.patch_values(), 1), 1, 2, 3).is_ok());
  EXPECT_FALSE(tower.encode(random_patches(3, c.patch_values(), 1), 1, 2, 2).is_ok());
}

TEST(VisionConfig, ParsesConfigAndPreprocessor) {
  const std::string cfg = R"({"text_config": {"hidden_size": 40},
    "vision_config": {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 3,
                      "intermediate_size": 64, "patch_size": 4, "hidden_act": "gelu"},
    "projector_hidden_size": 48, "projector_hidden_act": "gelu"})";
  auto c = parse_vision_config(cfg, R"({"min_pixels": 100, "max_pixels": 2000,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25], "patch_size": 4})", "config.json");
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->num_hidden_layers, 3);
  EXPECT_EQ((*c)->text_hidden_size, 40);
  EXPECT_EQ((*c)->projector_hidden_size, 48);
  EXPECT_EQ((*c)->max_pixels, 2000);
  EXPECT_EQ((*c)->image_std[1], 0.25);
  EXPECT_EQ((*c)->rope_axis_dims(), 4);
  // No vision_config: no tower.
  auto none = parse_vision_config(R"({"hidden_size": 8})", "", "config.json");
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  // Errors name the field.
  auto act = parse_vision_config(R"({"vision_config": {"hidden_act": "quick_gelu"}})", "", "config.json");
  ASSERT_FALSE(act.is_ok());
  EXPECT_NE(act.status().message().find("vision_config.hidden_act"), std::string::npos);
  auto patch = parse_vision_config(cfg, R"({"patch_size": 16})", "config.json");
  ASSERT_FALSE(patch.is_ok());
  EXPECT_NE(patch.status().message().find("patch_size"), std::string::npos);
  auto heads = parse_vision_config(R"({"vision_config": {"hidden_size": 30, "num_attention_heads": 4}})",
                                   "", "config.json");
  EXPECT_FALSE(heads.is_ok());
}

}  // namespace
}  // namespace m3

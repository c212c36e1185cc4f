// The GPU vision tower's host plan (vision_batch_plan.h): image layout, padded keys, positions and
// RoPE tables, the config check and the FLOP count. No GPU.
#include "model/minimax_m3/cuda/vision_batch_plan.h"

#include <gtest/gtest.h>

#include <cmath>

namespace m3 {
namespace {

VisionConfig small() {
  VisionConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;  // head_dim 16, rope axis 4 -> rope_half 6
  c.num_hidden_layers = 2;
  c.intermediate_size = 128;
  c.patch_size = 4;
  c.projector_hidden_size = 48;
  c.text_hidden_size = 40;
  return c;
}

TEST(VisionBatchPlan, ImagesAreLaidOutOneAfterAnotherWithPaddedKeys) {
  const VisionConfig c = small();
  const std::vector<VisionImageGrid> g = {{1, 2, 2}, {1, 4, 6}, {2, 2, 4}};
  auto p = plan_vision_batch(c, g);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  ASSERT_EQ(p->images.size(), 3u);
  EXPECT_EQ(p->total_patches, 4 + 24 + 16);
  EXPECT_EQ(p->total_outputs, 1 + 6 + 4);
  EXPECT_EQ(p->images[0].keys_padded, 8);
  EXPECT_EQ(p->images[1].keys_padded, 24);
  EXPECT_EQ(p->images[2].keys_padded, 16);
  EXPECT_EQ(p->images[1].patch_start, 4);
  EXPECT_EQ(p->images[2].patch_start, 28);
  EXPECT_EQ(p->images[1].kv_offset, 4 * 8 * 16);
  EXPECT_EQ(p->images[2].kv_offset, 4 * (8 + 24) * 16);
  EXPECT_EQ(p->kv_elements, 4 * (8 + 24 + 16) * 16);
  EXPECT_EQ(p->images[2].output_start, 7);
  EXPECT_EQ(p->max_patches, 24);
  EXPECT_EQ(p->max_keys_padded, 24);
  EXPECT_EQ(p->patch_image[3], 0);
  EXPECT_EQ(p->patch_image[4], 1);
  EXPECT_EQ(p->patch_image[43], 2);
}

TEST(VisionBatchPlan, RopeAnglesFollowTheMergeWindowOrder) {
  const VisionConfig c = small();
  const std::vector<VisionImageGrid> g = {{1, 2, 2}, {2, 4, 6}};
  auto p = plan_vision_batch(c, g);
  ASSERT_TRUE(p.is_ok());
  ASSERT_EQ(p->rope_half, 6);
  // Frequency index 0 of each axis has inv_freq 1: the angle is the position itself.
  // Image 1, patch 5: window 1 (row 0, column 1 of windows), within 1 -> (t 0, h 0, w 3).
  // Image 1, patch 24 + 15: frame 1, window 3 (row 1, col 0), within 3 -> (t 1, h 3, w 1).
  struct Case { int64_t row, t, h, w; };
  for (const Case& k : {Case{4 + 5, 0, 0, 3}, Case{4 + 24 + 15, 1, 3, 1}, Case{2, 0, 1, 0}}) {
    const float* co = &p->rope_cos[size_t(k.row * 6)];
    const float* si = &p->rope_sin[size_t(k.row * 6)];
    EXPECT_FLOAT_EQ(co[0], std::cos(float(k.t))) << k.row;
    EXPECT_FLOAT_EQ(co[2], std::cos(float(k.h))) << k.row;
    EXPECT_FLOAT_EQ(co[4], std::cos(float(k.w))) << k.row;
    EXPECT_FLOAT_EQ(si[4], std::sin(float(k.w))) << k.row;
    // Frequency 1 of axis dims 4: theta^(-2/4) = 1/100.
    EXPECT_NEAR(co[5], std::cos(float(k.w) / 100.0f), 1e-6) << k.row;
  }
}

TEST(VisionBatchPlan, RefusesBadGridsAndEmptyBatches) {
  const VisionConfig c = small();
  EXPECT_FALSE(plan_vision_batch(c, {}).is_ok());
  const std::vector<VisionImageGrid> odd = {{1, 2, 2}, {1, 3, 2}};
  auto p = plan_vision_batch(c, odd);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().to_string().find("image 1"), std::string::npos);
}

TEST(VisionBatchPlan, ConfigCheckNamesTheField) {
  VisionConfig c = small();
  EXPECT_TRUE(check_cuda_vision_config(c).is_ok());
  EXPECT_TRUE(check_cuda_vision_config(VisionConfig{}).is_ok());  // the M3 defaults
  c.num_attention_heads = 8;  // head_dim 8: fine
  EXPECT_TRUE(check_cuda_vision_config(c).is_ok());
  c.hidden_size = 48;
  c.num_attention_heads = 4;  // head_dim 12
  const Status s = check_cuda_vision_config(c);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("head_dim"), std::string::npos) << s.to_string();
  c = small();
  c.text_hidden_size = 42;
  EXPECT_NE(check_cuda_vision_config(c).to_string().find("text_hidden_size"), std::string::npos);
}

TEST(VisionBatchPlan, FlopsCountEveryGemm) {
  const VisionConfig c = small();
  const std::vector<VisionImageGrid> g = {{1, 2, 2}};  // 4 patches, 8 padded keys, 1 window
  const VisionFlops f = vision_tower_flops(c, g);
  const double n = 4, H = 64, F = 128, P = 48, T = 40, pv = 3 * 2 * 4 * 4;
  const double linear = 2 * n * pv * H + 2 * (2 * n * (4 * H * H + 2 * H * F)) +
                        2 * n * (H * P + P * P) + 2 * 1 * (4 * P * T + T * T);
  EXPECT_DOUBLE_EQ(f.linear, linear);
  EXPECT_DOUBLE_EQ(f.attention, 2 * 4 * n * 8 * H);
}

}  // namespace
}  // namespace m3

// Test helpers: a tiny vision config and random vision-tower weights under the checkpoint names
// (vision_weight_names), so the tower and the image path run in milliseconds.
#pragma once

#include <random>
#include <string>

#include "loader/vision_config.h"
#include "model/minimax_m3/vision_tower.h"
#include "tiny_model.h"

namespace m3::testing {

// hidden 32 = 2 heads x 16 (3-D RoPE: 4 dims per axis, 12 rotated, 4 passed), 2 layers, patch 4,
// so a patch is 3 x 2 x 4 x 4 = 96 values; projector 48; merge MLP to `text_hidden`.
inline VisionConfig tiny_vision_config(int64_t text_hidden = 40) {
  VisionConfig c;
  c.hidden_size = 32;
  c.num_attention_heads = 2;
  c.num_hidden_layers = 2;
  c.intermediate_size = 64;
  c.patch_size = 4;
  c.projector_hidden_size = 48;
  c.text_hidden_size = text_hidden;
  c.min_pixels = 64;      // (patch 4 x merge 2)^2
  c.max_pixels = 64 * 16;
  return c;
}

// The shape of each named vision weight for `c`.
inline std::vector<int64_t> vision_weight_shape(const VisionConfig& c, const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const int64_t H = c.hidden_size, F = c.intermediate_size, P = c.projector_hidden_size;
  const int64_t T = c.text_hidden_size, M2 = c.spatial_merge_size * c.spatial_merge_size;
  const bool bias = ends(".bias");
  if (ends("patch_embedding.weight")) {
    return {H, c.num_channels, c.temporal_patch_size, c.patch_size, c.patch_size};
  }
  if (name.find("mlp.fc1") != std::string::npos) return bias ? std::vector<int64_t>{F} : std::vector<int64_t>{F, H};
  if (name.find("mlp.fc2") != std::string::npos) return bias ? std::vector<int64_t>{H} : std::vector<int64_t>{H, F};
  if (name.find("self_attn") != std::string::npos) return bias ? std::vector<int64_t>{H} : std::vector<int64_t>{H, H};
  if (name.find("multi_modal_projector.linear_1") != std::string::npos) return bias ? std::vector<int64_t>{P} : std::vector<int64_t>{P, H};
  if (name.find("multi_modal_projector.linear_2") != std::string::npos) return bias ? std::vector<int64_t>{P} : std::vector<int64_t>{P, P};
  if (name.find("patch_merge_mlp.linear_1") != std::string::npos) return bias ? std::vector<int64_t>{T} : std::vector<int64_t>{T, M2 * P};
  if (name.find("patch_merge_mlp.linear_2") != std::string::npos) return bias ? std::vector<int64_t>{T} : std::vector<int64_t>{T, T};
  return {H};  // layer norms
}

// Random weights: linears ~ N(0, 1/fan_in) so activations stay O(1); norms near 1 / 0.
inline void add_random_vision_weights(MemoryWeightSource& src, const VisionConfig& c, uint32_t seed,
                                      const std::string& prefix = "") {
  std::mt19937 rng(seed);
  for (const std::string& name : vision_weight_names(c, prefix)) {
    HostTensorF32 t;
    t.shape = vision_weight_shape(c, name);
    t.data.resize(size_t(t.numel()));
    const bool norm = name.find("norm") != std::string::npos || name.find("layrnorm") != std::string::npos;
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    const int64_t fan_in = t.shape.size() >= 2 ? t.numel() / t.shape[0] : 1;
    std::normal_distribution<float> d(0.0f, norm || bias ? 0.1f : 1.0f / std::sqrt(float(fan_in)));
    for (float& v : t.data) v = (norm && !bias ? 1.0f : 0.0f) + d(rng);
    src.tensors[name] = std::move(t);
  }
}

}  // namespace m3::testing

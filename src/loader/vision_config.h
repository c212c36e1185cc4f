// The vision side of a MiniMax-M3 checkpoint (m3-architecture.md §1.4, §6; docs/vision.md):
// config.json's `vision_config` and projector fields, and preprocessor_config.json's image
// statistics and pixel bounds. A config.json without `vision_config` has no vision tower.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"

namespace m3 {

struct VisionConfig {
  // vision_config
  int64_t hidden_size = 1280;
  int64_t num_attention_heads = 16;
  int64_t num_hidden_layers = 32;
  int64_t intermediate_size = 5120;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  int64_t num_channels = 3;
  double layer_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Top level: the projector's width; its merge MLP ends in the text model's hidden size.
  int64_t projector_hidden_size = 6144;
  int64_t text_hidden_size = 6144;
  // preprocessor_config.json (the M3 processor's defaults where the file is absent or silent).
  int64_t min_pixels = 3136;
  int64_t max_pixels = 451584;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t patch_values() const {
    return num_channels * temporal_patch_size * patch_size * patch_size;
  }
  // 3-D RoPE: each of t, h, w gets this many head dims (even); the rest of the head passes.
  int64_t rope_axis_dims() const { return (head_dim() / 3) / 2 * 2; }

  Status validate() const;
};

// nullopt when config.json has no vision_config. `preprocessor_json` may be empty (no file).
Result<std::optional<VisionConfig>> parse_vision_config(const std::string& config_json,
                                                        const std::string& preprocessor_json,
                                                        const std::string& source);
// Reads <model_dir>/config.json and, when present, <model_dir>/preprocessor_config.json.
Result<std::optional<VisionConfig>> load_vision_config(const std::string& model_dir);

}  // namespace m3

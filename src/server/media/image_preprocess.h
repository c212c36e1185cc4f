// RGB image -> the vision tower's input, as Hugging Face's Qwen2VLImageProcessor computes it (the
// MiniMax-M3 processor uses it; docs/vision.md):
//  1. smart_resize: both sides to multiples of factor = patch_size * merge_size (28), the area
//     within [min_pixels, max_pixels], the aspect ratio kept; an aspect ratio above 200 is refused;
//  2. antialiased bicubic resize of the 8-bit image exactly as torchvision does it on a uint8
//     tensor (bicubic_resize.h), the processor's default backend;
//  3. rescale and normalise fused, as the processor does: (x - 255 mean) / (255 std) in float32;
//  4. the single frame repeated to temporal_patch_size, cut into patches of
//     channels * temporal_patch_size * patch_size^2 values ((c, t, y, x) order, the Conv3d
//     weight's), the patches in merge-window order (t, h/m, w/m, m, m).
// The grid is (t, h, w) = (1, H / patch, W / patch); the prompt gets t*h*w / merge^2 image tokens.
#pragma once

#include <array>
#include <optional>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "server/media/image_decode.h"

namespace m3::server {

struct VisionPreprocessConfig {
  int32_t patch_size = 14;
  int32_t temporal_patch_size = 2;
  int32_t merge_size = 2;
  int64_t min_pixels = 3136;     // 4 * 28^2
  int64_t max_pixels = 451584;   // 672^2 (the M3 processor's override)
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
  int32_t factor() const { return patch_size * merge_size; }
  int32_t patch_values() const { return 3 * temporal_patch_size * patch_size * patch_size; }
};

// Per-request overrides (vLLM's mm_processor_kwargs: min_pixels, max_pixels).
struct PreprocessOverrides {
  std::optional<int64_t> min_pixels;
  std::optional<int64_t> max_pixels;
};

struct ResizedSize {
  int64_t height = 0;
  int64_t width = 0;
};

// HF's smart_resize (Python's round() is round-half-to-even, reproduced), or the 400 to send
// when the aspect ratio is over 200.
std::variant<ResizedSize, ApiError> smart_resize(int64_t height, int64_t width, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels,
                                                 const std::string& param);

struct PixelPatches {
  int32_t grid_t = 0, grid_h = 0, grid_w = 0;
  int32_t patch_values = 0;   // values per patch (1176 for M3)
  std::vector<float> values;  // [grid_t * grid_h * grid_w, patch_values]
  uint64_t content_hash = 0;  // of the values and the grid: equal inputs to the tower
  int32_t num_patches() const { return grid_t * grid_h * grid_w; }
  // Image tokens in the prompt (one per merge window).
  int32_t num_tokens(int32_t merge_size) const {
    return num_patches() / (merge_size * merge_size);
  }
};

std::variant<PixelPatches, ApiError> preprocess_image(const RgbImage& image,
                                                      const VisionPreprocessConfig& config,
                                                      const PreprocessOverrides& overrides,
                                                      const std::string& param);

}  // namespace m3::server

#include "server/media/image_preprocess.h"

#include <xxhash.h>

#include <cmath>

#include "server/media/bicubic_resize.h"

namespace m3::server {

namespace {

// Python's round(): to nearest, ties to even (nearbyint in the default rounding mode).
int64_t round_half_even(double x) { return int64_t(std::nearbyint(x)); }

}  // namespace

std::variant<ResizedSize, ApiError> smart_resize(int64_t height, int64_t width, int64_t factor,
                                                 int64_t min_pixels, int64_t max_pixels,
                                                 const std::string& param) {
  if (height <= 0 || width <= 0) {
    return bad_request("The image has an empty size.", param, "invalid_image");
  }
  const double ratio = double(std::max(height, width)) / double(std::min(height, width));
  if (ratio > 200.0) {
    return bad_request("The image is " + std::to_string(width) + " x " + std::to_string(height) +
                           ": its aspect ratio " + std::to_string(ratio) +
                           " is above 200, which the image processor refuses.",
                       param, "invalid_image");
  }
  // Each side rounded to a multiple of factor with no lower bound, as transformers' smart_resize
  // does: a side under factor / 2 rounds to 0, the area is then below min_pixels and that branch
  // scales both sides up (transformers 5.17, tests/fixtures/vision_golden: an 8 x 600 image
  // becomes 28 x 504, grid 2 x 36).
  int64_t h = round_half_even(double(height) / double(factor)) * factor;
  int64_t w = round_half_even(double(width) / double(factor)) * factor;
  if (h * w > max_pixels) {
    const double beta = std::sqrt(double(height * width) / double(max_pixels));
    h = std::max<int64_t>(factor, int64_t(std::floor(double(height) / beta / double(factor))) * factor);
    w = std::max<int64_t>(factor, int64_t(std::floor(double(width) / beta / double(factor))) * factor);
  } else if (h * w < min_pixels) {
    const double beta = std::sqrt(double(min_pixels) / double(height * width));
    h = int64_t(std::ceil(double(height) * beta / double(factor))) * factor;
    w = int64_t(std::ceil(double(width) * beta / double(factor))) * factor;
  }
  // Unreachable with min_pixels >= 1 (a side rounded to 0 leaves the area below it), but a zero
  // side must never reach the resize.
  if (h < factor || w < factor) {
    return bad_request("The image cannot be resized to at least one " + std::to_string(factor) +
                           "-pixel block per side with min_pixels " + std::to_string(min_pixels) + ".",
                       param, "invalid_image");
  }
  return ResizedSize{h, w};
}

std::variant<PixelPatches, ApiError> preprocess_image(const RgbImage& image,
                                                      const VisionPreprocessConfig& config,
                                                      const PreprocessOverrides& overrides,
                                                      const std::string& param) {
  const int64_t max_pixels = overrides.max_pixels.value_or(config.max_pixels);
  // A requested max_pixels below the configured minimum lowers the minimum with it; a requested
  // min_pixels above the maximum is refused (it would upscale without bound).
  const int64_t min_pixels = overrides.min_pixels.value_or(std::min(config.min_pixels, max_pixels));
  if (min_pixels > max_pixels) {
    return bad_request("min_pixels (" + std::to_string(min_pixels) + ") is above max_pixels (" +
                           std::to_string(max_pixels) + ") for this image.",
                       "mm_processor_kwargs.min_pixels");
  }
  auto size = smart_resize(image.height, image.width, config.factor(), min_pixels, max_pixels,
                           param);
  if (auto* e = std::get_if<ApiError>(&size)) return *e;
  const ResizedSize rs = std::get<ResizedSize>(size);
  const RgbImage resized = resize_bicubic(image, int32_t(rs.width), int32_t(rs.height));

  // Rescale and normalise fused as the processor does it: (x - 255 mean) / (255 std), with
  // 255 mean and 255 std formed in float32 and the expression evaluated in float32.
  const int H = resized.height, W = resized.width;
  std::vector<float> plane(size_t(3) * H * W);  // [c, y, x]
  for (int c = 0; c < 3; ++c) {
    const float m = config.mean[size_t(c)] * 255.0f, s = config.std[size_t(c)] * 255.0f;
    for (size_t i = 0; i < size_t(H) * W; ++i) {
      plane[size_t(c) * H * W + i] = (float(resized.pixels[i * 3 + size_t(c)]) - m) / s;
    }
  }

  const int P = config.patch_size, M = config.merge_size, T = config.temporal_patch_size;
  PixelPatches out;
  out.grid_t = 1;  // one frame, repeated to fill the temporal patch
  out.grid_h = H / P;
  out.grid_w = W / P;
  out.patch_values = config.patch_values();
  out.values.resize(size_t(out.num_patches()) * out.patch_values);
  float* dst = out.values.data();
  for (int bh = 0; bh < out.grid_h / M; ++bh) {
    for (int bw = 0; bw < out.grid_w / M; ++bw) {
      for (int mh = 0; mh < M; ++mh) {
        for (int mw = 0; mw < M; ++mw) {
          const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int c = 0; c < 3; ++c) {
            for (int t = 0; t < T; ++t) {
              for (int py = 0; py < P; ++py) {
                const float* row = &plane[(size_t(c) * H + size_t(y0 + py)) * W + size_t(x0)];
                for (int px = 0; px < P; ++px) *dst++ = row[px];
              }
            }
          }
        }
      }
    }
  }
  const int32_t grid[3] = {out.grid_t, out.grid_h, out.grid_w};
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, grid, sizeof grid);
  XXH3_64bits_update(st, out.values.data(), out.values.size() * sizeof(float));
  out.content_hash = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return out;
}

}  // namespace m3::server

// Test images made with the same libraries the decoder uses (so tests need no binary fixtures).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3::server::testing {

// A deterministic RGB pattern, [h, w, 3].
std::vector<uint8_t> pattern_rgb(int w, int h, uint32_t seed = 1);

// PNG of `channels` (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) 8-bit samples.
std::string encode_png(int w, int h, int channels, const std::vector<uint8_t>& samples);
// 8-bit palette PNG: indices [h, w] into `palette` (RGB triples), with an optional tRNS chunk.
std::string encode_png_palette(int w, int h, const std::vector<uint8_t>& indices,
                               const std::vector<uint8_t>& palette, bool with_trns);
// A PNG whose IHDR declares w x h but whose data is one tiny IDAT (a decompression "bomb" that a
// decoder must refuse from the header).
std::string png_declaring(uint32_t w, uint32_t h);
// Baseline JPEG (quality 95) of RGB samples, optionally with an EXIF orientation tag.
std::string encode_jpeg(int w, int h, const std::vector<uint8_t>& rgb, int exif_orientation = 0);
std::string encode_jpeg_gray(int w, int h, const std::vector<uint8_t>& gray);
std::string encode_webp(int w, int h, const std::vector<uint8_t>& rgb, bool lossless);
// GIF89a with a global palette; indices [h, w].
std::string encode_gif(int w, int h, const std::vector<uint8_t>& indices,
                       const std::vector<uint8_t>& palette);
std::string base64(const std::string& in);

}  // namespace m3::server::testing

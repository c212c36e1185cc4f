// Pre-processing as Hugging Face's Qwen2VLImageProcessor: smart_resize grids and image-token
// counts, torchvision's uint8 bicubic resize arithmetic, rescale/normalise and the patch layout.
//
// Expected grids come from the documented smart_resize formula evaluated in Python (round() is
// half-to-even). Pixel-exact goldens from transformers + PIL itself are pending (no Python
// imaging stack on the build machines); until then the resize is checked against values derived
// by hand from PIL's algorithm and against a double-precision convolution within a derived bound.
#include <gtest/gtest.h>

#include <cmath>

#include "image_fixtures.h"
#include "server/media/image_preprocess.h"
#include "server/media/bicubic_resize.h"

namespace m3::server {
namespace {

using namespace testing;

const VisionPreprocessConfig kM3{};  // patch 14, merge 2, 3136..451584 pixels, CLIP mean/std

RgbImage decoded(const std::string& bytes) {
  auto r = decode_image(bytes, ImageLimits{}, "p");
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::holds_alternative<RgbImage>(r) ? std::get<RgbImage>(r) : RgbImage{};
}

PixelPatches patches(const RgbImage& img, PreprocessOverrides o = {}) {
  auto r = preprocess_image(img, kM3, o, "p");
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::holds_alternative<PixelPatches>(r) ? std::get<PixelPatches>(r) : PixelPatches{};
}

struct GridCase {
  const char* what;
  std::string bytes;
  int grid_h, grid_w, tokens;
};

TEST(ImagePreprocess, GridsAndTokenCountsFollowSmartResize) {
  auto rgb = [](int w, int h) { return pattern_rgb(w, h); };
  std::vector<uint8_t> gray(300 * 800, 77), rgba;
  for (size_t i = 0; i < size_t(1000) * 700; ++i) rgba.insert(rgba.end(), {1, 2, 3, 200});
  std::vector<uint8_t> idx(size_t(224) * 224, 1);
  const GridCase cases[] = {
      // width x height -> smart_resize (h, w) -> grid (h/14, w/14), tokens h*w/28^2
      {"1x1 png", encode_png(1, 1, 3, rgb(1, 1)), 4, 4, 4},                  // up to 56 x 56
      {"27x500 png", encode_png(27, 500, 3, rgb(27, 500)), 36, 2, 18},       // 504 x 28
      {"224x224 palette png", encode_png_palette(224, 224, idx, {0, 0, 0, 9, 9, 9}, false), 16, 16,
       64},
      {"1000x700 rgba png", encode_png(1000, 700, 4, rgba), 40, 56, 560},    // 560 x 784
      {"4000x3000 gray jpeg", encode_jpeg_gray(4000, 3000, std::vector<uint8_t>(12000000, 90)), 40,
       54, 540},  // 560 x 756
      {"300x800 gray png (portrait)", encode_png(300, 800, 1, gray), 58, 22, 319},  // 812 x 308
      {"42x70 (ties round to even)", encode_png(42, 70, 3, rgb(42, 70)), 4, 4, 4},
      // The 1-pixel side rounds to 0, so the area is below min_pixels and both sides are scaled
      // by sqrt(3136 / 200): (ceil(3.96 / 28), ceil(791.9 / 28)) * 28 = (28, 812), as
      // transformers' smart_resize gives (tests/fixtures/vision_golden: 8 x 600 -> 28 x 504).
      {"200x1 (aspect ratio 200 is allowed)", encode_png(200, 1, 3, rgb(200, 1)), 2, 58, 29},
      // EXIF orientation 6 turns the 40x30 landscape into a 30x40 portrait: (h, w) = (84, 56).
      {"40x30 jpeg, exif rotated", encode_jpeg(40, 30, rgb(40, 30), 6), 6, 4, 6},
      {"40x30 jpeg", encode_jpeg(40, 30, rgb(40, 30)), 4, 6, 6},
      {"37x23 webp lossless", encode_webp(37, 23, rgb(37, 23), true), 4, 6, 6},
      {"33x17 webp lossy", encode_webp(33, 17, rgb(33, 17), false), 4, 6, 6},
      {"64x48 gif", encode_gif(64, 48, std::vector<uint8_t>(64 * 48, 0), {5, 6, 7}), 4, 4, 4},
  };
  for (const GridCase& c : cases) {
    PixelPatches p = patches(decoded(c.bytes));
    EXPECT_EQ(p.grid_t, 1) << c.what;
    EXPECT_EQ(p.grid_h, c.grid_h) << c.what;
    EXPECT_EQ(p.grid_w, c.grid_w) << c.what;
    EXPECT_EQ(p.num_tokens(2), c.tokens) << c.what;
    EXPECT_EQ(p.patch_values, 1176) << c.what;
    EXPECT_EQ(p.values.size(), size_t(c.grid_h) * c.grid_w * 1176) << c.what;
  }
}

TEST(ImagePreprocess, PerRequestPixelBounds) {
  RgbImage img = decoded(encode_png(1000, 700, 3, pattern_rgb(1000, 700)));
  // max_pixels 200000 -> (364, 532); min 1e6 / max 2e6 -> (840, 1204) (Python's smart_resize).
  PixelPatches small = patches(img, {std::nullopt, 200000});
  EXPECT_EQ(small.grid_h * 14, 364);
  EXPECT_EQ(small.grid_w * 14, 532);
  PixelPatches big = patches(img, {1000000, 2000000});
  EXPECT_EQ(big.grid_h * 14, 840);
  EXPECT_EQ(big.grid_w * 14, 1204);
}

TEST(ImagePreprocess, ExtremeAspectRatioIsA400) {
  for (auto [w, h] : {std::pair{100000, 1}, std::pair{201, 1}, std::pair{1, 300}}) {
    RgbImage img{w, h, std::vector<uint8_t>(size_t(w) * h * 3, 9)};
    auto r = preprocess_image(img, kM3, {}, "messages[0].content[0].image_url.url");
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << w << "x" << h;
    const ApiError& e = std::get<ApiError>(r);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[0].content[0].image_url.url");
    EXPECT_NE(e.message.find("aspect ratio"), std::string::npos) << e.message;
  }
}

// torchvision's uint8 arithmetic, derived by hand for a 2x1 -> 4x1 upscale of [0, 255] (scale 0.5,
// support 2): output 0: taps at source 0, 1 with kernel(0.25) = 0.8671875, kernel(1.25) =
//   -0.0703125, normalised 1.0882, -0.0882 -> 255 * -0.0882 < 0 -> clamped to 0;
// output 1: kernel(-0.25) = 0.8671875, kernel(0.75) = 0.2265625, normalised weight of 255 is
//   0.2071429. The largest weight, 1.0882, leaves 14 fraction bits in int16 (1.0882 * 2^15 does
//   not fit), so the weight is int(0.5 + 0.2071429 * 2^14) = 3394 and (255 * 3394 + 2^13) >> 14
//   = 53; outputs 2, 3 mirror them: 202, 255.
TEST(BicubicResize, HandDerivedUpscale) {
  EXPECT_DOUBLE_EQ(keys_bicubic_kernel(0.25), 0.8671875);
  EXPECT_DOUBLE_EQ(keys_bicubic_kernel(1.25), -0.0703125);
  EXPECT_DOUBLE_EQ(keys_bicubic_kernel(0.75), 0.2265625);
  EXPECT_EQ(keys_bicubic_kernel(2.0), 0.0);
  RgbImage in{2, 1, {0, 0, 0, 255, 255, 255}};
  RgbImage out = resize_bicubic(in, 4, 1);
  ASSERT_EQ(out.width, 4);
  const uint8_t want[4] = {0, 53, 202, 255};
  for (int x = 0; x < 4; ++x) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(out.pixels[size_t(x) * 3 + c], want[x]) << x;
  }
  // A 2x downscale of a pair averages it (support 4 covers both, equal weights), rounding half up.
  RgbImage pair{2, 1, {10, 11, 0, 20, 20, 255}};
  RgbImage one = resize_bicubic(pair, 1, 1);
  EXPECT_EQ(one.pixels, (std::vector<uint8_t>{15, 16, 128}));
  // Same size: untouched; constant images stay constant through both passes.
  EXPECT_EQ(resize_bicubic(pair, 2, 1).pixels, pair.pixels);
  RgbImage flat{50, 31, std::vector<uint8_t>(50 * 31 * 3, 201)};
  for (auto [w, h] : {std::pair{17, 90}, std::pair{112, 28}, std::pair{3, 3}}) {
    RgbImage r = resize_bicubic(flat, w, h);
    for (uint8_t v : r.pixels) ASSERT_EQ(v, 201);
  }
}

// The same separable convolution in double precision with no rounding between the passes.
std::vector<double> reference_resize(const RgbImage& in, int ow, int oh, double* max_vsum) {
  auto taps = [](int in_size, int out_size, std::vector<std::vector<std::pair<int, double>>>& t) {
    const double scale = double(in_size) / out_size, fs = std::max(1.0, scale), sup = 2 * fs;
    t.assign(size_t(out_size), {});
    for (int i = 0; i < out_size; ++i) {
      const double center = (i + 0.5) * scale;
      const int lo = std::max(0, int(center - sup + 0.5));
      const int hi = std::min(in_size, int(center + sup + 0.5));
      double sum = 0;
      for (int k = lo; k < hi; ++k) sum += keys_bicubic_kernel((k - center + 0.5) / fs);
      for (int k = lo; k < hi; ++k) t[size_t(i)].push_back({k, keys_bicubic_kernel((k - center + 0.5) / fs) / sum});
    }
  };
  std::vector<std::vector<std::pair<int, double>>> th, tv;
  taps(in.width, ow, th);
  taps(in.height, oh, tv);
  *max_vsum = 0;
  for (auto& row : tv) {
    double s = 0;
    for (auto& [k, w] : row) s += std::fabs(w);
    *max_vsum = std::max(*max_vsum, s);
  }
  std::vector<double> mid(size_t(in.height) * ow * 3), out(size_t(oh) * ow * 3);
  for (int y = 0; y < in.height; ++y)
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (auto& [k, w] : th[size_t(x)]) s += w * in.pixels[(size_t(y) * in.width + k) * 3 + c];
        mid[(size_t(y) * ow + x) * 3 + c] = s;
      }
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (auto& [k, w] : tv[size_t(y)]) s += w * mid[(size_t(k) * ow + x) * 3 + c];
        out[(size_t(y) * ow + x) * 3 + c] = s;
      }
  return out;
}

TEST(BicubicResize, WithinRoundingOfTheExactConvolution) {
  // A smooth image in 64..192: bicubic overshoot stays inside 0..255, so nothing clips and the only
  // differences from the exact convolution are the roundings: the 8-bit intermediate (<= 0.5,
  // carried through the vertical weights, sum|w| = S), the final rounding (<= 0.5) and the int16
  // weights (<= 255 * taps * 2^-(bits + 1) per pass: 0.03 for an upscale's 4 taps at 14 bits; a
  // downscale's many taps are small and get 16-17 bits; carried through S on the second pass).
  // Bound: 0.5 * S + 0.5 + 0.1.
  const int W = 97, H = 61;
  RgbImage img{W, H, std::vector<uint8_t>(size_t(W) * H * 3)};
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c)
        img.pixels[(size_t(y) * W + x) * 3 + c] =
            uint8_t(128 + 60 * std::sin(0.21 * x + 0.5 * c) * std::cos(0.17 * y - 0.3 * c));
  for (auto [ow, oh] : {std::pair{56, 28}, std::pair{224, 140}, std::pair{84, 112}, std::pair{30, 61}}) {
    double S = 0;
    std::vector<double> ref = reference_resize(img, ow, oh, &S);
    RgbImage got = resize_bicubic(img, ow, oh);
    const double bound = 0.5 * S + 0.5 + 0.1;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(got.pixels[i] - ref[i]));
    EXPECT_LE(worst, bound) << ow << "x" << oh;
  }
}

TEST(ImagePreprocess, NormalisationAndPatchLayout) {
  // 56 x 56 needs no resize: pixel (x, y) has R = x, G = y, B = 3x mod 256.
  RgbImage img{56, 56, std::vector<uint8_t>(56 * 56 * 3)};
  for (int y = 0; y < 56; ++y)
    for (int x = 0; x < 56; ++x) {
      uint8_t* p = &img.pixels[(size_t(y) * 56 + x) * 3];
      p[0] = uint8_t(x), p[1] = uint8_t(y), p[2] = uint8_t(3 * x);
    }
  PixelPatches p = patches(img);
  ASSERT_EQ(p.grid_h, 4);
  ASSERT_EQ(p.grid_w, 4);
  // Merge-window order: patch index = ((bh * 2 + bw) * 2 + mh) * 2 + mw over the 2x2 windows.
  for (int bh = 0; bh < 2; ++bh)
    for (int bw = 0; bw < 2; ++bw)
      for (int mh = 0; mh < 2; ++mh)
        for (int mw = 0; mw < 2; ++mw) {
          const int patch = ((bh * 2 + bw) * 2 + mh) * 2 + mw;
          const int y0 = (bh * 2 + mh) * 14, x0 = (bw * 2 + mw) * 14;
          for (int c = 0; c < 3; ++c)
            for (int t = 0; t < 2; ++t)  // the frame repeated
              for (int py = 0; py < 14; py += 5)
                for (int px = 0; px < 14; px += 3) {
                  const uint8_t v = img.pixels[(size_t(y0 + py) * 56 + x0 + px) * 3 + c];
                  // The processor's fused rescale + normalise, in float32.
                  const float want = (float(v) - kM3.mean[size_t(c)] * 255.0f) /
                                     (kM3.std[size_t(c)] * 255.0f);
                  const size_t at = size_t(patch) * 1176 + ((size_t(c) * 2 + t) * 14 + py) * 14 + px;
                  ASSERT_EQ(p.values[at], want) << patch << " " << c << " " << t;
                }
        }
}

TEST(ImagePreprocess, ContentHashSeparatesImages) {
  RgbImage a = decoded(encode_png(60, 60, 3, pattern_rgb(60, 60, 1)));
  RgbImage b = a;
  b.pixels[100] ^= 0x40;
  EXPECT_EQ(patches(a).content_hash, patches(a).content_hash);
  EXPECT_NE(patches(a).content_hash, patches(b).content_hash);
  // The same picture at another size is another input to the tower.
  EXPECT_NE(patches(a).content_hash, patches(a, {std::nullopt, 1000}).content_hash);  // 28 x 28
}

}  // namespace
}  // namespace m3::server

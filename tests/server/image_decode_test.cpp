// Image decoding: colour conversion as PIL's convert("RGB"), EXIF orientation, and the refusals
// (limits from the header before decoding, corrupt data) as 400s. Images are made here with the
// same libraries.
#include <gtest/gtest.h>

#include <cstdlib>

#include "image_fixtures.h"
#include "server/media/image_decode.h"

namespace m3::server {
namespace {

using namespace testing;

RgbImage ok(const std::variant<RgbImage, ApiError>& r) {
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << e->message;
  return std::holds_alternative<RgbImage>(r) ? std::get<RgbImage>(r) : RgbImage{};
}

ApiError refused(const std::variant<RgbImage, ApiError>& r) {
  EXPECT_TRUE(std::holds_alternative<ApiError>(r));
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return a.empty() ? 0 : s / double(a.size());
}

const ImageLimits kLimits{};

TEST(ImageDecode, PngRgbIsExact) {
  auto rgb = pattern_rgb(37, 23);
  RgbImage img = ok(decode_image(encode_png(37, 23, 3, rgb), kLimits, "p"));
  EXPECT_EQ(img.width, 37);
  EXPECT_EQ(img.height, 23);
  EXPECT_EQ(img.pixels, rgb);
}

TEST(ImageDecode, PngAlphaIsDroppedNotComposited) {
  auto rgb = pattern_rgb(9, 7);
  std::vector<uint8_t> rgba;
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgba.insert(rgba.end(), {rgb[i], rgb[i + 1], rgb[i + 2], uint8_t(i % 256)});
  }
  EXPECT_EQ(ok(decode_image(encode_png(9, 7, 4, rgba), kLimits, "p")).pixels, rgb);
}

TEST(ImageDecode, GrayAndGrayAlphaAreReplicated) {
  std::vector<uint8_t> gray(6 * 5), ga;
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t(i * 37);
  for (uint8_t g : gray) ga.insert(ga.end(), {g, uint8_t(255 - g)});
  std::vector<uint8_t> want;
  for (uint8_t g : gray) want.insert(want.end(), {g, g, g});
  EXPECT_EQ(ok(decode_image(encode_png(6, 5, 1, gray), kLimits, "p")).pixels, want);
  EXPECT_EQ(ok(decode_image(encode_png(6, 5, 2, ga), kLimits, "p")).pixels, want);
  // JPEG grayscale is lossy, but still three equal channels.
  RgbImage j = ok(decode_image(encode_jpeg_gray(6, 5, gray), kLimits, "p"));
  for (size_t i = 0; i < j.pixels.size(); i += 3) {
    EXPECT_EQ(j.pixels[i], j.pixels[i + 1]);
    EXPECT_EQ(j.pixels[i], j.pixels[i + 2]);
  }
}

TEST(ImageDecode, PaletteIsLookedUpIgnoringTransparency) {
  std::vector<uint8_t> palette = {10, 20, 30, 200, 100, 0, 0, 255, 7};
  std::vector<uint8_t> idx = {0, 1, 2, 2, 1, 0};
  std::vector<uint8_t> want;
  for (uint8_t i : idx) want.insert(want.end(), palette.begin() + i * 3, palette.begin() + i * 3 + 3);
  EXPECT_EQ(ok(decode_image(encode_png_palette(3, 2, idx, palette, true), kLimits, "p")).pixels,
            want);
  EXPECT_EQ(ok(decode_image(encode_gif(3, 2, idx, palette), kLimits, "p")).pixels, want);
}

TEST(ImageDecode, WebpLosslessExactLossyClose) {
  auto rgb = pattern_rgb(40, 30);
  EXPECT_EQ(ok(decode_image(encode_webp(40, 30, rgb, true), kLimits, "p")).pixels, rgb);
  RgbImage lossy = ok(decode_image(encode_webp(40, 30, rgb, false), kLimits, "p"));
  EXPECT_EQ(lossy.width, 40);
  // Quality 90 on a smooth pattern: a few levels of error on average (bounded loosely; the check
  // is that the decode is the same picture, not the codec's quality).
  EXPECT_LT(mean_abs_diff(lossy.pixels, rgb), 12.0);
}

TEST(ImageDecode, JpegIsThePicture) {
  auto rgb = pattern_rgb(64, 48);
  RgbImage img = ok(decode_image(encode_jpeg(64, 48, rgb), kLimits, "p"));
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 48);
  EXPECT_LT(mean_abs_diff(img.pixels, rgb), 12.0);
}

// Four flat 16x16 quadrants (JPEG keeps flat blocks nearly exact): which colour lands in the
// top-left corner tells the orientation that was applied.
std::vector<uint8_t> quadrants(int w, int h) {
  const uint8_t c[4][3] = {{250, 0, 0}, {0, 250, 0}, {0, 0, 250}, {250, 250, 250}};
  std::vector<uint8_t> out(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const int q = (y >= h / 2) * 2 + (x >= w / 2);  // 0 TL red, 1 TR green, 2 BL blue, 3 BR white
      std::copy(c[q], c[q] + 3, &out[(size_t(y) * w + x) * 3]);
    }
  }
  return out;
}

int corner_colour(const RgbImage& img, int x, int y) {
  const uint8_t* p = &img.pixels[(size_t(y) * img.width + x) * 3];
  if (p[0] > 200 && p[1] > 200) return 3;
  if (p[0] > 200) return 0;
  if (p[1] > 200) return 1;
  return 2;
}

TEST(ImageDecode, JpegExifOrientationIsApplied) {
  const int W = 32, H = 16;  // landscape so that a transposition shows in the size
  auto q = quadrants(W, H);
  // Expected (top-left, top-right) quadrant after PIL's exif_transpose, per orientation.
  struct Case { int orientation, w, h, tl, tr; };
  const Case cases[] = {{1, W, H, 0, 1}, {2, W, H, 1, 0}, {3, W, H, 3, 2}, {4, W, H, 2, 3},
                        {5, H, W, 0, 2}, {6, H, W, 2, 0}, {7, H, W, 3, 1}, {8, H, W, 1, 3}};
  for (const Case& c : cases) {
    RgbImage img = ok(decode_image(encode_jpeg(W, H, q, c.orientation), kLimits, "p"));
    EXPECT_EQ(img.width, c.w) << "orientation " << c.orientation;
    EXPECT_EQ(img.height, c.h) << "orientation " << c.orientation;
    EXPECT_EQ(corner_colour(img, 1, 1), c.tl) << "orientation " << c.orientation;
    EXPECT_EQ(corner_colour(img, img.width - 2, 1), c.tr) << "orientation " << c.orientation;
  }
}

TEST(ImageDecode, ExifParserReadsBothByteOrders) {
  const std::string mm("Exif\0\0MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0", 28);
  EXPECT_EQ(exif_orientation(mm), 6);
  EXPECT_EQ(exif_orientation("Exif"), 1);
  EXPECT_EQ(exif_orientation(std::string("Exif\0\0II\x2a\0\xff\xff\0\0", 14)), 1);  // bad offset
}

TEST(ImageDecode, LimitsAreCheckedFromTheHeader) {
  // 100000 x 100000 declared in a ~100-byte PNG: refused from IHDR, naming the flag.
  ApiError bomb = refused(decode_image(png_declaring(100000, 100000), kLimits, "msg.url"));
  EXPECT_EQ(bomb.status, 400);
  EXPECT_EQ(bomb.code, "image_too_large");
  EXPECT_EQ(bomb.param, "msg.url");
  EXPECT_NE(bomb.message.find("--max-image-pixels"), std::string::npos) << bomb.message;
  EXPECT_NE(bomb.message.find("100000 x 100000"), std::string::npos) << bomb.message;

  auto rgb = pattern_rgb(20, 10);
  ImageLimits small{kLimits.max_bytes, 199};
  for (const std::string& bytes : {encode_png(20, 10, 3, rgb), encode_jpeg(20, 10, rgb),
                                   encode_webp(20, 10, rgb, true)}) {
    ApiError e = refused(decode_image(bytes, small, "p"));
    EXPECT_EQ(e.code, "image_too_large");
    EXPECT_NE(e.message.find("--max-image-pixels"), std::string::npos) << e.message;
  }
  std::vector<uint8_t> idx(200, 0);
  EXPECT_EQ(refused(decode_image(encode_gif(20, 10, idx, {1, 2, 3}), small, "p")).code,
            "image_too_large");
  // Exactly at the limit passes.
  EXPECT_EQ(ok(decode_image(encode_png(20, 10, 3, rgb), ImageLimits{kLimits.max_bytes, 200}, "p"))
                .width,
            20);

  const std::string png = encode_png(20, 10, 3, rgb);
  ApiError big = refused(decode_image(png, ImageLimits{png.size() - 1, kLimits.max_pixels}, "p"));
  EXPECT_EQ(big.code, "image_too_large");
  EXPECT_NE(big.message.find("--max-image-bytes"), std::string::npos) << big.message;
}

TEST(ImageDecode, CorruptDataIsA400) {
  auto rgb = pattern_rgb(50, 40);
  const std::string files[] = {encode_png(50, 40, 3, rgb), encode_jpeg(50, 40, rgb),
                               encode_webp(50, 40, rgb, false), encode_webp(50, 40, rgb, true),
                               encode_gif(50, 40, std::vector<uint8_t>(2000, 1), {0, 0, 0, 9, 9, 9})};
  for (const std::string& f : files) {
    for (size_t keep : {f.size() / 2, size_t(30), size_t(12)}) {
      ApiError e = refused(decode_image(f.substr(0, keep), kLimits, "p"));
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "invalid_image") << e.message;
    }
  }
  EXPECT_EQ(refused(decode_image("", kLimits, "p")).code, "invalid_image");
  EXPECT_EQ(refused(decode_image("BM not an image at all", kLimits, "p")).code, "invalid_image");
  // PNG magic followed by JPEG data.
  std::string wrong = "\x89PNG\r\n\x1a\n" + encode_jpeg(8, 8, pattern_rgb(8, 8));
  EXPECT_EQ(refused(decode_image(wrong, kLimits, "p")).code, "invalid_image");
  // A 100,000 x 1 image is within the pixel limit; decoding works (the aspect ratio is the
  // pre-processor's to refuse).
  std::vector<uint8_t> line(100000 * 3, 128);
  EXPECT_EQ(ok(decode_image(encode_png(100000, 1, 3, line), kLimits, "p")).width, 100000);
}

}  // namespace
}  // namespace m3::server

// Compressed image bytes (PNG, JPEG, WebP, GIF) -> 8-bit RGB pixels, with the limits checked from
// the header BEFORE any pixel is decoded (a small file that declares 100000 x 100000 pixels is
// refused without allocating them).
//
// Colour conversion follows what the Hugging Face image processors get from PIL's
// Image.convert("RGB"): alpha is dropped (not composited), grayscale is replicated to three
// channels, palette indices are looked up (transparency ignored). JPEG EXIF orientation is applied
// (PIL.ImageOps.exif_transpose, which HF's load_image calls). GIF: the first frame only, drawn on
// the logical screen filled with the background colour. 16-bit PNG samples keep their high byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/protocol/errors.h"

namespace m3::server {

struct RgbImage {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3] row-major
};

struct ImageLimits {
  size_t max_bytes = 20u << 20;       // --max-image-bytes: compressed size
  int64_t max_pixels = 89'478'485;    // --max-image-pixels: width * height (PIL's bomb limit)
};

// What the header says, read without decoding pixels.
struct ImageHeader {
  std::string mime;  // "image/png", "image/jpeg", "image/webp", "image/gif"
  int64_t width = 0;
  int64_t height = 0;
};

// The header of `bytes`, or the 400 to send (`param` names the request field).
std::variant<ImageHeader, ApiError> read_image_header(std::string_view bytes,
                                                      const std::string& param);

// Decodes `bytes` to RGB after checking both limits, or returns the 400 to send: code
// "image_too_large" for a limit (the message names the flag), "invalid_image" for anything the
// decoders refuse (truncated data, wrong magic, unsupported variants).
std::variant<RgbImage, ApiError> decode_image(std::string_view bytes, const ImageLimits& limits,
                                              const std::string& param);

// EXIF orientation (1..8) of a JPEG APP1 payload ("Exif\0\0" + TIFF), or 1 when absent/invalid.
int exif_orientation(std::string_view app1_payload);
// Applies an EXIF orientation so the image is upright (PIL's exif_transpose).
RgbImage apply_exif_orientation(RgbImage image, int orientation);

}  // namespace m3::server

#include "image_fixtures.h"

#include <gif_lib.h>
#include <png.h>
#include <webp/encode.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <jpeglib.h>

namespace m3::server::testing {

std::vector<uint8_t> pattern_rgb(int w, int h, uint32_t seed) {
  std::vector<uint8_t> out(size_t(w) * h * 3);
  uint32_t s = seed * 2654435761u + 12345u;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      s = s * 1664525u + 1013904223u;
      uint8_t* p = &out[(size_t(y) * w + x) * 3];
      // Smooth gradients plus a little noise: compresses and resizes like a photograph.
      p[0] = uint8_t((x * 255) / std::max(1, w - 1) ^ ((s >> 28) & 3));
      p[1] = uint8_t((y * 255) / std::max(1, h - 1) ^ ((s >> 24) & 3));
      p[2] = uint8_t(((x + y) * 7 + (s >> 26)) & 255);
    }
  }
  return out;
}

namespace {

void png_write_string(png_structp png, png_bytep data, size_t len) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), len);
}
void png_flush_nothing(png_structp) {}

std::string write_png(int w, int h, int color_type, int channels, const uint8_t* samples,
                      const std::vector<uint8_t>* palette, bool trns) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) throw std::runtime_error("png write failed");
  png_set_write_fn(png, &out, png_write_string, png_flush_nothing);
  png_set_IHDR(png, info, w, h, 8, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> colors;
  if (palette) {
    for (size_t i = 0; i + 2 < palette->size(); i += 3) {
      colors.push_back({(*palette)[i], (*palette)[i + 1], (*palette)[i + 2]});
    }
    png_set_PLTE(png, info, colors.data(), int(colors.size()));
    if (trns) {
      png_byte alpha[1] = {0};
      png_set_tRNS(png, info, alpha, 1, nullptr);
    }
  }
  png_write_info(png, info);
  for (int y = 0; y < h; ++y) {
    png_write_row(png, samples + size_t(y) * w * channels);
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void put_be32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s.push_back(char((v >> (8 * i)) & 0xff));
}

void chunk(std::string& s, const char* type, const std::string& data) {
  put_be32(s, uint32_t(data.size()));
  std::string body = std::string(type, 4) + data;
  s += body;
  put_be32(s, uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))));
}

}  // namespace

std::string encode_png(int w, int h, int channels, const std::vector<uint8_t>& samples) {
  const int types[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                        PNG_COLOR_TYPE_RGBA};
  return write_png(w, h, types[channels], channels, samples.data(), nullptr, false);
}

std::string encode_png_palette(int w, int h, const std::vector<uint8_t>& indices,
                               const std::vector<uint8_t>& palette, bool with_trns) {
  return write_png(w, h, PNG_COLOR_TYPE_PALETTE, 1, indices.data(), &palette, with_trns);
}

std::string png_declaring(uint32_t w, uint32_t h) {
  std::string s("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, w);
  put_be32(ihdr, h);
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB
  chunk(s, "IHDR", ihdr);
  unsigned char zero_rows[64] = {0};
  unsigned char z[128];
  uLongf zn = sizeof z;
  compress(z, &zn, zero_rows, sizeof zero_rows);
  chunk(s, "IDAT", std::string(reinterpret_cast<char*>(z), zn));
  chunk(s, "IEND", "");
  return s;
}

namespace {

std::string write_jpeg(int w, int h, int components, J_COLOR_SPACE space,
                       const std::vector<uint8_t>& samples, int exif_orientation) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = components;
  c.in_color_space = space;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  if (exif_orientation > 0) {
    // "Exif\0\0" + little-endian TIFF: one IFD with one SHORT entry, Orientation (0x0112).
    const unsigned char app1[] = {'E', 'x', 'i', 'f', 0, 0, 'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0,
                                  0x12, 0x01, 3, 0, 1, 0, 0, 0,
                                  static_cast<unsigned char>(exif_orientation), 0, 0, 0,
                                  0, 0, 0, 0};
    jpeg_write_marker(&c, JPEG_APP0 + 1, app1, sizeof app1);
  }
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(samples.data()) + size_t(c.next_scanline) * w * components;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::string out(reinterpret_cast<char*>(buf), size);
  jpeg_destroy_compress(&c);
  free(buf);
  return out;
}

}  // namespace

std::string encode_jpeg(int w, int h, const std::vector<uint8_t>& rgb, int exif_orientation) {
  return write_jpeg(w, h, 3, JCS_RGB, rgb, exif_orientation);
}

std::string encode_jpeg_gray(int w, int h, const std::vector<uint8_t>& gray) {
  return write_jpeg(w, h, 1, JCS_GRAYSCALE, gray, 0);
}

std::string encode_webp(int w, int h, const std::vector<uint8_t>& rgb, bool lossless) {
  uint8_t* out = nullptr;
  size_t n = lossless ? WebPEncodeLosslessRGB(rgb.data(), w, h, w * 3, &out)
                      : WebPEncodeRGB(rgb.data(), w, h, w * 3, 90.0f, &out);
  std::string s(reinterpret_cast<char*>(out), n);
  WebPFree(out);
  return s;
}

namespace {
int gif_write_string(GifFileType* gif, const GifByteType* data, int len) {
  static_cast<std::string*>(gif->UserData)->append(reinterpret_cast<const char*>(data), size_t(len));
  return len;
}
}  // namespace

std::string encode_gif(int w, int h, const std::vector<uint8_t>& indices,
                       const std::vector<uint8_t>& palette) {
  std::string out;
  int err = 0;
  GifFileType* gif = EGifOpen(&out, gif_write_string, &err);
  std::vector<GifColorType> colors(256);
  for (size_t i = 0; i < 256; ++i) {
    if (i * 3 + 2 < palette.size()) colors[i] = {palette[i * 3], palette[i * 3 + 1], palette[i * 3 + 2]};
  }
  ColorMapObject* map = GifMakeMapObject(256, colors.data());
  EGifSetGifVersion(gif, true);
  EGifPutScreenDesc(gif, w, h, 8, 0, map);
  EGifPutImageDesc(gif, 0, 0, w, h, false, nullptr);
  for (int y = 0; y < h; ++y) {
    EGifPutLine(gif, const_cast<GifPixelType*>(indices.data()) + size_t(y) * w, w);
  }
  EGifCloseFile(gif, &err);
  GifFreeMapObject(map);
  return out;
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += t[v >> 18], out += t[(v >> 12) & 63], out += t[(v >> 6) & 63], out += t[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += t[v >> 18], out += t[(v >> 12) & 63], out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += t[v >> 18], out += t[(v >> 12) & 63], out += t[(v >> 6) & 63], out += '=';
  }
  return out;
}

}  // namespace m3::server::testing

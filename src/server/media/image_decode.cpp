#include "server/media/image_decode.h"

#include <gif_lib.h>
#include <png.h>
#include <webp/decode.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <optional>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#include <jerror.h>

#include "server/media/media_policy.h"

namespace m3::server {

namespace {

ApiError invalid(const std::string& param, const std::string& message) {
  return bad_request(message, param, "invalid_image");
}

std::string dims(int64_t w, int64_t h) {
  return std::to_string(w) + " x " + std::to_string(h);
}

// The pixel limit, checked on the header's dimensions before any pixel memory is allocated.
std::optional<ApiError> check_pixels(int64_t w, int64_t h, const ImageLimits& limits,
                                     const std::string& param) {
  if (w <= 0 || h <= 0) {
    return invalid(param, "The image declares an empty size (" + dims(w, h) + ").");
  }
  // Compared by division: w * h of two 32-bit header fields can overflow int64.
  if (w > limits.max_pixels || h > limits.max_pixels || w > limits.max_pixels / h) {
    return bad_request("The image is " + dims(w, h) + " pixels; the limit is " +
                           std::to_string(limits.max_pixels) +
                           " pixels (--max-image-pixels).",
                       param, "image_too_large");
  }
  return std::nullopt;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// ---- PNG (libpng; errors longjmp back to the setjmp in decode_png_rows) ----

struct PngInput {
  const uint8_t* data;
  size_t size;
  size_t at;
  char error[256];
};

void png_read_memory(png_structp png, png_bytep out, size_t len) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
  if (len > in->size - in->at) png_error(png, "the PNG data is truncated");
  std::memcpy(out, in->data + in->at, len);
  in->at += len;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(png));
  std::snprintf(in->error, sizeof in->error, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

// Everything the setjmp frame touches lives here, owned by the caller, so a longjmp skips no
// destructor.
struct PngJob {
  PngInput input{};
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_uint_32 width = 0, height = 0;
  int64_t max_pixels = 0;
  bool too_large = false;
  std::vector<uint8_t>* pixels = nullptr;
  std::vector<png_bytep>* rows = nullptr;
};

// 0 on success; on failure job->input.error says why (or job->too_large is set).
int decode_png_rows(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return 1;
  png_set_read_fn(job->png, &job->input, png_read_memory);
  // libpng's own bound, as a second line behind check_pixels.
  png_set_user_limits(job->png, 0x7fffffff, 0x7fffffff);
  png_read_info(job->png, job->info);
  job->width = png_get_image_width(job->png, job->info);
  job->height = png_get_image_height(job->png, job->info);
  if (job->width == 0 || job->height == 0 || int64_t(job->width) > job->max_pixels ||
      int64_t(job->width) > job->max_pixels / int64_t(job->height)) {
    job->too_large = true;
    return 1;
  }
  const int color = png_get_color_type(job->png, job->info);
  const int depth = png_get_bit_depth(job->png, job->info);
  // convert("RGB"): palette looked up without its transparency, gray replicated, alpha dropped;
  // 16-bit samples keep their high byte (as PIL reads RGB;16B); no gamma correction (PIL applies
  // none).
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(job->png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(job->png);
  if (depth == 16) png_set_strip_16(job->png);
  // libpng's expansions also turn a tRNS chunk into an alpha channel: strip that too.
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(job->png, job->info, PNG_INFO_tRNS)) {
    png_set_strip_alpha(job->png);
  }
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(job->png);
  }
  png_set_interlace_handling(job->png);
  png_read_update_info(job->png, job->info);
  if (png_get_rowbytes(job->png, job->info) != size_t(job->width) * 3) {
    png_error(job->png, "unexpected PNG row layout after conversion to RGB");
  }
  job->pixels->resize(size_t(job->width) * job->height * 3);
  job->rows->resize(job->height);
  for (png_uint_32 y = 0; y < job->height; ++y) {
    (*job->rows)[y] = job->pixels->data() + size_t(y) * job->width * 3;
  }
  png_read_image(job->png, job->rows->data());
  png_read_end(job->png, nullptr);
  return 0;
}

std::variant<RgbImage, ApiError> decode_png(std::string_view bytes, const ImageLimits& limits,
                                            const std::string& param) {
  RgbImage image;
  std::vector<png_bytep> rows;
  PngJob job;
  job.input.data = reinterpret_cast<const uint8_t*>(bytes.data());
  job.input.size = bytes.size();
  job.max_pixels = limits.max_pixels;
  job.pixels = &image.pixels;
  job.rows = &rows;
  job.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job.input, png_on_error, png_on_warning);
  if (!job.png) return invalid(param, "Cannot decode the PNG image (out of memory).");
  job.info = png_create_info_struct(job.png);
  if (!job.info) {
    png_destroy_read_struct(&job.png, nullptr, nullptr);
    return invalid(param, "Cannot decode the PNG image (out of memory).");
  }
  const int rc = decode_png_rows(&job);
  png_destroy_read_struct(&job.png, &job.info, nullptr);
  if (job.too_large) return *check_pixels(job.width, job.height, limits, param);
  if (rc != 0) return invalid(param, std::string("Cannot decode the PNG image: ") + job.input.error + ".");
  image.width = int32_t(job.width);
  image.height = int32_t(job.height);
  return image;
}

// ---- JPEG (libjpeg-turbo; errors longjmp back to decode_jpeg_rows) ----

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// A truncated file is an error (PIL refuses it: "image file is truncated"); libjpeg only warns
// and pads with gray. Other warnings (extraneous bytes) are tolerated, as PIL does.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(cinfo);
}

struct JpegJob {
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  int64_t max_pixels = 0;
  bool too_large = false;
  int64_t width = 0, height = 0;
  int orientation = 1;
  std::vector<uint8_t>* pixels = nullptr;
};

int decode_jpeg_rows(JpegJob* job, const uint8_t* data, size_t size) {
  if (setjmp(job->err.jump)) return 1;
  jpeg_mem_src(&job->cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&job->cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&job->cinfo, TRUE);
  job->width = job->cinfo.image_width;
  job->height = job->cinfo.image_height;
  if (job->width == 0 || job->height == 0 || job->width > job->max_pixels ||
      job->width > job->max_pixels / job->height) {
    job->too_large = true;
    return 1;
  }
  for (jpeg_saved_marker_ptr m = job->cinfo.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1) {
      int o = exif_orientation(
          std::string_view(reinterpret_cast<const char*>(m->data), m->data_length));
      if (o != 1) {
        job->orientation = o;
        break;
      }
    }
  }
  if (job->cinfo.jpeg_color_space == JCS_CMYK || job->cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(job->err.message, sizeof job->err.message,
                  "CMYK JPEG images are not supported; send an RGB or grayscale JPEG");
    return 1;
  }
  job->cinfo.out_color_space = JCS_RGB;  // grayscale is replicated to three channels
  jpeg_start_decompress(&job->cinfo);
  const size_t stride = size_t(job->cinfo.output_width) * 3;
  job->pixels->resize(stride * job->cinfo.output_height);
  while (job->cinfo.output_scanline < job->cinfo.output_height) {
    JSAMPROW row = job->pixels->data() + stride * job->cinfo.output_scanline;
    jpeg_read_scanlines(&job->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&job->cinfo);
  return 0;
}

std::variant<RgbImage, ApiError> decode_jpeg(std::string_view bytes, const ImageLimits& limits,
                                             const std::string& param) {
  RgbImage image;
  JpegJob job;
  job.max_pixels = limits.max_pixels;
  job.pixels = &image.pixels;
  job.cinfo.err = jpeg_std_error(&job.err.mgr);
  job.err.mgr.error_exit = jpeg_on_error;
  job.err.mgr.emit_message = jpeg_on_message;
  jpeg_create_decompress(&job.cinfo);
  const int rc =
      decode_jpeg_rows(&job, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  jpeg_destroy_decompress(&job.cinfo);
  if (job.too_large) return *check_pixels(job.width, job.height, limits, param);
  if (rc != 0) return invalid(param, std::string("Cannot decode the JPEG image: ") + job.err.message + ".");
  image.width = int32_t(job.width);
  image.height = int32_t(job.height);
  return apply_exif_orientation(std::move(image), job.orientation);
}

// ---- WebP ----

std::variant<RgbImage, ApiError> decode_webp(std::string_view bytes, const ImageLimits& limits,
                                             const std::string& param) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(data, bytes.size(), &features) != VP8_STATUS_OK) {
    return invalid(param, "Cannot decode the WebP image: its header is invalid or truncated.");
  }
  if (auto e = check_pixels(features.width, features.height, limits, param)) return *e;
  if (features.has_animation) {
    return invalid(param, "Animated WebP images are not supported; send a still image.");
  }
  RgbImage image;
  image.width = features.width;
  image.height = features.height;
  image.pixels.resize(size_t(image.width) * image.height * 3);
  // RGB output drops alpha without premultiplying, like convert("RGB").
  if (!WebPDecodeRGBInto(data, bytes.size(), image.pixels.data(), image.pixels.size(),
                         image.width * 3)) {
    return invalid(param, "Cannot decode the WebP image: the data is corrupt or truncated.");
  }
  return image;
}

// ---- GIF (first frame) ----

struct GifInput {
  const uint8_t* data;
  size_t size;
  size_t at;
};

int gif_read_memory(GifFileType* gif, GifByteType* out, int len) {
  auto* in = static_cast<GifInput*>(gif->UserData);
  const size_t n = std::min(size_t(std::max(len, 0)), in->size - in->at);
  std::memcpy(out, in->data + in->at, n);
  in->at += n;
  return int(n);
}

std::variant<RgbImage, ApiError> decode_gif(std::string_view bytes, const ImageLimits& limits,
                                            const std::string& param) {
  GifInput input{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0};
  int error = 0;
  GifFileType* gif = DGifOpen(&input, gif_read_memory, &error);
  if (!gif) {
    return invalid(param, std::string("Cannot decode the GIF image: ") + GifErrorString(error) + ".");
  }
  struct Closer {
    GifFileType* g;
    ~Closer() {
      int e = 0;
      DGifCloseFile(g, &e);
    }
  } closer{gif};
  auto gif_failed = [&](const char* what) {
    return invalid(param, std::string("Cannot decode the GIF image: ") + what + " (" +
                              GifErrorString(gif->Error) + ").");
  };
  if (auto e = check_pixels(gif->SWidth, gif->SHeight, limits, param)) return *e;
  int transparent = -1;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return gif_failed("bad record");
    if (type == TERMINATE_RECORD_TYPE) return invalid(param, "The GIF image has no frame.");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) return gif_failed("bad extension");
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return gif_failed("bad extension");
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return gif_failed("bad frame header");
    const GifImageDesc& d = gif->Image;
    if (auto e = check_pixels(d.Width, d.Height, limits, param)) return *e;
    const ColorMapObject* map = d.ColorMap ? d.ColorMap : gif->SColorMap;
    if (!map) return invalid(param, "The GIF image has no colour table.");
    auto color = [&](int index, uint8_t* out) {
      const GifColorType c = index < map->ColorCount ? map->Colors[index] : GifColorType{0, 0, 0};
      out[0] = c.Red, out[1] = c.Green, out[2] = c.Blue;
    };
    RgbImage image;
    image.width = gif->SWidth;
    image.height = gif->SHeight;
    image.pixels.resize(size_t(image.width) * image.height * 3);
    // Outside the first frame: the transparent index when one is declared, else the background.
    uint8_t fill[3];
    color(transparent >= 0 ? transparent : gif->SBackGroundColor, fill);
    for (size_t i = 0; i < image.pixels.size(); i += 3) std::memcpy(&image.pixels[i], fill, 3);
    std::vector<GifPixelType> line(size_t(d.Width));
    auto draw = [&](int row) {
      const int y = d.Top + row;
      if (y < 0 || y >= image.height) return;
      for (int x = 0; x < d.Width; ++x) {
        const int px = d.Left + x;
        if (px < 0 || px >= image.width) continue;
        color(line[size_t(x)], &image.pixels[(size_t(y) * image.width + px) * 3]);
      }
    };
    if (d.Interlace) {
      static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass) {
        for (int row = kStart[pass]; row < d.Height; row += kStep[pass]) {
          if (DGifGetLine(gif, line.data(), d.Width) == GIF_ERROR) return gif_failed("truncated frame");
          draw(row);
        }
      }
    } else {
      for (int row = 0; row < d.Height; ++row) {
        if (DGifGetLine(gif, line.data(), d.Width) == GIF_ERROR) return gif_failed("truncated frame");
        draw(row);
      }
    }
    return image;
  }
}

}  // namespace

int exif_orientation(std::string_view p) {
  if (p.size() < 14 || p.substr(0, 6) != std::string_view("Exif\0\0", 6)) return 1;
  const auto* t = reinterpret_cast<const uint8_t*>(p.data()) + 6;
  const size_t n = p.size() - 6;
  bool little;
  if (t[0] == 'I' && t[1] == 'I') {
    little = true;
  } else if (t[0] == 'M' && t[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? uint32_t(t[at]) | (uint32_t(t[at + 1]) << 8)
                  : (uint32_t(t[at]) << 8) | uint32_t(t[at + 1]);
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? u16(at) | (u16(at + 2) << 16) : (u16(at) << 16) | u16(at + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd + 2 > n) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t e = ifd + 2 + i * 12;
    if (e + 12 > n) return 1;
    if (u16(e) == 0x0112 && u16(e + 2) == 3) {
      const uint32_t v = u16(e + 8);
      return v >= 1 && v <= 8 ? int(v) : 1;
    }
  }
  return 1;
}

RgbImage apply_exif_orientation(RgbImage in, int orientation) {
  if (orientation <= 1 || orientation > 8) return in;
  const int W = in.width, H = in.height;
  const bool swap = orientation >= 5;  // 5..8 exchange width and height
  RgbImage out;
  out.width = swap ? H : W;
  out.height = swap ? W : H;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2: sx = W - 1 - x; break;                      // mirror left-right
        case 3: sx = W - 1 - x, sy = H - 1 - y; break;      // rotate 180
        case 4: sy = H - 1 - y; break;                      // mirror top-bottom
        case 5: sx = y, sy = x; break;                      // transpose
        case 6: sx = y, sy = H - 1 - x; break;              // rotate 90 clockwise
        case 7: sx = W - 1 - y, sy = H - 1 - x; break;      // transverse
        case 8: sx = W - 1 - y, sy = x; break;              // rotate 90 counter-clockwise
        default: break;
      }
      std::memcpy(&out.pixels[(size_t(y) * out.width + x) * 3],
                  &in.pixels[(size_t(sy) * W + sx) * 3], 3);
    }
  }
  return out;
}

std::variant<ImageHeader, ApiError> read_image_header(std::string_view bytes,
                                                      const std::string& param) {
  ImageHeader h;
  h.mime = sniff_image_type(bytes);
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (h.mime == "image/png") {
    if (bytes.size() < 24 || bytes.substr(12, 4) != "IHDR") {
      return invalid(param, "The PNG image is truncated before its IHDR header.");
    }
    h.width = be32(b + 16);
    h.height = be32(b + 20);
  } else if (h.mime == "image/gif") {
    if (bytes.size() < 10) return invalid(param, "The GIF image is truncated before its header.");
    h.width = b[6] | (b[7] << 8);
    h.height = b[8] | (b[9] << 8);
  } else if (h.mime == "image/webp") {
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(b, bytes.size(), &f) != VP8_STATUS_OK) {
      return invalid(param, "Cannot read the WebP image's header.");
    }
    h.width = f.width;
    h.height = f.height;
  } else if (h.mime == "image/jpeg") {
    // Walk the markers to the first start-of-frame; its height and width are the image's.
    size_t at = 2;
    for (;;) {
      while (at < bytes.size() && b[at] == 0xff) ++at;  // fill bytes, then the marker code
      if (at + 3 > bytes.size()) return invalid(param, "The JPEG image has no frame header.");
      const uint8_t marker = b[at];
      if (marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {  // standalone: no length
        ++at;
        continue;
      }
      const size_t len = (size_t(b[at + 1]) << 8) | b[at + 2];
      const bool sof = marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 &&
                       marker != 0xcc;
      if (sof) {
        if (at + 8 > bytes.size()) return invalid(param, "The JPEG frame header is truncated.");
        h.height = (b[at + 4] << 8) | b[at + 5];
        h.width = (b[at + 6] << 8) | b[at + 7];
        break;
      }
      if (len < 2) return invalid(param, "The JPEG image has a malformed marker.");
      at += 1 + len;
    }
  } else {
    return invalid(param, "The image data is not a PNG, JPEG, WebP or GIF image.");
  }
  return h;
}

std::variant<RgbImage, ApiError> decode_image(std::string_view bytes, const ImageLimits& limits,
                                              const std::string& param) {
  if (bytes.empty()) return invalid(param, "The image is empty (0 bytes).");
  if (bytes.size() > limits.max_bytes) {
    return bad_request("The image is " + std::to_string(bytes.size()) +
                           " bytes; the limit is " + std::to_string(limits.max_bytes) +
                           " bytes (--max-image-bytes).",
                       param, "image_too_large");
  }
  auto header = read_image_header(bytes, param);
  if (auto* e = std::get_if<ApiError>(&header)) return *e;
  const ImageHeader& h = std::get<ImageHeader>(header);
  if (auto e = check_pixels(h.width, h.height, limits, param)) return *e;
  if (h.mime == "image/png") return decode_png(bytes, limits, param);
  if (h.mime == "image/jpeg") return decode_jpeg(bytes, limits, param);
  if (h.mime == "image/webp") return decode_webp(bytes, limits, param);
  return decode_gif(bytes, limits, param);
}

}  // namespace m3::server

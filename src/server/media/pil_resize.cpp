#include "server/media/pil_resize.h"

#include <cmath>
#include <cstring>

namespace m3::server {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // leaves headroom for 255 * sum|w| in int32

// Per output index: the first source index, the tap count, and ksize fixed-point weights.
struct Taps {
  int ksize = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  // [out, ksize]
};

Taps compute_taps(int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  Taps t;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.weights.assign(size_t(out_size) * t.ksize, 0);
  std::vector<double> w(size_t(t.ksize));
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    // C casts truncate toward zero; the clamps then keep the window inside the source.
    int lo = int(center - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = int(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int n = hi - lo;
    double sum = 0.0;
    const double inv_scale = 1.0 / filter_scale;  // multiplied, as PIL does (not divided)
    for (int k = 0; k < n; ++k) {
      w[size_t(k)] = pil_bicubic_kernel((k + lo - center + 0.5) * inv_scale);
      sum += w[size_t(k)];
    }
    for (int k = 0; k < n; ++k) {
      const double v = sum != 0.0 ? w[size_t(k)] / sum : w[size_t(k)];
      const double fixed = v * double(1 << kPrecisionBits);
      t.weights[size_t(i) * t.ksize + k] = int32_t(v < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    t.first[size_t(i)] = lo;
    t.count[size_t(i)] = n;
  }
  return t;
}

uint8_t clip8(int32_t acc) {
  if (acc >= (1 << kPrecisionBits << 8)) return 255;
  if (acc <= 0) return 0;
  return uint8_t(acc >> kPrecisionBits);
}

// Rows [row0, row0 + rows) of `in`, resampled along x to `taps`' output width.
RgbImage horizontal(const RgbImage& in, int row0, int rows, int out_w, const Taps& taps) {
  RgbImage out;
  out.width = out_w;
  out.height = rows;
  out.pixels.resize(size_t(out_w) * rows * 3);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = &in.pixels[size_t(row0 + y) * in.width * 3];
    uint8_t* dst = &out.pixels[size_t(y) * out_w * 3];
    for (int x = 0; x < out_w; ++x) {
      const int32_t* k = &taps.weights[size_t(x) * taps.ksize];
      const int lo = taps.first[size_t(x)];
      int32_t acc[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1),
                        1 << (kPrecisionBits - 1)};
      for (int j = 0; j < taps.count[size_t(x)]; ++j) {
        const uint8_t* p = src + size_t(lo + j) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += int32_t(p[c]) * k[j];
      }
      for (int c = 0; c < 3; ++c) dst[x * 3 + c] = clip8(acc[c]);
    }
  }
  return out;
}

// `in` resampled along y; taps' first indices are relative to in's first row (`row0` of the
// source image when the horizontal pass kept only the rows that are read).
RgbImage vertical(const RgbImage& in, int row0, int out_h, const Taps& taps) {
  RgbImage out;
  out.width = in.width;
  out.height = out_h;
  out.pixels.resize(size_t(in.width) * out_h * 3);
  const size_t stride = size_t(in.width) * 3;
  for (int y = 0; y < out_h; ++y) {
    const int32_t* k = &taps.weights[size_t(y) * taps.ksize];
    const int lo = taps.first[size_t(y)] - row0;
    uint8_t* dst = &out.pixels[size_t(y) * stride];
    for (size_t i = 0; i < stride; ++i) {
      int32_t acc = 1 << (kPrecisionBits - 1);
      for (int j = 0; j < taps.count[size_t(y)]; ++j) {
        acc += int32_t(in.pixels[size_t(lo + j) * stride + i]) * k[j];
      }
      dst[i] = clip8(acc);
    }
  }
  return out;
}

}  // namespace

double pil_bicubic_kernel(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

RgbImage resize_bicubic_like_pil(const RgbImage& in, int32_t out_width, int32_t out_height) {
  const bool need_h = out_width != in.width;
  const bool need_v = out_height != in.height;
  if (!need_h && !need_v) return in;
  const Taps tv = compute_taps(in.height, out_height);
  if (!need_h) return vertical(in, 0, out_height, tv);
  const Taps th = compute_taps(in.width, out_width);
  if (!need_v) return horizontal(in, 0, in.height, out_width, th);
  // Only the source rows some output row reads go through the horizontal pass.
  const int first = tv.first.front();
  const int last = tv.first.back() + tv.count.back();
  RgbImage temp = horizontal(in, first, last - first, out_width, th);
  return vertical(temp, first, out_height, tv);
}

}  // namespace m3::server

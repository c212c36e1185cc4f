#include "server/media/bicubic_resize.h"

#include <algorithm>
#include <cmath>

namespace m3::server {

namespace {

// Per output index: the first source index, the tap count, and ksize fixed-point weights with
// `precision` fraction bits.
struct Taps {
  int ksize = 0;
  int precision = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  // [out, ksize], each within int16
};

// The fraction bits torch gives a pass: the most (below 22) for which the largest weight, rounded
// at one bit more, still fits int16. A downscale's weights are small, so it gets more bits.
int weight_precision(double largest_weight) {
  int bits = 0;
  for (; bits < 22; ++bits) {
    if (int(0.5 + largest_weight * double(1 << (bits + 1))) >= (1 << 15)) break;
  }
  return bits;
}

Taps compute_taps(int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double inv_scale = scale >= 1.0 ? 1.0 / scale : 1.0;  // multiplied, as torch does
  Taps t;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  std::vector<double> w(size_t(out_size) * t.ksize, 0.0);
  double largest = 0.0;
  for (int i = 0; i < out_size; ++i) {
    const double center = scale * (i + 0.5);
    // C casts truncate toward zero; the clamps then keep the window inside the source.
    const int lo = std::max(int(center - support + 0.5), 0);
    const int n = std::clamp(std::min(int(center + support + 0.5), in_size) - lo, 0, t.ksize);
    double* wi = &w[size_t(i) * t.ksize];
    double sum = 0.0;
    for (int k = 0; k < n; ++k) {
      wi[k] = keys_bicubic_kernel((k + lo - center + 0.5) * inv_scale);
      sum += wi[k];
    }
    if (sum != 0.0) {
      for (int k = 0; k < n; ++k) {
        wi[k] /= sum;
        largest = std::max(largest, wi[k]);
      }
    }
    t.first[size_t(i)] = lo;
    t.count[size_t(i)] = n;
  }
  t.precision = weight_precision(largest);
  t.weights.resize(w.size());
  const double unit = double(1 << t.precision);
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * unit;
    t.weights[k] = int32_t(v < 0 ? -0.5 + v : 0.5 + v);
  }
  return t;
}

// (acc >> precision) clamped to 0..255; the shift is arithmetic, so negative sums give 0.
uint8_t clamp8(int32_t acc, int precision) {
  return uint8_t(std::clamp(acc >> precision, 0, 255));
}

RgbImage horizontal(const RgbImage& in, int out_w, const Taps& taps) {
  RgbImage out;
  out.width = out_w;
  out.height = in.height;
  out.pixels.resize(size_t(out_w) * in.height * 3);
  const int32_t bias = 1 << (taps.precision - 1);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* src = &in.pixels[size_t(y) * in.width * 3];
    uint8_t* dst = &out.pixels[size_t(y) * out_w * 3];
    for (int x = 0; x < out_w; ++x) {
      const int32_t* k = &taps.weights[size_t(x) * taps.ksize];
      const int lo = taps.first[size_t(x)];
      int32_t acc[3] = {bias, bias, bias};
      for (int j = 0; j < taps.count[size_t(x)]; ++j) {
        const uint8_t* p = src + size_t(lo + j) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += int32_t(p[c]) * k[j];
      }
      for (int c = 0; c < 3; ++c) dst[x * 3 + c] = clamp8(acc[c], taps.precision);
    }
  }
  return out;
}

RgbImage vertical(const RgbImage& in, int out_h, const Taps& taps) {
  RgbImage out;
  out.width = in.width;
  out.height = out_h;
  out.pixels.resize(size_t(in.width) * out_h * 3);
  const size_t stride = size_t(in.width) * 3;
  const int32_t bias = 1 << (taps.precision - 1);
  for (int y = 0; y < out_h; ++y) {
    const int32_t* k = &taps.weights[size_t(y) * taps.ksize];
    const int lo = taps.first[size_t(y)];
    uint8_t* dst = &out.pixels[size_t(y) * stride];
    for (size_t i = 0; i < stride; ++i) {
      int32_t acc = bias;
      for (int j = 0; j < taps.count[size_t(y)]; ++j) {
        acc += int32_t(in.pixels[size_t(lo + j) * stride + i]) * k[j];
      }
      dst[i] = clamp8(acc, taps.precision);
    }
  }
  return out;
}

}  // namespace

double keys_bicubic_kernel(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

RgbImage resize_bicubic(const RgbImage& in, int32_t out_width, int32_t out_height) {
  const bool need_h = out_width != in.width;
  const bool need_v = out_height != in.height;
  if (!need_h && !need_v) return in;
  if (!need_v) return horizontal(in, out_width, compute_taps(in.width, out_width));
  const Taps tv = compute_taps(in.height, out_height);
  if (!need_h) return vertical(in, out_height, tv);
  return vertical(horizontal(in, out_width, compute_taps(in.width, out_width)), out_height, tv);
}

}  // namespace m3::server

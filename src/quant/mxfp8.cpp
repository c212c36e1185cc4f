#include "quant/mxfp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/dtype.h"

namespace m3 {

namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table;
}

std::string at(int64_t r, int64_t k) {
  return "[" + std::to_string(r) + "," + std::to_string(k) + "]";
}

}  // namespace

Status dequantize_mxfp8(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                        float* out) {
  if (rows < 0 || cols <= 0 || cols % kMxfp8BlockSize != 0) {
    return invalid_argument("MXFP8: shape [" + std::to_string(rows) + "," + std::to_string(cols) +
                            "]: the input dimension must be a positive multiple of 32");
  }
  const std::array<float, 256>& lut = e4m3_table();
  const int64_t blocks = cols / kMxfp8BlockSize;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t s = scales[r * blocks + b];
      if (s == 0xFF) {
        return data_loss("MXFP8: scale " + at(r, b) + " is the E8M0 NaN code 255");
      }
      const float scale = e8m0_to_f32(s);
      const int64_t base = r * cols + b * kMxfp8BlockSize;
      for (int64_t i = 0; i < kMxfp8BlockSize; ++i) {
        const uint8_t c = codes[base + i];
        if ((c & 0x7F) == 0x7F) {
          return data_loss("MXFP8: element " + at(r, b * kMxfp8BlockSize + i) +
                           " is an E4M3 NaN code");
        }
        out[base + i] = lut[c] * scale;
      }
    }
  }
  return Status::ok();
}

Result<Mxfp8Tensor> quantize_mxfp8(const float* x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0 || cols % kMxfp8BlockSize != 0) {
    return invalid_argument("quantize_mxfp8: shape [" + std::to_string(rows) + "," +
                            std::to_string(cols) +
                            "]: the input dimension must be a positive multiple of 32");
  }
  Mxfp8Tensor q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(size_t(rows * cols));
  const int64_t blocks = cols / kMxfp8BlockSize;
  q.scales.resize(size_t(rows * blocks));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t base = r * cols + b * kMxfp8BlockSize;
      float amax = 0.0f;
      for (int64_t i = 0; i < kMxfp8BlockSize; ++i) {
        const float v = x[base + i];
        if (!std::isfinite(v)) {
          return invalid_argument("quantize_mxfp8: element " + at(r, b * kMxfp8BlockSize + i) +
                                  " is not finite");
        }
        amax = std::max(amax, std::fabs(v));
      }
      // Smallest e with amax <= 448 * 2^e. amax = f * 2^p, f in [0.5, 1); 448 = 0.875 * 2^9.
      int e = 0;
      if (amax > 0.0f) {
        int p = 0;
        const float f = std::frexp(amax, &p);
        e = f <= 0.875f ? p - 9 : p - 8;
        e = std::clamp(e, -127, 127);
      }
      q.scales[size_t(r * blocks + b)] = uint8_t(e + 127);
      for (int64_t i = 0; i < kMxfp8BlockSize; ++i) {
        q.codes[size_t(base + i)] = f32_to_e4m3(std::ldexp(x[base + i], -e));
      }
    }
  }
  return q;
}

}  // namespace m3

#include "quant/nvfp4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "core/dtype.h"

namespace m3 {

namespace {

std::string at(int64_t r, int64_t k) {
  return "[" + std::to_string(r) + "," + std::to_string(k) + "]";
}

Status check_shape(const char* what, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0 || cols % kNvfp4BlockSize != 0) {
    return invalid_argument(std::string(what) + ": shape [" + std::to_string(rows) + "," +
                            std::to_string(cols) +
                            "]: the input dimension must be a positive multiple of 16");
  }
  return Status::ok();
}

}  // namespace

float nvfp4_block_factor(uint8_t scale_e4m3, float global_scale, Nvfp4GlobalScale kind) {
  const float s = e4m3_to_f32(scale_e4m3);
  return kind == Nvfp4GlobalScale::kDivide ? s / global_scale : s * global_scale;
}

Status dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale,
                        Nvfp4GlobalScale kind, int64_t rows, int64_t cols, float* out) {
  M3_RETURN_IF_ERROR(check_shape("NVFP4", rows, cols));
  if (!std::isfinite(global_scale) ||
      (kind == Nvfp4GlobalScale::kDivide && global_scale == 0.0f)) {
    return data_loss("NVFP4: global scale " + std::to_string(global_scale) +
                     " is not usable (must be finite, and non-zero when it divides)");
  }
  std::array<float, 16> e2m1{};
  for (int i = 0; i < 16; ++i) e2m1[size_t(i)] = e2m1_to_f32(uint8_t(i));
  const int64_t blocks = cols / kNvfp4BlockSize;
  const int64_t row_bytes = cols / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* prow = packed + r * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t s = scales[r * blocks + b];
      if ((s & 0x7F) == 0x7F) {
        return data_loss("NVFP4: block scale " + at(r, b) + " is an E4M3 NaN code");
      }
      const float factor = nvfp4_block_factor(s, global_scale, kind);
      for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
        const int64_t k = b * kNvfp4BlockSize + i;
        out[r * cols + k] = e2m1[nvfp4_code_at(prow, k)] * factor;
      }
    }
  }
  return Status::ok();
}

Result<Nvfp4Tensor> quantize_nvfp4(const float* x, int64_t rows, int64_t cols,
                                   Nvfp4GlobalScale kind) {
  M3_RETURN_IF_ERROR(check_shape("quantize_nvfp4", rows, cols));
  float amax = 0.0f;
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(x[i])) {
      return invalid_argument("quantize_nvfp4: element " + at(i / cols, i % cols) +
                              " is not finite");
    }
    amax = std::max(amax, std::fabs(x[i]));
  }
  return quantize_nvfp4_with_global_scale(x, rows, cols, kind,
                                          nvfp4_global_scale_for_amax(amax, kind));
}

float nvfp4_global_scale_for_amax(float amax, Nvfp4GlobalScale kind) {
  constexpr float kRange = kE4M3Max * kE2M1Max;  // 2688
  return amax == 0.0f ? 1.0f
         : kind == Nvfp4GlobalScale::kDivide ? kRange / amax
                                             : amax / kRange;
}

Result<Nvfp4Tensor> quantize_nvfp4_with_global_scale(const float* x, int64_t rows, int64_t cols,
                                                     Nvfp4GlobalScale kind, float global_scale) {
  M3_RETURN_IF_ERROR(check_shape("quantize_nvfp4", rows, cols));
  if (!std::isfinite(global_scale) || global_scale <= 0.0f) {
    return invalid_argument("quantize_nvfp4: global scale " + std::to_string(global_scale) +
                            " must be finite and positive");
  }
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(x[i])) {
      return invalid_argument("quantize_nvfp4: element " + at(i / cols, i % cols) +
                              " is not finite");
    }
  }
  Nvfp4Tensor q;
  q.rows = rows;
  q.cols = cols;
  q.kind = kind;
  q.global_scale = global_scale;
  const int64_t blocks = cols / kNvfp4BlockSize;
  q.packed.assign(size_t(rows * cols / 2), 0);
  q.scales.resize(size_t(rows * blocks));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + r * cols + b * kNvfp4BlockSize;
      float bmax = 0.0f;
      for (int64_t i = 0; i < kNvfp4BlockSize; ++i) bmax = std::max(bmax, std::fabs(xb[i]));
      const float target = kind == Nvfp4GlobalScale::kDivide ? bmax / kE2M1Max * q.global_scale
                                                             : bmax / kE2M1Max / q.global_scale;
      const uint8_t s = f32_to_e4m3(target);
      q.scales[size_t(r * blocks + b)] = s;
      const float factor = nvfp4_block_factor(s, q.global_scale, kind);
      for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
        const uint8_t code = factor == 0.0f ? 0 : uint8_t(f32_to_e2m1(xb[i] / factor) & 0xF);
        const int64_t k = b * kNvfp4BlockSize + i;
        uint8_t& byte = q.packed[size_t((r * cols + k) / 2)];
        byte = uint8_t(byte | ((k & 1) ? code << 4 : code));
      }
    }
  }
  return q;
}

}  // namespace m3

// MXFP8 / NVFP4 reference (de)quantisers: exact dequantisation against independent formulas,
// nibble order, scale selection, and round-trip error bounds derived from the formats.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3 {
namespace {

double ref_e4m3(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

double ref_e2m1(int c) {
  const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

TEST(Nvfp4, NibbleOrderLowFirst) {
  const uint8_t row[2] = {0x21, 0xF3};
  EXPECT_EQ(nvfp4_code_at(row, 0), 0x1);
  EXPECT_EQ(nvfp4_code_at(row, 1), 0x2);
  EXPECT_EQ(nvfp4_code_at(row, 2), 0x3);
  EXPECT_EQ(nvfp4_code_at(row, 3), 0xF);
}

TEST(Mxfp8, DequantisedTensorIsExact) {
  const int64_t rows = 3, cols = 64;
  std::vector<uint8_t> codes(rows * cols), scales(rows * 2);
  for (int64_t i = 0; i < rows * cols; ++i) {
    codes[i] = uint8_t((i * 37 + 11) % 256);
    if ((codes[i] & 0x7F) == 0x7F) codes[i] = 0x7E;  // keep NaN codes out
  }
  const uint8_t s[6] = {127, 130, 0, 254, 100, 120};
  std::copy(s, s + 6, scales.begin());
  std::vector<float> out(rows * cols);
  ASSERT_TRUE(dequantize_mxfp8(codes.data(), scales.data(), rows, cols, out.data()).is_ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      // The product of a 4-bit significand and a power of two is exact in float32 here.
      const double want = std::ldexp(ref_e4m3(codes[r * cols + k]), scales[r * 2 + k / 32] - 127);
      ASSERT_EQ(out[r * cols + k], float(want)) << r << "," << k;
    }
  }
  EXPECT_EQ(out[0 * cols + 0], float(ref_e4m3(codes[0])));  // scale 127 = 1
}

TEST(Mxfp8, RejectsBadShapesAndNaNScales) {
  std::vector<uint8_t> codes(64, 0x38), scales(2, 127);
  std::vector<float> out(64);
  EXPECT_EQ(dequantize_mxfp8(codes.data(), scales.data(), 1, 48, out.data()).code(),
            StatusCode::kInvalidArgument);
  scales[1] = 255;
  Status s = dequantize_mxfp8(codes.data(), scales.data(), 1, 64, out.data());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("[0,1]"), std::string::npos) << s.message();
  scales[1] = 127;
  codes[40] = 0xFF;
  EXPECT_EQ(dequantize_mxfp8(codes.data(), scales.data(), 1, 64, out.data()).code(),
            StatusCode::kDataLoss);
}

TEST(Mxfp8, QuantiserPicksSmallestNonSaturatingPowerOfTwo) {
  std::vector<float> x(4 * 32, 0.0f);
  x[0] = 448.0f;        // block 0: 448 <= 448 * 2^0
  x[32] = 449.0f;       // block 1: needs 2^1
  x[64 + 5] = -1.0f;    // block 2: 1 <= 448 * 2^-8 = 1.75, but not 448 * 2^-9 = 0.875
  Result<Mxfp8Tensor> q = quantize_mxfp8(x.data(), 4, 32);
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->scales[0], 127);
  EXPECT_EQ(q->scales[1], 128);
  EXPECT_EQ(q->scales[2], 127 - 8);
  EXPECT_EQ(q->scales[3], 127);  // all-zero block
  EXPECT_EQ(q->codes[0], 0x7E);
  EXPECT_EQ(q->codes[64 + 5], 0xF8);  // -1 / 2^-8 = -256 = -(1.0 * 2^(15-7))
}

TEST(Mxfp8, RoundTripWithinHalfAnE4M3Step) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t rows = 16, cols = 128;
  std::vector<float> x(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] = n(rng) * std::ldexp(1.0f, int(i % 7) * 3 - 9);
  x[5] = 0.0f;
  Result<Mxfp8Tensor> q = quantize_mxfp8(x.data(), rows, cols);
  ASSERT_TRUE(q.is_ok());
  std::vector<float> y(rows * cols);
  ASSERT_TRUE(dequantize_mxfp8(q->codes.data(), q->scales.data(), rows, cols, y.data()).is_ok());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double scale = std::ldexp(1.0, q->scales[i / 32] - 127);
    // Normal E4M3: round-to-nearest with 3 mantissa bits errs by at most 2^-4 relative.
    // Subnormal E4M3 (|x|/scale < 2^-6): step 2^-9, so at most 2^-10 * scale absolute.
    const double bound = std::max(std::ldexp(std::fabs(double(x[i])), -4), std::ldexp(scale, -10));
    ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), bound) << i;
  }
  EXPECT_EQ(y[5], 0.0f);
}

TEST(Mxfp8, QuantiserRejectsNonFinite) {
  std::vector<float> x(32, 1.0f);
  x[7] = std::numeric_limits<float>::infinity();
  Result<Mxfp8Tensor> q = quantize_mxfp8(x.data(), 1, 32);
  ASSERT_FALSE(q.is_ok());
  EXPECT_NE(q.status().message().find("[0,7]"), std::string::npos);
}

TEST(Nvfp4, DequantisedTensorIsExactUnderBothConventions) {
  const int64_t rows = 2, cols = 32;
  std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 16);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = uint8_t(i * 29 + 3);
  const uint8_t sc[4] = {0x38 /*1*/, 0x7E /*448*/, 0x01 /*2^-9*/, 0x4B /*3.5*/};
  std::copy(sc, sc + 4, scales.begin());
  std::vector<float> a(rows * cols), b(rows * cols);
  ASSERT_TRUE(dequantize_nvfp4(packed.data(), scales.data(), 4.0f, Nvfp4GlobalScale::kDivide, rows,
                               cols, a.data())
                  .is_ok());
  ASSERT_TRUE(dequantize_nvfp4(packed.data(), scales.data(), 0.25f, Nvfp4GlobalScale::kMultiply,
                               rows, cols, b.data())
                  .is_ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const uint8_t byte = packed[(r * cols + k) / 2];
      const int code = (k % 2) ? byte >> 4 : byte & 0xF;
      // Powers of two and short significands: every product is exact.
      const double want = ref_e2m1(code) * ref_e4m3(sc[r * 2 + k / 16]) / 4.0;
      ASSERT_EQ(a[r * cols + k], float(want)) << r << "," << k;
      ASSERT_EQ(b[r * cols + k], float(want)) << r << "," << k;
    }
  }
}

TEST(Nvfp4, BlockFactorOrderIsFixed) {
  // A global scale that is not a power of two: the factor is rounded once, then multiplied.
  const uint8_t packed[8] = {0x7F, 0, 0, 0, 0, 0, 0, 0};  // element 0: 0xF (-6), 1: 0x7 (6)
  const uint8_t scale = 0x4D;                             // (1 + 5/8) * 2^(9-7) = 6.5
  float out[16];
  ASSERT_TRUE(
      dequantize_nvfp4(packed, &scale, 3.0f, Nvfp4GlobalScale::kDivide, 1, 16, out).is_ok());
  const float factor = e4m3_to_f32(scale) / 3.0f;
  EXPECT_EQ(e4m3_to_f32(scale), 6.5f);
  EXPECT_EQ(out[0], -6.0f * factor);
  EXPECT_EQ(out[1], 6.0f * factor);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(nvfp4_block_factor(scale, 3.0f, Nvfp4GlobalScale::kDivide), factor);
  EXPECT_EQ(nvfp4_block_factor(scale, 3.0f, Nvfp4GlobalScale::kMultiply), e4m3_to_f32(scale) * 3.0f);
}

TEST(Nvfp4, RejectsBadInput) {
  const uint8_t packed[8] = {}, scales[1] = {0x38};
  float out[16];
  EXPECT_EQ(dequantize_nvfp4(packed, scales, 1.0f, Nvfp4GlobalScale::kDivide, 1, 8, out).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dequantize_nvfp4(packed, scales, 0.0f, Nvfp4GlobalScale::kDivide, 1, 16, out).code(),
            StatusCode::kDataLoss);
  const uint8_t nan_scale[1] = {0x7F};
  EXPECT_EQ(dequantize_nvfp4(packed, nan_scale, 1.0f, Nvfp4GlobalScale::kDivide, 1, 16, out).code(),
            StatusCode::kDataLoss);
}

TEST(Nvfp4, RepresentableValuesRoundTripExactly) {
  // Tensor amax 6 -> divide-convention global scale 448; a block with amax 6 gets scale
  // e4m3(6/6*448) = 448, factor 1, so grid values come back unchanged.
  std::vector<float> x(32);
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int i = 0; i < 32; ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * grid[i % 8];
  x[15] = 6.0f;
  x[31] = -6.0f;
  for (Nvfp4GlobalScale kind : {Nvfp4GlobalScale::kDivide, Nvfp4GlobalScale::kMultiply}) {
    Result<Nvfp4Tensor> q = quantize_nvfp4(x.data(), 1, 32, kind);
    ASSERT_TRUE(q.is_ok());
    std::vector<float> y(32);
    ASSERT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), q->global_scale, kind, 1, 32,
                                 y.data())
                    .is_ok());
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]) << i;
  }
}

TEST(Nvfp4, RoundTripWithinOneBlockFactor) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t rows = 8, cols = 64;
  std::vector<float> x(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i) x[i] = n(rng) * (1.0f + float(i / 16 % 5));
  for (Nvfp4GlobalScale kind : {Nvfp4GlobalScale::kDivide, Nvfp4GlobalScale::kMultiply}) {
    Result<Nvfp4Tensor> q = quantize_nvfp4(x.data(), rows, cols, kind);
    ASSERT_TRUE(q.is_ok());
    std::vector<float> y(rows * cols);
    ASSERT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), q->global_scale, kind, rows,
                                 cols, y.data())
                    .is_ok());
    for (int64_t i = 0; i < rows * cols; ++i) {
      // With s the block factor: the E4M3 scale is rounded to within 2^-4 relative (normal range,
      // true here: block amax >= tensor amax / 20), so |x|/s <= 6/(1-2^-4) = 6.4 -> saturation
      // error <= 0.4 s; inside the grid the widest step (4 -> 6) gives at most 1 s. Float
      // rounding of x/s and code*s adds ~1e-7 relative.
      const float s = nvfp4_block_factor(q->scales[i / 16], q->global_scale, kind);
      ASSERT_GT(s, 0.0f);
      ASSERT_LE(std::fabs(y[i] - x[i]), s * 1.000001f) << i;
    }
  }
}

}  // namespace
}  // namespace m3

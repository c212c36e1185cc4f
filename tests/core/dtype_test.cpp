// Exact scalar conversions: every code of the narrow formats against independent formulas
// (std::ldexp in double), round-to-nearest-even ties, saturation, NaN and subnormals.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace m3 {
namespace {

// Independent reference: sign * (e == 0 ? m/8 * 2^-6 : (1 + m/8) * 2^(e-7)); S.1111.111 = NaN.
double ref_e4m3(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

bool same_float(float a, float b) { return f32_to_bits(a) == f32_to_bits(b); }

TEST(DType, NamesSizesAndParsing) {
  const DType all[] = {DType::kF64,  DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3,
                       DType::kF8E5M2, DType::kU8, DType::kI8, DType::kI16,  DType::kI32,
                       DType::kI64,  DType::kU16, DType::kU32, DType::kU64, DType::kBool};
  const size_t sizes[] = {8, 4, 2, 2, 1, 1, 1, 1, 2, 4, 8, 2, 4, 8, 1};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]) << dtype_name(all[i]);
    Result<DType> back = parse_dtype(dtype_name(all[i]));
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(*back, all[i]);
  }
  EXPECT_STREQ(dtype_name(DType::kF8E4M3), "F8_E4M3");
  EXPECT_STREQ(dtype_name(DType::kBool), "BOOL");
  Result<DType> bad = parse_dtype("bf16");  // case-sensitive, like the format
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'bf16'"), std::string::npos);
  EXPECT_FALSE(parse_dtype("F8_E4M3FN").is_ok());
}

TEST(E4M3, EveryCodeMatchesFormula) {
  for (int c = 0; c < 256; ++c) {
    const double want = ref_e4m3(c);
    const float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      continue;
    }
    EXPECT_TRUE(same_float(got, float(want))) << "code " << c << " got " << got << " want " << want;
    EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << c;
  }
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7.0f * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // 0x78..0x7E are finite: there are no infinities
}

TEST(E4M3, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(uint8_t(c))), c) << c;
  }
}

TEST(E4M3, EncodeTiesGoToEvenAndNeighboursRoundCorrectly) {
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_f32(uint8_t(c)), hi = e4m3_to_f32(uint8_t(c + 1));
    const float mid = (lo + hi) / 2;  // at most 5 significant bits: exact
    ASSERT_EQ(double(mid), (double(lo) + double(hi)) / 2);
    const int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), c + 1) << c;
    EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | even) << c;
  }
}

TEST(E4M3, EncodeSaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // would round to 480, which is not representable
  EXPECT_EQ(f32_to_e4m3(480.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  // Below half the smallest subnormal: zero, keeping the sign.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9: even (0)
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -20)), 0x00);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.0f, -20)), 0x80);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(E4M3, EncodeMatchesBruteForceNearest) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-13, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(mant(rng), expo(rng));
    int best = 0;
    double best_err = 1e300;
    for (int c = 0; c <= 0x7E; ++c) {  // nearest, ties to the even code
      const double err = std::fabs(ref_e4m3(c) - double(x));
      if (err < best_err || (err == best_err && (c & 1) == 0)) {
        best = c;
        best_err = err;
      }
    }
    ASSERT_EQ(f32_to_e4m3(x), best) << "x = " << x;
  }
}

TEST(E8M0, ExtremesAndEveryCode) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));  // a float32 subnormal
  EXPECT_GT(e8m0_to_f32(0), 0.0f);
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  for (int s = 0; s < 255; ++s) EXPECT_EQ(e8m0_to_f32(uint8_t(s)), std::ldexp(1.0f, s - 127)) << s;
}

TEST(E2M1, AllSixteenCodes) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -mag[c & 7] : mag[c & 7];
    EXPECT_TRUE(same_float(e2m1_to_f32(uint8_t(c)), want)) << c;
    EXPECT_EQ(f32_to_e2m1(want), c) << c;
  }
  EXPECT_TRUE(std::signbit(e2m1_to_f32(0x8)));  // code 8 is -0
  EXPECT_EQ(e2m1_to_f32(0xF7), 6.0f);           // only the low nibble counts
}

TEST(E2M1, EncodeTiesSaturationAndNaN) {
  // Midpoints go to the code with an even mantissa bit.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(5.0f, 9.0f)), 7);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);
  EXPECT_EQ(f32_to_e2m1(std::numeric_limits<float>::quiet_NaN()) & 7, 7);
}

TEST(BF16, DecodeEveryValueAndEncodeRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(f32_to_bits(bf16_to_f32(uint16_t(h))), h << 16);
    const float f = bf16_to_f32(uint16_t(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to +inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  // A NaN whose payload sits only in the low half must stay NaN (not become infinity).
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bits_to_f32(0xFF800001u)))));
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0xFF800001u)) & 0x8000, 0x8000);
}

TEST(F16, DecodeEveryValueAgainstFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float got = f16_to_f32(uint16_t(h));
    if (e == 31) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << h;
      continue;
    }
    double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    if (s) v = -v;
    ASSERT_TRUE(same_float(got, float(v))) << h;
    ASSERT_EQ(f32_to_f16(got), h) << h;  // round trip, including -0 and subnormals
  }
}

TEST(F16, EncodeTiesOverflowAndUnderflow) {
  for (uint32_t h = 0; h < 0x7BFF; ++h) {  // consecutive positive finite values
    const float lo = f16_to_f32(uint16_t(h)), hi = f16_to_f32(uint16_t(h + 1));
    const float mid = (lo + hi) / 2;  // 12 significant bits: exact in float
    const uint32_t even = (h & 1) ? h + 1 : h;
    ASSERT_EQ(f32_to_f16(mid), even) << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 1e9f)), h + 1) << h;
  }
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie with "65536" rounds to even = infinity
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie with 2^-24: even (0)
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(bits_to_f32(0x7F800001u)))));
}

}  // namespace
}  // namespace m3

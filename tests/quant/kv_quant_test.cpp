// The KV cache's storage formats (quant/kv_quant.h) against double-precision references.
//
// Error model (docs/kv-cache-dtype.md), for an element x of a page-head whose final scale is s:
//   bf16:      |x' - x| <= 2^-8 |x|                       (8 significant bits, round-to-nearest)
//   fp8_e4m3:  |x' - x| <= 2^-4 |x| + 2^-9 s             (4 significant bits; E4M3's subnormal
//              spacing is 2^-9 s, and a row re-encoded when the scale grew is rounded at most once
//              more, in that subnormal range only: 2^-10 s + 2^-10 s)
//   fp4_e2m1:  |x' - x| <= (17/16) bmax / 6 + 12 * 2^-10 s   (bmax the |max| of x's 16-element
//              block: half the E2M1 step is <= 1 block factor, the factor is bmax / 6 within E4M3's
//              2^-4 relative rounding, or within 2^-10 s absolute where it is subnormal; once more
//              that much where the block scale was re-encoded, times |code| <= 6)
// and dequantisation itself is exact (checked against the product computed in double).
#include "quant/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/nvfp4.h"

namespace m3 {
namespace {

constexpr int64_t kRows = 128, kDim = 128;

// A page-head stored on the host: rows of kDim elements.
struct PageHead {
  KvCacheDtype d;
  std::vector<uint8_t> codes, block_scales;
  float scale = -1.0f;
  explicit PageHead(KvCacheDtype dt)
      : d(dt),
        codes(size_t(kRows * kv_row_code_bytes(dt, kDim))),
        block_scales(size_t(kRows * kv_row_block_scale_bytes(dt, kDim)) + 1) {}
  KvPageHead view() {
    KvPageHead ph;
    ph.codes = codes.data();
    ph.code_stride = kv_row_code_bytes(d, kDim);
    if (d == KvCacheDtype::kFp4E2M1) {
      ph.block_scales = block_scales.data();
      ph.block_scale_stride = kv_row_block_scale_bytes(d, kDim);
    }
    if (kv_has_page_scale(d)) ph.scale = &scale;
    return ph;
  }
  std::vector<float> row(int64_t r) {
    std::vector<float> out(kDim);
    kv_read_row(d, view(), r, kDim, out.data());
    return out;
  }
};

// Rows whose magnitude grows (so the page scale is raised several times), with a few zeros, tiny
// values and exact powers of two mixed in.
std::vector<float> growing_rows(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(size_t(kRows * kDim));
  for (int64_t r = 0; r < kRows; ++r) {
    const float mag = std::ldexp(1.0f, int(r / 16) * 2 - 6);  // 2^-6 .. 2^8
    for (int64_t i = 0; i < kDim; ++i) x[size_t(r * kDim + i)] = n(rng) * mag;
    x[size_t(r * kDim + (r % kDim))] = 0.0f;
    x[size_t(r * kDim + ((r + 7) % kDim))] = mag * 1e-4f;
    x[size_t(r * kDim + ((r + 11) % kDim))] = -mag * 2.0f;
  }
  return x;
}

double bound(KvCacheDtype d, double x, double bmax, double s) {
  switch (d) {
    case KvCacheDtype::kFloat32: return 0.0;
    case KvCacheDtype::kBF16: return std::ldexp(std::fabs(x), -8);
    case KvCacheDtype::kFp8E4M3: return std::ldexp(std::fabs(x), -4) + std::ldexp(s, -9);
    case KvCacheDtype::kFp4E2M1: return 17.0 / 16.0 * bmax / 6.0 + 12.0 * std::ldexp(s, -10);
  }
  return 0.0;
}

TEST(KvQuant, NamesRoundTripAndBadNamesAreRefusedByName) {
  for (KvCacheDtype d : {KvCacheDtype::kFloat32, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3,
                         KvCacheDtype::kFp4E2M1}) {
    auto p = parse_kv_cache_dtype(kv_cache_dtype_name(d));
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(*p, d);
  }
  auto bad = parse_kv_cache_dtype("fp8_e5m2");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("fp8_e5m2"), std::string::npos);
}

TEST(KvQuant, BytesPerElementIncludeTheScales) {
  EXPECT_EQ(kv_bytes_per_element(KvCacheDtype::kFloat32, 128, 128), 4.0);
  EXPECT_EQ(kv_bytes_per_element(KvCacheDtype::kBF16, 128, 128), 2.0);
  EXPECT_EQ(kv_bytes_per_element(KvCacheDtype::kFp8E4M3, 128, 128), 1.0 + 4.0 / (128 * 128));
  EXPECT_EQ(kv_bytes_per_element(KvCacheDtype::kFp4E2M1, 128, 128),
            0.5 + 1.0 / 16 + 4.0 / (128 * 128));
}

TEST(KvQuant, PageScaleIsTheSmallestPowerOfTwoThatHoldsTheMax) {
  EXPECT_EQ(kv_page_scale_for_amax(KvCacheDtype::kFp8E4M3, 0.0f), 0.0f);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    const double range = d == KvCacheDtype::kFp8E4M3 ? 448.0 : 2688.0;
    for (int e = -60; e <= 60; ++e) {
      for (float amax : {std::ldexp(u(rng), e), std::ldexp(1.0f, e), float(range) * std::ldexp(1.0f, e)}) {
        const float s = kv_page_scale_for_amax(d, amax);
        int p = 0;
        EXPECT_EQ(std::frexp(s, &p), 0.5f) << s << " is not a power of two";
        EXPECT_LE(amax, range * s) << amax;
        EXPECT_GT(amax, range * s / 2) << amax;
      }
    }
  }
}

TEST(KvQuant, AppendedRowsStayWithinTheErrorModel) {
  const std::vector<float> x = growing_rows(11);
  for (KvCacheDtype d : {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    PageHead ph(d);
    for (int64_t r = 0; r < kRows; ++r) kv_append_row(d, ph.view(), r, x.data() + r * kDim, kDim);
    double page_max = 0;
    for (float v : x) page_max = std::max(page_max, double(std::fabs(v)));
    if (kv_has_page_scale(d)) {
      EXPECT_EQ(ph.scale, kv_page_scale_for_amax(d, float(page_max))) << kv_cache_dtype_name(d);
    }
    double worst = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<float> got = ph.row(r);
      for (int64_t i = 0; i < kDim; ++i) {
        const int64_t b0 = i / 16 * 16;
        double bmax = 0;
        for (int64_t j = b0; j < b0 + 16; ++j)
          bmax = std::max(bmax, double(std::fabs(x[size_t(r * kDim + j)])));
        const double want = x[size_t(r * kDim + i)];
        const double err = std::fabs(double(got[size_t(i)]) - want);
        const double b = bound(d, want, bmax, ph.scale);
        worst = std::max(worst, err / std::max(b, 1e-300));
        ASSERT_LE(err, b) << kv_cache_dtype_name(d) << " row " << r << " element " << i
                          << ": " << got[size_t(i)] << " for " << want;
      }
    }
    std::printf("[ kv_quant ] %s: worst error %.3f of the bound\n", kv_cache_dtype_name(d), worst);
  }
}

// Rows appended one by one (the scale growing 2^16-fold on the way) decode to exactly what one
// encoding under the final scale gives, wherever the values stay E4M3 normals at that scale:
// re-encoding is then exact, so appending adds no error beyond the format's own.
TEST(KvQuant, RaisingThePageScaleIsExactAboveTheSubnormals) {
  const std::vector<float> x = growing_rows(5);
  for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    PageHead appended(d), at_once(d);
    for (int64_t r = 0; r < kRows; ++r)
      kv_append_row(d, appended.view(), r, x.data() + r * kDim, kDim);
    const float s = appended.scale;
    int compared = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      std::vector<uint8_t> codes(size_t(kv_row_code_bytes(d, kDim))), bs(kDim / 16);
      kv_encode_row(d, x.data() + r * kDim, kDim, s, codes.data(), bs.data());
      std::vector<float> direct(kDim);
      kv_decode_row(d, codes.data(), bs.data(), s, kDim, direct.data());
      const std::vector<float> got = appended.row(r);
      for (int64_t i = 0; i < kDim; ++i) {
        // fp8: the element itself must be normal; fp4: its block scale.
        double unit = std::fabs(x[size_t(r * kDim + i)]);
        if (d == KvCacheDtype::kFp4E2M1) {
          unit = 0;
          for (int64_t j = i / 16 * 16; j < i / 16 * 16 + 16; ++j)
            unit = std::max(unit, double(std::fabs(x[size_t(r * kDim + j)])) / 6);
        }
        if (unit < std::ldexp(double(s), -5)) continue;  // 2^-6 with room for the rounding
        ++compared;
        ASSERT_EQ(got[size_t(i)], direct[size_t(i)])
            << kv_cache_dtype_name(d) << " row " << r << " element " << i;
      }
    }
    EXPECT_GT(compared, kRows * kDim / 8) << kv_cache_dtype_name(d);
  }
}

// Dequantisation is exact: the stored value equals code x block scale x page scale in double.
TEST(KvQuant, DequantisationIsExact) {
  const std::vector<float> x = growing_rows(9);
  for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    PageHead ph(d);
    for (int64_t r = 0; r < kRows; ++r) kv_append_row(d, ph.view(), r, x.data() + r * kDim, kDim);
    for (int64_t r = 0; r < kRows; ++r) {
      const std::vector<float> got = ph.row(r);
      for (int64_t i = 0; i < kDim; ++i) {
        double want;
        if (d == KvCacheDtype::kFp8E4M3) {
          want = double(e4m3_to_f32(ph.codes[size_t(r * kDim + i)])) * ph.scale;
        } else {
          const uint8_t byte = ph.codes[size_t(r * kDim / 2 + i / 2)];
          const uint8_t code = (i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 0xF);
          want = double(e2m1_to_f32(code)) *
                 double(e4m3_to_f32(ph.block_scales[size_t(r * kDim / 16 + i / 16)])) * ph.scale;
        }
        ASSERT_EQ(double(got[size_t(i)]), want);
      }
    }
  }
}

// One row under a given scale is NVFP4's reference recipe (quant/nvfp4.h) with that scale as the
// multiplying global scale, code for code.
TEST(KvQuant, Fp4RowsAreTheNvfp4RecipeUnderThePageScale) {
  const std::vector<float> x = growing_rows(21);
  for (int64_t r = 0; r < kRows; r += 9) {
    const float* row = x.data() + r * kDim;
    const float s = kv_page_scale_for_amax(KvCacheDtype::kFp4E2M1, kv_abs_max(row, kDim));
    std::vector<uint8_t> codes(kDim / 2), bs(kDim / 16);
    kv_encode_row(KvCacheDtype::kFp4E2M1, row, kDim, s, codes.data(), bs.data());
    auto ref = quantize_nvfp4_with_global_scale(row, 1, kDim, Nvfp4GlobalScale::kMultiply, s);
    ASSERT_TRUE(ref.is_ok());
    EXPECT_EQ(codes, ref->packed) << "row " << r;
    EXPECT_EQ(bs, ref->scales) << "row " << r;
  }
}

// Row 0 starts a page afresh: a page reused after a larger owner gets a scale of its own.
TEST(KvQuant, RowZeroResetsThePageScale) {
  for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
    PageHead ph(d);
    std::vector<float> big(kDim, 1000.0f), small(kDim, 0.001f);
    kv_append_row(d, ph.view(), 0, big.data(), kDim);
    kv_append_row(d, ph.view(), 0, small.data(), kDim);
    EXPECT_EQ(ph.scale, kv_page_scale_for_amax(d, 0.001f));
    EXPECT_NEAR(ph.row(0)[0], 0.001, 0.001 / 8);
    // An all-zero first row leaves scale 0 and decodes to zeros.
    std::vector<float> zero(kDim, 0.0f);
    kv_append_row(d, ph.view(), 0, zero.data(), kDim);
    EXPECT_EQ(ph.scale, 0.0f);
    EXPECT_EQ(ph.row(0), zero);
  }
}

}  // namespace
}  // namespace m3

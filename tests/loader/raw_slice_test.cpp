// loader/raw_slice.h: a rank's rows / columns of a stored weight dequantise to exactly the same
// slice of the dequantised matrix (MXFP8, NVFP4, BF16); misaligned or out-of-range slices are
// errors naming the constraint.
#include "loader/raw_slice.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3 {
namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = n(rng) * (1.0f + float(rng() % 7));
  return x;
}

// Rows [r0, r1) x columns [c0, c1) of a row-major float matrix.
std::vector<float> sub(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1,
                       int64_t c0, int64_t c1) {
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(x[static_cast<size_t>(r * cols + c)]);
  return out;
}

TEST(RawSlice, Mxfp8SliceDequantisesToTheSameValues) {
  const int64_t rows = 6, cols = 128;
  auto x = random_matrix(rows, cols, 1);
  auto q = quantize_mxfp8(x.data(), rows, cols);
  ASSERT_TRUE(q.is_ok());
  std::vector<float> full(static_cast<size_t>(rows * cols));
  ASSERT_TRUE(dequantize_mxfp8(q->codes.data(), q->scales.data(), rows, cols, full.data()).is_ok());
  RawWeight w;
  w.format = WeightFormat::kMxfp8;
  w.shape = {rows, cols};
  w.data = q->codes.data();
  w.data_bytes = q->codes.size();
  w.scale = q->scales.data();
  w.scale_bytes = q->scales.size();
  for (auto [r0, r1, c0, c1] : {std::tuple{1, 5, 32, 96}, std::tuple{0, 6, 0, 128},
                                std::tuple{5, 6, 96, 128}, std::tuple{2, 2, 0, 32}}) {
    auto s = slice_raw(w, r0, r1, c0, c1);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    ASSERT_EQ(s->shape, (std::vector<int64_t>{r1 - r0, c1 - c0}));
    std::vector<float> got(static_cast<size_t>((r1 - r0) * (c1 - c0)));
    if (r1 > r0) {
      ASSERT_TRUE(dequantize_mxfp8(s->data, s->scale, r1 - r0, c1 - c0, got.data()).is_ok());
    }
    EXPECT_EQ(got, sub(full, cols, r0, r1, c0, c1)) << r0 << " " << r1 << " " << c0 << " " << c1;
  }
  auto bad = slice_raw(w, 0, 6, 16, 64);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("32-element"), std::string::npos) << bad.status().message();
}

TEST(RawSlice, Nvfp4SliceDequantisesToTheSameValuesAndKeepsTheGlobalScale) {
  const int64_t rows = 5, cols = 96;
  auto x = random_matrix(rows, cols, 2);
  for (Nvfp4GlobalScale kind : {Nvfp4GlobalScale::kDivide, Nvfp4GlobalScale::kMultiply}) {
    auto q = quantize_nvfp4(x.data(), rows, cols, kind);
    ASSERT_TRUE(q.is_ok());
    std::vector<float> full(static_cast<size_t>(rows * cols));
    ASSERT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), q->global_scale, kind, rows,
                                 cols, full.data())
                    .is_ok());
    RawWeight w;
    w.format = kind == Nvfp4GlobalScale::kDivide ? WeightFormat::kNvfp4Compressed
                                                 : WeightFormat::kNvfp4ModelOpt;
    w.shape = {rows, cols};
    w.data = q->packed.data();
    w.data_bytes = q->packed.size();
    w.scale = q->scales.data();
    w.scale_bytes = q->scales.size();
    w.global_scale = q->global_scale;
    for (auto [r0, r1, c0, c1] : {std::tuple{1, 4, 16, 80}, std::tuple{0, 5, 48, 96}}) {
      auto s = slice_raw(w, r0, r1, c0, c1);
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      EXPECT_EQ(s->global_scale, w.global_scale);
      std::vector<float> got(static_cast<size_t>((r1 - r0) * (c1 - c0)));
      ASSERT_TRUE(dequantize_nvfp4(s->data, s->scale, s->global_scale, kind, r1 - r0, c1 - c0,
                                   got.data())
                      .is_ok());
      EXPECT_EQ(got, sub(full, cols, r0, r1, c0, c1));
    }
    EXPECT_FALSE(slice_raw(w, 0, 5, 8, 40).is_ok());  // half a 16-element block
  }
}

TEST(RawSlice, Bf16AnyColumnsAndErrors) {
  const int64_t rows = 3, cols = 10;
  std::vector<uint16_t> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(0x3f80 + i);
  RawWeight w;
  w.format = WeightFormat::kBF16;
  w.shape = {rows, cols};
  w.data = reinterpret_cast<const uint8_t*>(v.data());
  w.data_bytes = v.size() * 2;
  auto s = slice_raw(w, 1, 3, 3, 7);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const uint16_t* d = reinterpret_cast<const uint16_t*>(s->data);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(d[r * 4 + c], v[static_cast<size_t>((1 + r) * cols + 3 + c)]);
  EXPECT_EQ(s->scale, nullptr);
  EXPECT_FALSE(slice_raw(w, 0, 4, 0, 10).is_ok());   // rows past the end
  EXPECT_FALSE(slice_raw(w, 2, 1, 0, 10).is_ok());   // empty backwards range
  EXPECT_FALSE(slice_raw(w, 0, 3, 0, 11).is_ok());   // columns past the end
  RawWeight one_d = w;
  one_d.shape = {30};
  EXPECT_FALSE(slice_raw(one_d, 0, 1, 0, 1).is_ok());
  RawWeight short_data = w;
  short_data.data_bytes = 10;
  EXPECT_FALSE(slice_raw(short_data, 0, 1, 0, 1).is_ok());
}

}  // namespace
}  // namespace m3

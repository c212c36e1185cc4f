// The MXFP8 mma layout (quant/mxfp8_mma_layout.h): the offset map is a bijection of each matrix
// onto itself for both tilings, the repack moves every code to its offset, and a lane's 16 bytes
// of a block are its A-fragment codes: tile rows g and g + 8 at the block's columns 8t .. 8t + 7.
#include "quant/mxfp8_mma_layout.h"

#include <gtest/gtest.h>

#include <random>

namespace m3::mxfp8_mma {
namespace {

TEST(Mxfp8MmaLayout, OffsetsAreABijection) {
  for (const Tiling tiling : {Tiling::kRows16, Tiling::kSwigluPairs})
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{16, 128}, {48, 384}, {32, 1024}}) {
      ASSERT_TRUE(mxfp8_mma::fits(n, k, tiling));
      std::vector<int> hits(static_cast<size_t>(n * k), 0);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const int64_t o = mxfp8_mma::offset(r, c, n, k, tiling);
          ASSERT_GE(o, 0);
          ASSERT_LT(o, n * k);
          ++hits[static_cast<size_t>(o)];
        }
      for (const int h : hits) ASSERT_EQ(h, 1) << "N " << n << " K " << k;
    }
}

TEST(Mxfp8MmaLayout, LaneBytesAreTheFragmentCodes) {
  const int64_t n = 32, k = 256, groups = 2;
  std::vector<uint8_t> w(static_cast<size_t>(groups * n * k));
  std::mt19937 rng(3);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (const Tiling tiling : {Tiling::kRows16, Tiling::kSwigluPairs}) {
    const auto packed = mxfp8_mma::pack_matrix(w.data(), groups, n, k, tiling);
    ASSERT_EQ(packed.size(), w.size());
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t tau = 0; tau < n / 16; ++tau)
        for (int64_t s = 0; s < k / kStageK; ++s)
          for (int u = 0; u < 4; ++u)
            for (int lane = 0; lane < 32; ++lane)
              for (int h = 0; h < 2; ++h)
                for (int j = 0; j < 8; ++j) {
                  const int rr = (lane / 4) + 8 * h;
                  const int64_t row = nvfp4_mma::tile_row(tau, rr, n, tiling);
                  const int64_t col = s * kStageK + 32 * u + 8 * (lane % 4) + j;
                  const size_t at = static_cast<size_t>(g * n * k + (tau * (k / kStageK) + s) *
                                                        kStageBytes + u * 512 + lane * 16 +
                                                        h * 8 + j);
                  ASSERT_EQ(packed[at], w[static_cast<size_t>(g * n * k + row * k + col)])
                      << "tile " << tau << " stage " << s << " lane " << lane;
                }
  }
}

TEST(Mxfp8MmaLayout, FitsNeedsWholeTilesAndStages) {
  EXPECT_TRUE(mxfp8_mma::fits(9856, 6144, Tiling::kRows16));
  EXPECT_TRUE(mxfp8_mma::fits(6144, 6144, Tiling::kSwigluPairs));
  EXPECT_FALSE(mxfp8_mma::fits(1000, 6144, Tiling::kRows16));
  EXPECT_FALSE(mxfp8_mma::fits(6144, 640 + 32, Tiling::kRows16));
  EXPECT_FALSE(mxfp8_mma::fits(6144, 6144, Tiling::kRowMajor));
}

}  // namespace
}  // namespace m3::mxfp8_mma

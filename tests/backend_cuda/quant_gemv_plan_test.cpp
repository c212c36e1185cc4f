// Host-side planning of GEMV variant 3 (no GPU needed, so registered with ctest and run in CI):
// slice counts, shared-memory rows and the rows-per-CTA choice, at the real MiniMax-M3.1-Flash
// shapes and odd ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/quant_gemv_internal.h"

namespace m3 {
namespace {

using cuda::QuantFormat;

TEST(QuantGemvPlan, SliceCountsAtRealShapes) {
  // MXFP8: slices of 2048 (K % 2048 == 0) or 1536 elements; NVFP4: 4096.
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 6144), 3);   // qkv, shared up
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 8192), 4);   // o_proj
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 3072), 2);   // shared down
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 12288), 6);  // dense down
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kNvfp4, 6144), 2);   // expert w1|w3
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kNvfp4, 3072), 1);   // expert w2
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 96), 1);
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kMxfp8, 2080), 2);
  // BF16 (variant 2): slices of 256.
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kBf16, 6144), 24);
}

cuda::QuantGemvParams dense(QuantFormat f, int64_t m, int64_t n, int64_t k) {
  cuda::QuantGemvParams p;
  p.format = f;
  p.num_rows = m;
  p.n = n;
  p.k = k;
  p.variant = 3;
  return p;
}

TEST(QuantGemvPlan, SharedMemoryRowsAndRowsPerPass) {
  for (QuantFormat f : {QuantFormat::kMxfp8, QuantFormat::kNvfp4})
    for (int64_t m : {1, 2, 3, 5, 8})
      for (int64_t k : {96, 1536, 3072, 6144, 8192}) {
        const auto pl = cuda::gemv::plan_v3(dense(f, m, 6144, k));
        SCOPED_TRACE("M " + std::to_string(m) + " K " + std::to_string(k));
        EXPECT_EQ(pl.p_rows % pl.mt, 0);
        EXPECT_GE(pl.p_rows, 1);
        EXPECT_LE(pl.smem, size_t{96} * 1024);  // the dynamic limit the launchers raise
        EXPECT_EQ(pl.slices, cuda::quant_gemv_num_slices(f, k));
        if (f == QuantFormat::kNvfp4) {
          EXPECT_EQ(pl.mt, 1);  // 2+ rows per pass spill
        }
        // Up to 8 dense rows stream the weights once when they fit in shared memory.
        if (f == QuantFormat::kMxfp8 && k % 2048 == 0) {
          EXPECT_GE(pl.p_rows, std::min<int64_t>(m, 8));
        }
      }
}

TEST(QuantGemvPlan, RowsPerCtaCoverEveryRow) {
  for (int resident : {132, 528, 396})
    for (int64_t n : {77, 1000, 6144, 9856, 24576}) {
      cuda::QuantGemvParams p = dense(QuantFormat::kMxfp8, 1, n, 6144);
      auto pl = cuda::gemv::plan_v3(p);
      cuda::gemv::choose_iters_v3(p, resident, &pl);
      const int64_t rows = int64_t{8} * pl.rw * pl.iters;
      SCOPED_TRACE("N " + std::to_string(n) + " resident " + std::to_string(resident));
      EXPECT_GE(pl.iters, 1);
      EXPECT_LE(pl.iters, 16);
      EXPECT_EQ(int64_t{pl.grid.x}, (n + rows - 1) / rows * pl.slices);
    }
}

TEST(QuantGemvPlan, QkvAtBatchOneIsAboutOneWave) {
  // 9856 rows x 3 slices with 528 resident CTAs (4 per SM x 132): whole waves, not 2.3.
  cuda::QuantGemvParams p = dense(QuantFormat::kMxfp8, 1, 9856, 6144);
  auto pl = cuda::gemv::plan_v3(p);
  cuda::gemv::choose_iters_v3(p, 528, &pl);
  const double waves = double(pl.grid.x) / 528;
  EXPECT_NEAR(waves, std::round(waves), 0.05) << "grid " << pl.grid.x;
}

TEST(QuantGemvPlan, GroupedSlots) {
  cuda::QuantGemvParams p;
  p.format = QuantFormat::kNvfp4;
  p.variant = 3;
  p.num_groups = 128;
  int32_t dummy = 0;
  p.group_offsets = &dummy;  // only non-null matters for planning
  p.active_groups = &dummy;
  p.num_rows = 128 * 4;
  p.num_slots = 128;
  p.n = 6144;
  p.k = 6144;
  const auto pl = cuda::gemv::plan_v3(p);
  EXPECT_EQ(pl.grid.y, 128u);
  EXPECT_EQ(pl.mt, 1);
  EXPECT_GE(pl.p_rows, 4);  // ~4 rows per expert at 128 tokens: one pass for most experts
}

}  // namespace
}  // namespace m3

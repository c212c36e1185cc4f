// The host-side plan of the decode GEMVs (gemm/gemv_plan.h; no GPU needed, so registered with
// ctest and run in CI): which kernel each matrix of MiniMax-M3.1-Flash takes in every storage
// format and at every decode batch, and each kernel's launch shape (kDequantSplitK's slices,
// shared-memory rows and rows per CTA; the tensor-core kernels' row groups, staged forms and
// CTA widths), at the real shapes and odd ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/gemm/gemv_plan.h"
#include "backend/cuda/gemm/quant_gemv.h"

namespace m3 {
namespace {

using cuda::GemvKernel;
using cuda::QuantFormat;
using cuda::WeightLayout;

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
  // BF16 (kBf16SplitK): slices of 256.
  EXPECT_EQ(cuda::quant_gemv_num_slices(QuantFormat::kBf16, 6144), 24);
}

cuda::QuantGemvParams dense(QuantFormat f, int64_t m, int64_t n, int64_t k) {
  cuda::QuantGemvParams p;
  p.format = f;
  p.num_rows = m;
  p.n = n;
  p.k = k;
  p.kernel = GemvKernel::kDequantSplitK;
  return p;
}

TEST(DequantSplitKPlan, SharedMemoryRowsAndRowsPerPass) {
  for (QuantFormat f : {QuantFormat::kMxfp8, QuantFormat::kNvfp4})
    for (int64_t m : {1, 2, 3, 5, 8})
      for (int64_t k : {96, 1536, 3072, 6144, 8192}) {
        const auto pl = cuda::plan_dequant_splitk(dense(f, m, 6144, k));
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

TEST(DequantSplitKPlan, RowsPerCtaCoverEveryRow) {
  for (int resident : {132, 528, 396})
    for (int64_t n : {77, 1000, 6144, 9856, 24576}) {
      cuda::QuantGemvParams p = dense(QuantFormat::kMxfp8, 1, n, 6144);
      auto pl = cuda::plan_dequant_splitk(p);
      cuda::choose_dequant_splitk_iters(p, resident, &pl);
      const int64_t rows = int64_t{8} * pl.rw * pl.iters;
      SCOPED_TRACE("N " + std::to_string(n) + " resident " + std::to_string(resident));
      EXPECT_GE(pl.iters, 1);
      EXPECT_LE(pl.iters, 16);
      EXPECT_EQ(int64_t{pl.grid_x}, (n + rows - 1) / rows * pl.slices);
    }
}

TEST(DequantSplitKPlan, QkvAtBatchOneIsAboutOneWave) {
  // 9856 rows x 3 slices with 528 resident CTAs (4 per SM x 132): whole waves, not 2.3.
  cuda::QuantGemvParams p = dense(QuantFormat::kMxfp8, 1, 9856, 6144);
  auto pl = cuda::plan_dequant_splitk(p);
  cuda::choose_dequant_splitk_iters(p, 528, &pl);
  const double waves = double(pl.grid_x) / 528;
  EXPECT_NEAR(waves, std::round(waves), 0.05) << "grid " << pl.grid_x;
}

TEST(DequantSplitKPlan, GroupedSlots) {
  cuda::QuantGemvParams p;
  p.format = QuantFormat::kNvfp4;
  p.kernel = GemvKernel::kDequantSplitK;
  p.num_groups = 128;
  int32_t dummy = 0;
  p.group_offsets = &dummy;  // only non-null matters for planning
  p.active_groups = &dummy;
  p.num_rows = 128 * 4;
  p.num_slots = 128;
  p.n = 6144;
  p.k = 6144;
  const auto pl = cuda::plan_dequant_splitk(p);
  EXPECT_EQ(pl.grid_y, 128u);
  EXPECT_EQ(pl.mt, 1);
  EXPECT_GE(pl.p_rows, 4);  // ~4 rows per expert at 128 tokens: one pass for most experts
}

// The M3.1-Flash decode matrices: [n, k] of one matrix (experts: of one expert).
struct Matrix {
  const char* name;
  int64_t n, k;
  bool experts;
};
constexpr Matrix kMatrices[] = {
    {"q|k|v|index", 9856, 6144, false}, {"o_proj", 6144, 8192, false},
    {"dense gate|up", 24576, 6144, false}, {"dense down", 6144, 12288, false},
    {"shared gate|up", 6144, 6144, false}, {"shared down", 6144, 3072, false},
    {"router", 128, 6144, false}, {"lm_head", 200064, 6144, false},
    {"experts gate|up", 6144, 6144, true}, {"experts down", 6144, 3072, true}};

// Every matrix kind, storage format and layout the loader and the repack can produce, at every
// decode batch bucket (experts: 4 routed rows per token), with and without the f16 input.
TEST(DecodeGemvPlan, KernelForEveryMatrixFormatAndBatch) {
  for (const Matrix& m : kMatrices)
    for (QuantFormat f : {QuantFormat::kMxfp8, QuantFormat::kNvfp4, QuantFormat::kBf16})
      for (WeightLayout layout : {WeightLayout::kRowMajor, WeightLayout::kMmaRows16})
        for (int64_t batch = 1; batch <= 128; batch *= 2)
          for (bool f16 : {false, true}) {
            if (layout != WeightLayout::kRowMajor && f == QuantFormat::kBf16) continue;
            const int64_t rows = m.experts ? 4 * batch : batch;
            SCOPED_TRACE(std::string(m.name) + " format " + std::to_string(int(f)) + " layout " +
                         std::to_string(int(layout)) + " rows " + std::to_string(rows) +
                         (f16 ? " f16" : " bf16"));
            const GemvKernel kn = cuda::choose_decode_gemv(f, layout, rows, m.n, m.k, f16);
            const bool tc = cuda::decode_gemv_on_tensor_cores(f, layout, rows, m.n, m.k);
            if (f == QuantFormat::kBf16) {
              EXPECT_EQ(kn, GemvKernel::kBf16SplitK);
              EXPECT_FALSE(tc);
            } else if (f == QuantFormat::kMxfp8 && layout != WeightLayout::kRowMajor) {
              EXPECT_EQ(kn, GemvKernel::kMmaDirect);  // bf16 rows converted by the kernel
              EXPECT_TRUE(tc);
            } else if (!f16) {
              EXPECT_EQ(kn, GemvKernel::kDequantSplitK);
            } else if (f == QuantFormat::kNvfp4 || rows >= 2 || m.n * m.k < (int64_t{44} << 20)) {
              EXPECT_EQ(kn, GemvKernel::kMmaRing);
              EXPECT_TRUE(tc);
            } else {
              EXPECT_EQ(kn, GemvKernel::kDequantSplitK);  // large row-major MXFP8 at one row
              EXPECT_FALSE(tc);
            }
            // With the f16 input, the tensor-core kernels run exactly where the plan says so.
            if (f16) {
              EXPECT_EQ(tc, kn == GemvKernel::kMmaRing || kn == GemvKernel::kMmaDirect);
            }
          }
}

TEST(DecodeGemvPlan, LargeRowMajorMxfp8AtOneRow) {
  // q|k|v, o_proj and the dense gate|up (>= 44M elements) take the split-K kernel at one row
  // unless they are in the mma layout; the shared expert's gate|up (37.7M) the ring kernel.
  EXPECT_EQ(cuda::choose_decode_gemv(QuantFormat::kMxfp8, WeightLayout::kRowMajor, 1, 9856, 6144,
                                     true),
            GemvKernel::kDequantSplitK);
  EXPECT_EQ(cuda::choose_decode_gemv(QuantFormat::kMxfp8, WeightLayout::kRowMajor, 1, 6144, 8192,
                                     true),
            GemvKernel::kDequantSplitK);
  EXPECT_EQ(cuda::choose_decode_gemv(QuantFormat::kMxfp8, WeightLayout::kRowMajor, 1, 6144, 6144,
                                     true),
            GemvKernel::kMmaRing);
  EXPECT_EQ(cuda::choose_decode_gemv(QuantFormat::kMxfp8, WeightLayout::kRowMajor, 2, 9856, 6144,
                                     true),
            GemvKernel::kMmaRing);
  EXPECT_EQ(cuda::choose_decode_gemv(QuantFormat::kMxfp8, WeightLayout::kMmaSwigluPairs, 1, 24576,
                                     6144, false),
            GemvKernel::kMmaDirect);
}

cuda::QuantGemvParams grouped(QuantFormat f, int64_t tokens, int64_t top_k, int64_t experts) {
  static int32_t dummy = 0;
  cuda::QuantGemvParams p;
  p.format = f;
  p.group_offsets = &dummy;  // only non-null matters for planning
  p.active_groups = &dummy;
  p.num_groups = experts;
  p.num_rows = tokens * top_k;
  p.num_slots = std::min(experts, p.num_rows);
  p.max_group_rows = tokens;
  p.n = 6144;
  p.k = 6144;
  return p;
}

TEST(MmaRingPlan, RowGroupsAndStagedForms) {
  // Dense: the batch's rows in groups of 8 (at most 4 groups per pass).
  for (int64_t rows : {1, 8, 9, 16, 17, 32, 128}) {
    const cuda::QuantGemvParams p = dense(QuantFormat::kNvfp4, rows, 6144, 6144);
    EXPECT_EQ(cuda::mma_ring_row_groups(p), rows <= 8 ? 1 : rows <= 16 ? 2 : 4) << rows;
  }
  // Experts (top-4 of 128): twice the average rows per expert.
  EXPECT_EQ(cuda::mma_ring_row_groups(grouped(QuantFormat::kNvfp4, 1, 4, 128)), 1);
  EXPECT_EQ(cuda::mma_ring_row_groups(grouped(QuantFormat::kNvfp4, 32, 4, 128)), 1);
  EXPECT_EQ(cuda::mma_ring_row_groups(grouped(QuantFormat::kNvfp4, 128, 4, 128)), 1);  // 2 x 4
  EXPECT_EQ(cuda::mma_ring_row_groups(grouped(QuantFormat::kNvfp4, 256, 4, 128)), 2);  // 2 x 8
  EXPECT_EQ(cuda::mma_ring_row_groups(grouped(QuantFormat::kNvfp4, 512, 4, 128)), 4);  // 2 x 16
  // The activations staged with the weights: NVFP4 where every group has at most one row; their
  // block scales on the mma's outputs in the mma layout too.
  cuda::QuantGemvParams one = dense(QuantFormat::kNvfp4, 1, 6144, 6144);
  EXPECT_TRUE(cuda::mma_ring_form(one).stage_x);
  EXPECT_FALSE(cuda::mma_ring_form(one).scale_out);
  one.w_layout = WeightLayout::kMmaRows16;
  EXPECT_TRUE(cuda::mma_ring_form(one).stage_x);
  EXPECT_TRUE(cuda::mma_ring_form(one).scale_out);
  EXPECT_FALSE(cuda::mma_ring_form(dense(QuantFormat::kNvfp4, 2, 6144, 6144)).stage_x);
  EXPECT_FALSE(cuda::mma_ring_form(dense(QuantFormat::kMxfp8, 1, 6144, 6144)).stage_x);
  cuda::QuantGemvParams token = grouped(QuantFormat::kNvfp4, 1, 4, 128);
  token.w_layout = WeightLayout::kMmaSwigluPairs;
  EXPECT_TRUE(cuda::mma_ring_form(token).stage_x);
  EXPECT_TRUE(cuda::mma_ring_form(token).scale_out);
  EXPECT_FALSE(cuda::mma_ring_form(grouped(QuantFormat::kNvfp4, 2, 4, 128)).stage_x);
  EXPECT_EQ(cuda::rows_per_group(token), 1);
  EXPECT_EQ(cuda::rows_per_group(dense(QuantFormat::kNvfp4, 5, 16, 128)), 5);
}

TEST(MmaRingPlan, WarpsPerCta) {
  // Resident CTAs per SM at 1, 2, 4, 6, 8 warps (index = warps).
  const int occ[9] = {0, 8, 8, 0, 4, 0, 3, 0, 2};
  const int sms = 132;
  // One wave at every width: the widest (within the stages).
  EXPECT_EQ(cuda::mma_ring_warps(132, 48, occ, sms, false), 8);
  EXPECT_EQ(cuda::mma_ring_warps(132, 5, occ, sms, false), 4);  // no more warps than stages
  // One wave up to 4 warps per CTA (528 CTAs): 4.
  EXPECT_EQ(cuda::mma_ring_warps(528, 48, occ, sms, false), 4);
  // Several waves: the NVFP4 experts in the mma layout one warp per CTA, many waves 2, else the
  // width whose last wave is fullest.
  EXPECT_EQ(cuda::mma_ring_warps(4 * 1536, 12, occ, sms, true), 1);
  EXPECT_EQ(cuda::mma_ring_warps(4 * 528 * 2, 12, occ, sms, false), 2);
  const int w = cuda::mma_ring_warps(1200, 48, occ, sms, false);
  EXPECT_TRUE(w == 2 || w == 4 || w == 6 || w == 8) << w;
  for (int other : {2, 4, 6, 8}) {
    const auto fill = [&](int x) {
      const double waves = 1200.0 / (double(occ[x]) * sms);
      return waves / std::ceil(waves);
    };
    EXPECT_GE(fill(w) + 1e-6, fill(other)) << "width " << w << " against " << other;
  }
}

TEST(MmaDirectPlan, RowGroupsAndWarpsPerCta) {
  cuda::QuantGemvParams p = dense(QuantFormat::kMxfp8, 1, 9856, 6144);
  EXPECT_EQ(cuda::mma_direct_row_groups(p), 1);  // bf16 rows (no xh)
  static const uint16_t xh = 0;
  p.xh = &xh;
  for (int64_t rows : {1, 8, 9, 16, 17, 32, 40}) {
    p.num_rows = rows;
    EXPECT_EQ(cuda::mma_direct_row_groups(p), rows <= 8 ? 1 : rows <= 16 ? 2 : 4) << rows;
  }
  const int occ[9] = {0, 6, 6, 5, 4, 3, 2, 2, 2};
  const int sms = 132;
  // q|k|v at one row: 616 tiles, 48 stages: the widest width whose grid is one resident wave
  // with at most 24 warps per SM.
  const int w = cuda::mma_direct_warps(616, 48, occ, sms);
  EXPECT_LE(616 * w, 24 * sms);
  EXPECT_LE(616, occ[w] * sms);
  if (w < 8) {
    EXPECT_TRUE(616 * (w + 1) > 24 * sms || 616 > occ[w + 1] * sms) << w;
  }
  // The dense gate|up's 1536 tiles leave a second wave at every width: one warp.
  EXPECT_EQ(cuda::mma_direct_warps(1536, 48, occ, sms), 1);
  // Never more warps than stages.
  EXPECT_EQ(cuda::mma_direct_warps(16, 3, occ, sms), 3);
}

}  // namespace
}  // namespace m3

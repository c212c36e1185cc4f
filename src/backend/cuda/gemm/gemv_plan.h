// The host-side plan of the decode GEMVs (quant_gemv.h): which kernel runs a matrix product and
// the launch shape of each kernel, from the shapes, the storage and what the device reports
// (SM count, resident CTAs per SM). Pure functions of their arguments, so that the choices are
// unit-tested on the CPU (tests/backend_cuda/quant_gemv_plan_test.cpp); the launchers query the
// device and pass what it reports. This header includes no CUDA header.
#pragma once

#include <cstdint>
#include <cstddef>

#include "backend/cuda/gemm/quant_gemv.h"

namespace m3::cuda {

// ---- The kernel of a decode GEMV.

// Whether the decode GEMV of a [n, k] matrix in `format` / `layout` at `rows` activation rows
// (routed rows for the experts) runs on the tensor cores, given its activations' f16 form: the
// producer of its input then writes that form (x_f16.h). kMmaDirect reads every MXFP8 matrix in
// the mma layout; kMmaRing the NVFP4 matrices at every batch and the row-major MXFP8 ones from two
// rows and, at one row, below 44M elements: above that the split-K kernel was faster at one row
// (H200: q/k/v [9856 x 6144] 22.5 against 24.7 us, o_proj [6144 x 8192] 20.6 against 22.3, the
// dense gate|up 47 against 59; the shared expert's [6144 x 6144] gate|up 17.7 against 18.1 with
// its epilogue launch and its down 11.0 against 12.8 are faster on the tensor cores, as are the
// NVFP4 experts and every batch from two rows). Its small CTAs also share the SMs better with the
// routed experts beside them. BF16: never.
bool decode_gemv_on_tensor_cores(QuantFormat format, WeightLayout layout, int64_t rows,
                                 int64_t n, int64_t k);

// The kernel of that GEMV: kMmaDirect for MXFP8 in the mma layout (it converts bf16 rows itself
// where there is no f16 form); kMmaRing where decode_gemv_on_tensor_cores and the input has its
// f16 form; else the split-K kernel of the format (kBf16SplitK for BF16, kDequantSplitK for MXFP8 /
// NVFP4, which read row-major weights only).
GemvKernel choose_decode_gemv(QuantFormat format, WeightLayout layout, int64_t rows, int64_t n,
                              int64_t k, bool f16_input);

// ---- kDequantSplitK (gemv_dequant_splitk.cuh): the launch shape.

struct DequantSplitKPlan {
  int kc = 4;          // chunks (one 16-byte load per lane per row) per K-slice
  int mt = 1;          // activation rows per register pass
  int rw = 2;          // weight rows per warp step
  int p_rows = 1;      // activation rows in shared memory (a multiple of mt)
  int iters = 1;       // warp steps per CTA
  int64_t slices = 1;  // K-slices (partial planes)
  size_t smem = 0;     // dynamic shared memory bytes
  uint32_t grid_x = 1, grid_y = 1;
};
DequantSplitKPlan plan_dequant_splitk(const QuantGemvParams& p);
// Warp steps per CTA for `resident` co-resident CTAs (occupancy x SMs): the fewest waves lost to
// a partial last wave, weighed against the activation fill each CTA pays (an L2 read of its
// rows, ~1/3 the cost of an HBM byte); updates plan.iters and plan.grid_x.
void choose_dequant_splitk_iters(const QuantGemvParams& p, int resident, DequantSplitKPlan* plan);

// ---- kMmaRing (gemv_mma.cuh, gemv_mma_ring.cu).

// The most activation rows one group can hold (dense: every row; grouped: max_group_rows where
// given).
int64_t rows_per_group(const QuantGemvParams& p);

// Groups of 8 activation rows per pass (1, 2 or 4): a dense linear's rows, for experts twice the
// average rows per expert (more take another pass over the weights).
int mma_ring_row_groups(const QuantGemvParams& p);

// How the ring kernel takes its operands. Both forms are where every group has at most one row
// (dense: one row; grouped: max_group_rows 1), NVFP4 only: at one row MXFP8 was slower so (the
// shared gate|up 18.1 -> 19.2 us, down 11.3 -> 12.0; its 256-byte slices per stage are L1 hits).
struct MmaRingForm {
  // The activation row's slice of each stage copied into the weight ring through L1 (the CTAs of
  // an SM share one request; the NVFP4 experts at one token 53.0 -> 49.2 us, through L1 rather
  // than L2 alone 44.2 -> 37.1 us for their gate|up).
  bool stage_x = false;
  // With stage_x and NVFP4 in the mma layout: the block scales multiply the mma's outputs instead
  // of its dequantised weights (fewer instructions per weight word; the sums rounded in another
  // order, within the same bound).
  bool scale_out = false;
};
MmaRingForm mma_ring_form(const QuantGemvParams& p);

// Warps per CTA of the ring kernel for a grid of `ctas` CTAs, K in `stages` ring stages,
// `occupancy[w]` resident CTAs per SM at w warps (w = 1, 2, 4, 6, 8) and `sms` SMs. Every CTA pays
// one pipeline fill (a memory latency) before it streams, so the grid should be resident in one
// wave where it can: the widest width whose grid fits on the SMs at once. Grids of several waves
// (many experts) take 2 warps per CTA (NVFP4 experts in the mma layout, `packed_grouped`: 1):
// finer pieces balance the SMs better (H200, NVFP4 experts at batch 32: 1037 against 1404 us with
// 4 warps; in the mma layout at 2 / 8 / 32 / 128 tokens 82.6 / 255.6 / 693.2 / 1221.8 us with one
// warp against 87.2 / 257.1 / 722.3 / 1276.2 with two). Else the width whose last wave is fullest.
int mma_ring_warps(int64_t ctas, int64_t stages, const int (&occupancy)[9], int sms,
                   bool packed_grouped);

// ---- kMmaDirect (gemv_mma_direct.cu).

// Groups of 8 activation rows per pass (1, 2 or 4) where the input has its f16 form (passes of up
// to 32 rows); 1 for bf16 rows (at most 8, converted by each warp).
int mma_direct_row_groups(const QuantGemvParams& p);

// Warps per CTA of the direct kernel for `tiles` CTAs (16-row tiles), K in `stages` 128-element
// stages and `occupancy[w]` resident CTAs per SM at w warps (w = 1..8): the widest whose grid is
// resident in one wave with at most ~24 warps per SM; one warp where wider CTAs would leave a
// second wave (the dense gate|up's 1536 tiles); never more warps than stages. H200, one row,
// this choice against 2 / 4 / 8 warps forced: q/k/v 20.6 against 24.9 / 20.5 / 24.5 us, o_proj
// 18.6 against 26.9 / 19.6 / 21.4.
int mma_direct_warps(int64_t tiles, int64_t stages, const int (&occupancy)[9], int sms);

}  // namespace m3::cuda

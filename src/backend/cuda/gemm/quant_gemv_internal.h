// Per-format launchers (one translation unit each), dispatched by launch_quant_gemv.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/gemm/quant_gemv.h"

namespace m3::cuda::gemv {

// Variant 2 (quant_gemv.cuh, gemv_bf16.cu): BF16 weights, mt activation rows per pass.
Status launch_bf16(const QuantGemvParams& p, int mt, cudaStream_t s);

// Variant 3 (quant_gemv_v3.cuh): the launch shape chosen on the host.
struct V3Plan {
  int kc = 4;          // chunks (one 16-byte load per lane per row) per K-slice
  int mt = 1;          // activation rows per register pass
  int rw = 2;          // weight rows per warp step
  int p_rows = 1;      // activation rows in shared memory (a multiple of mt)
  int iters = 1;       // warp steps per CTA
  int64_t slices = 1;  // K-slices (partial planes)
  size_t smem = 0;     // dynamic shared memory bytes
  dim3 grid;
};
V3Plan plan_v3(const QuantGemvParams& p);
// Warp steps per CTA for `resident` co-resident CTAs (occupancy x SMs): the fewest waves lost to
// a partial last wave, weighed against the activation fill each CTA pays (an L2 read of its
// rows, ~1/3 the cost of an HBM byte); updates plan.iters and plan.grid.
void choose_iters_v3(const QuantGemvParams& p, int resident, V3Plan* plan);
Status launch_mxfp8_v3(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s);
Status launch_nvfp4_v3(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s);

// The most activation rows one group can hold (dense: every row; grouped: max_group_rows where
// given), which picks variant 5's staged activations.
int64_t rows_per_group(const QuantGemvParams& p);

// Variant 5 (quant_gemv_mma.cuh, gemv_mma.cu): tensor-core GEMV with the epilogue fused.
Status launch_mma(const QuantGemvParams& p, cudaStream_t s);
// What variant 5 needs of its parameters (f16 activations and weights 16-byte aligned, the
// grouping pointers together, the epilogue's output, an f16 SwiGLU output in range, the storage
// order matching the epilogue): "" when met, else what is wrong.
std::string tensor_core_params_problem(const QuantGemvParams& p);

// Variant 7 (gemv_mma_direct.cu): MXFP8 at 1..8 rows on the tensor cores, weights loaded into
// registers stages ahead, bf16 activations, epilogue fused. "" when it can run p, else why not.
std::string direct_params_problem(const QuantGemvParams& p);
Status launch_direct(const QuantGemvParams& p, cudaStream_t s);

// Grid of the BF16 GEMV kernel: x over (row tiles × K-slices) in blocks of kWarps warps, y over
// group slots.
dim3 grid_for(const QuantGemvParams& p, int64_t slice, int64_t rows_per_warp);

}  // namespace m3::cuda::gemv

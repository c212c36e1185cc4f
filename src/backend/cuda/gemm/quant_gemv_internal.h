// The per-kernel launchers (one translation unit each), dispatched by launch_quant_gemv. Their
// launch shapes come from gemv_plan.h.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/gemm/gemv_plan.h"
#include "backend/cuda/gemm/quant_gemv.h"

namespace m3::cuda::gemv {

// kBf16SplitK (gemv_bf16.cu): mt activation rows per pass.
Status launch_bf16_splitk(const QuantGemvParams& p, int mt, cudaStream_t s);

// kDequantSplitK (gemv_dequant_splitk.cuh; one instantiation file per format).
Status launch_dequant_splitk_mxfp8(const QuantGemvParams& p, const DequantSplitKPlan& plan,
                                   cudaStream_t s);
Status launch_dequant_splitk_nvfp4(const QuantGemvParams& p, const DequantSplitKPlan& plan,
                                   cudaStream_t s);

// kMmaRing (gemv_mma.cuh, gemv_mma_ring.cu).
Status launch_mma_ring(const QuantGemvParams& p, cudaStream_t s);
// What kMmaRing needs of its parameters (f16 activations and weights 16-byte aligned, the
// grouping pointers together, the epilogue's output, an f16 SwiGLU output in range, the storage
// order matching the epilogue): "" when met, else what is wrong.
std::string mma_ring_params_problem(const QuantGemvParams& p);

// kMmaDirect (gemv_mma_direct.cu): "" when it can run p, else why not.
std::string mma_direct_params_problem(const QuantGemvParams& p);
Status launch_mma_direct(const QuantGemvParams& p, cudaStream_t s);

}  // namespace m3::cuda::gemv

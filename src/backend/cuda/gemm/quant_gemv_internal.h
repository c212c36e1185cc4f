// Per-format launchers (one translation unit each), dispatched by launch_quant_gemv.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/gemm/quant_gemv.h"

namespace m3::cuda::gemv {

Status launch_mxfp8(const QuantGemvParams& p, int mt, cudaStream_t s);
Status launch_nvfp4(const QuantGemvParams& p, int mt, cudaStream_t s);
Status launch_bf16(const QuantGemvParams& p, int mt, cudaStream_t s);

// Grid of the GEMV kernel: x over (row tiles × K-slices) in blocks of kWarps warps, y over
// group slots.
dim3 grid_for(const QuantGemvParams& p, int64_t slice, int64_t rows_per_warp = 16);

}  // namespace m3::cuda::gemv

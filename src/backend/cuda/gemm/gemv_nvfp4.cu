// NVFP4 instantiations of the dequantising GEMV (MT = 1, 2 activation rows per pass: 32 floats
// of activations per row live in registers).
#include "backend/cuda/gemm/quant_gemv.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

Status launch_nvfp4(const QuantGemvParams& p, int mt, cudaStream_t s) {
  const dim3 grid = grid_for(p, FormatTraits<QuantFormat::kNvfp4>::kSlice);
  const int m = mt <= 1 ? 1 : mt <= 2 ? 2 : 2;
  const int u = p.variant == 1 ? 8 : 4;
  if (p.variant == 2) {  // 2 rows per warp (see quant_gemv_kernel_v2)
    const dim3 grid2 = grid_for(p, FormatTraits<QuantFormat::kNvfp4>::kSlice,
                                rows_v2<QuantFormat::kNvfp4>());
    if (m == 1) {
      quant_gemv_kernel_v2<QuantFormat::kNvfp4, 1><<<grid2, kWarps * 32, 0, s>>>(p);
    } else {
      quant_gemv_kernel_v2<QuantFormat::kNvfp4, 2><<<grid2, kWarps * 32, 0, s>>>(p);
    }
    M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel_v2");
    return Status::ok();
  }
  // Variant 2 spills at 128 registers for NVFP4 (160+ bytes): NVFP4 keeps variant 0 for now.
  if (m == 1 && u == 4) {
    quant_gemv_kernel<QuantFormat::kNvfp4, 1, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 1 && u == 8) {
    quant_gemv_kernel<QuantFormat::kNvfp4, 1, 8><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 4) {
    quant_gemv_kernel<QuantFormat::kNvfp4, 2, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 8) {
    quant_gemv_kernel<QuantFormat::kNvfp4, 2, 8><<<grid, kWarps * 32, 0, s>>>(p);
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel<nvfp4>");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

// MXFP8 instantiations of the dequantising GEMV (MT = 1, 2, 4 activation rows per pass).
#include "backend/cuda/gemm/quant_gemv.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

Status launch_mxfp8(const QuantGemvParams& p, int mt, cudaStream_t s) {
  const dim3 grid = grid_for(p, FormatTraits<QuantFormat::kMxfp8>::kSlice);
  const int m = mt <= 1 ? 1 : mt <= 2 ? 2 : 4;
  const int u = p.variant == 1 ? 8 : 4;
  if (p.variant == 2 && m <= 2) {  // MT = 4 spills in variant 2: it keeps variant 0
    const dim3 grid2 = grid_for(p, FormatTraits<QuantFormat::kMxfp8>::kSlice, kRowsV2);
    if (m == 1) {
      quant_gemv_kernel_v2<QuantFormat::kMxfp8, 1><<<grid2, kWarps * 32, 0, s>>>(p);
    } else if (m == 2) {
      quant_gemv_kernel_v2<QuantFormat::kMxfp8, 2><<<grid2, kWarps * 32, 0, s>>>(p);
    }
    M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel_v2");
    return Status::ok();
  }
  if (m == 1 && u == 4) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 1, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 1 && u == 8) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 1, 8><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 4) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 2, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 8) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 2, 8><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 4 && u == 4) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 4, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 4 && u == 8) {
    quant_gemv_kernel<QuantFormat::kMxfp8, 4, 8><<<grid, kWarps * 32, 0, s>>>(p);
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel<mxfp8>");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

// MXFP8 instantiations of the dequantising GEMV (MT = 1, 2, 4 activation rows per pass).
#include "backend/cuda/gemm/quant_gemv.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

Status launch_mxfp8(const QuantGemvParams& p, int mt, cudaStream_t s) {
  const dim3 grid = grid_for(p, FormatTraits<QuantFormat::kMxfp8>::kSlice);
  switch (mt) {
    case 1:
      quant_gemv_kernel<QuantFormat::kMxfp8, 1><<<grid, kWarps * 32, 0, s>>>(p);
      break;
    case 2:
      quant_gemv_kernel<QuantFormat::kMxfp8, 2><<<grid, kWarps * 32, 0, s>>>(p);
      break;
    default:
      quant_gemv_kernel<QuantFormat::kMxfp8, 4><<<grid, kWarps * 32, 0, s>>>(p);
      break;
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel<mxfp8>");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

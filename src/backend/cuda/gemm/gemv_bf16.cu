// BF16 instantiations of the streaming GEMV variant 2 (the lm_head at one row, the router above 32
// rows; MT = 1, 2, 4 activation rows per pass: 8 floats of activations per row per lane).
#include "backend/cuda/gemm/quant_gemv.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

Status launch_bf16(const QuantGemvParams& p, int mt, cudaStream_t s) {
  const int m = mt <= 1 ? 1 : mt <= 2 ? 2 : 4;
  const dim3 grid2 = grid_for(p, FormatTraits<QuantFormat::kBf16>::kSlice, kRowsV2);
  if (m == 1) {
    quant_gemv_kernel_v2<QuantFormat::kBf16, 1><<<grid2, kWarps * 32, 0, s>>>(p);
  } else if (m == 2) {
    quant_gemv_kernel_v2<QuantFormat::kBf16, 2><<<grid2, kWarps * 32, 0, s>>>(p);
  } else if (m == 4) {
    quant_gemv_kernel_v2<QuantFormat::kBf16, 4><<<grid2, kWarps * 32, 0, s>>>(p);
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel_v2");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

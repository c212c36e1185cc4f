// BF16 instantiations of the streaming GEMV (lm_head; MT = 1, 2, 4, 8 activation rows per pass:
// 8 floats of activations per row per lane).
#include "backend/cuda/gemm/quant_gemv.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

Status launch_bf16(const QuantGemvParams& p, int mt, cudaStream_t s) {
  const dim3 grid = grid_for(p, FormatTraits<QuantFormat::kBf16>::kSlice);
  const int m = mt <= 1 ? 1 : mt <= 2 ? 2 : 4;
  const int u = p.variant == 1 ? 8 : 4;
  if (m == 1 && u == 4) {
    quant_gemv_kernel<QuantFormat::kBf16, 1, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 1 && u == 8) {
    quant_gemv_kernel<QuantFormat::kBf16, 1, 8><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 4) {
    quant_gemv_kernel<QuantFormat::kBf16, 2, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2 && u == 8) {
    quant_gemv_kernel<QuantFormat::kBf16, 2, 8><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 4 && u == 4) {
    quant_gemv_kernel<QuantFormat::kBf16, 4, 4><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 4 && u == 8) {
    quant_gemv_kernel<QuantFormat::kBf16, 4, 8><<<grid, kWarps * 32, 0, s>>>(p);
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel<bf16>");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

// NVFP4 instantiations of kDequantSplitK (gemv_dequant_splitk.cuh): one activation row per
// register pass (more rows loop over the weights held in registers), 4 chunks per K-slice
// (spill-free at 64 registers; 2+ rows per pass or 2-3 chunks spill).
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/gemv_dequant_splitk.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

template <int MT, int RW, int KC>
Status launch(const QuantGemvParams& p, const DequantSplitKPlan& plan, cudaStream_t s) {
  return launch_dequant_splitk<QuantFormat::kNvfp4, MT, RW, KC>(p, plan, s);
}

}  // namespace

Status launch_dequant_splitk_nvfp4(const QuantGemvParams& p, const DequantSplitKPlan& plan,
                                   cudaStream_t s) {
  const int key = plan.mt * 10 + plan.kc;
  switch (key) {
    case 14: return launch<1, 1, 4>(p, plan, s);
    default: break;
  }
  return invalid_argument("[cuda.quant_gemv] no NVFP4 kDequantSplitK kernel for mt " +
                          std::to_string(plan.mt) + ", chunks " + std::to_string(plan.kc));
}

}  // namespace m3::cuda::gemv

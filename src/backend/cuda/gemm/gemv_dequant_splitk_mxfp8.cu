// MXFP8 instantiations of kDequantSplitK (gemv_dequant_splitk.cuh): MT in {1, 2, 4} activation
// rows per register pass, one weight row per warp step, 3 or 4 chunks per K-slice (spill-free at
// 64 registers).
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/gemv_dequant_splitk.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

template <int MT, int RW, int KC>
Status launch(const QuantGemvParams& p, const DequantSplitKPlan& plan, cudaStream_t s) {
  return launch_dequant_splitk<QuantFormat::kMxfp8, MT, RW, KC>(p, plan, s);
}

}  // namespace

Status launch_dequant_splitk_mxfp8(const QuantGemvParams& p, const DequantSplitKPlan& plan,
                                   cudaStream_t s) {
  const int key = plan.mt * 10 + plan.kc;
  switch (key) {
    case 13: return launch<1, 1, 3>(p, plan, s);
    case 14: return launch<1, 1, 4>(p, plan, s);
    case 23: return launch<2, 1, 3>(p, plan, s);
    case 24: return launch<2, 1, 4>(p, plan, s);
    case 43: return launch<4, 1, 3>(p, plan, s);
    case 44: return launch<4, 1, 4>(p, plan, s);
    default: break;
  }
  return invalid_argument("[cuda.quant_gemv] no MXFP8 kDequantSplitK kernel for mt " +
                          std::to_string(plan.mt) + ", chunks " + std::to_string(plan.kc));
}

}  // namespace m3::cuda::gemv

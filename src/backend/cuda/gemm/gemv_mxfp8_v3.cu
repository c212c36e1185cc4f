// MXFP8 instantiations of GEMV variant 3 (quant_gemv_v3.cuh): MT in {1, 2, 4} activation rows per
// register pass, one weight row per warp step, 3 or 4 chunks per K-slice (spill-free at 64 registers).
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_v3.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

template <int MT, int RW, int KC>
Status launch(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s) {
  return launch_v3<QuantFormat::kMxfp8, MT, RW, KC>(p, plan, s);
}

}  // namespace

Status launch_mxfp8_v3(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s) {
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
  return invalid_argument("[cuda.quant_gemv] no MXFP8 variant-3 kernel for mt " +
                          std::to_string(plan.mt) + ", chunks " + std::to_string(plan.kc));
}

}  // namespace m3::cuda::gemv

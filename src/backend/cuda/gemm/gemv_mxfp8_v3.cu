// MXFP8 instantiations of GEMV variant 3 (quant_gemv_v3.cuh): MT in {1, 2, 4} activation rows per
// register pass, one weight row per warp step, 3 or 4 chunks per K-slice (spill-free at 64 registers).
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_v3.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

template <int MT, int RW, int KC, bool FUSE>
Status launch_one(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s) {
  auto* kernel = quant_gemv_kernel_v3<QuantFormat::kMxfp8, MT, RW, KC, FUSE>;
  static bool raised = false;  // dynamic shared memory above 48 KB needs an opt-in once
  if (!raised) {
    M3_CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
    raised = true;
  }
  // CTAs resident at this shared-memory size (occupancy x SMs), cached per instantiation.
  static size_t occ_smem = ~size_t{0};
  static int resident = 0;
  if (occ_smem != plan.smem) {
    int occ = 0, dev = 0, sms = 0;
    M3_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
    M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    M3_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kV3Threads, plan.smem));
    resident = (occ > 0 ? occ : 1) * sms;
    occ_smem = plan.smem;
  }
  V3Plan pl = plan;
  choose_iters_v3(p, resident, &pl);
  kernel<<<pl.grid, kV3Threads, pl.smem, s>>>(p, pl.p_rows, pl.iters);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("quant_gemv_kernel_v3<mxfp8>");
  return Status::ok();
}

template <int MT, int RW, int KC>
Status launch(const QuantGemvParams& p, const V3Plan& plan, cudaStream_t s) {
  return p.fuse_epilogue ? launch_one<MT, RW, KC, true>(p, plan, s)
                         : launch_one<MT, RW, KC, false>(p, plan, s);
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

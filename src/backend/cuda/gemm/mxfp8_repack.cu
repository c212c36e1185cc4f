// The MXFP8 mma-layout repack (mxfp8_repack.h): one thread per 16-byte lane piece of the
// destination, gathering 8 bytes of each of its two tile rows (quant/mxfp8_mma_layout.h).
#include "backend/cuda/gemm/mxfp8_repack.h"
#include "backend/cuda/gemm/repack_in_place.h"

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

__global__ void mxfp8_repack_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                    int64_t pieces, int64_t n, int64_t k, int tiling) {
  const int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (q >= pieces) return;
  const int64_t bytes = n * k, o = q * 16;
  const int64_t ts = o / mxfp8_mma::kStageBytes, stages = k / mxfp8_mma::kStageK;
  const int64_t tau = ts / stages, s = ts % stages;
  const int u = static_cast<int>(o % mxfp8_mma::kStageBytes) / 512;
  const int lane = static_cast<int>(o % 512) / 16;
  const int64_t col = s * mxfp8_mma::kStageK + 32 * u + 8 * (lane & 3);
  const auto t = static_cast<mxfp8_mma::Tiling>(tiling);
  const int64_t row_lo = nvfp4_mma::tile_row(tau, lane >> 2, n, t);
  const int64_t row_hi = nvfp4_mma::tile_row(tau, (lane >> 2) + 8, n, t);
  const uint8_t* m = src + blockIdx.y * bytes;
  const uint2 lo = *reinterpret_cast<const uint2*>(m + row_lo * k + col);
  const uint2 hi = *reinterpret_cast<const uint2*>(m + row_hi * k + col);
  *reinterpret_cast<uint4*>(dst + blockIdx.y * bytes + o) = make_uint4(lo.x, lo.y, hi.x, hi.y);
}

Status check(int64_t groups, int64_t n, int64_t k, mxfp8_mma::Tiling tiling) {
  if (groups < 1 || groups > 65535 || !mxfp8_mma::fits(n, k, tiling))
    return invalid_argument("[cuda.mxfp8_mma_repack] groups " + std::to_string(groups) + ", N " +
                            std::to_string(n) + ", K " + std::to_string(k) + ", tiling " +
                            std::to_string(static_cast<int>(tiling)) +
                            ": needs 1..65535 groups, K % 128 == 0, N % 16 == 0 and a tiling "
                            "of 1 or 2");
  return Status::ok();
}

}  // namespace

Status launch_mxfp8_mma_repack(const uint8_t* src, uint8_t* dst, int64_t groups, int64_t n,
                               int64_t k, mxfp8_mma::Tiling tiling, CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check(groups, n, k, tiling));
  if (src == nullptr || dst == nullptr || src == dst)
    return invalid_argument("[cuda.mxfp8_mma_repack] needs distinct non-null src and dst");
  if ((reinterpret_cast<uintptr_t>(src) & 7) != 0 || (reinterpret_cast<uintptr_t>(dst) & 15) != 0)
    return invalid_argument("[cuda.mxfp8_mma_repack] src must be 8-byte, dst 16-byte aligned");
  const int64_t pieces = n * k / 16;
  const dim3 grid(static_cast<unsigned>((pieces + 255) / 256), static_cast<unsigned>(groups));
  mxfp8_repack_kernel<<<grid, 256, 0, stream>>>(src, dst, pieces, n, k, static_cast<int>(tiling));
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(mxfp8_repack_kernel);
  return Status::ok();
}

Status mxfp8_mma_repack_in_place(uint8_t* w, int64_t groups, int64_t n, int64_t k,
                                 mxfp8_mma::Tiling tiling, CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check(groups, n, k, tiling));
  return repack_in_place(
      w, groups, n * k,
      [&](const uint8_t* src, uint8_t* dst) {
        return launch_mxfp8_mma_repack(src, dst, 1, n, k, tiling, stream);
      },
      stream);
}

}  // namespace m3::cuda

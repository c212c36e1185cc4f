#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/gemm/repack_in_place.h"

#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

struct Table {
  uint32_t col[32];
};

// One thread per packed word: gathers its 8 codes (rows g, g + 8 of the tile; columns
// 128c + 32t + 4i + j) from the row-major source and packs them with the inverse table.
__global__ void nvfp4_repack_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                    int64_t words_per_matrix, int64_t n, int64_t k, int tiling,
                                    Table table) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t gi = blockIdx.y;
  if (idx >= words_per_matrix) return;
  const int64_t chunks = k / nvfp4_mma::kChunkK;
  // idx = ((tau · chunks + c) · 32 + lane) · 8 + i (the logical order; the offset swizzles).
  const int i = static_cast<int>(idx & 7), lane = static_cast<int>((idx >> 3) & 31);
  const int64_t tc = idx >> 8, tau = tc / chunks, c = tc % chunks;
  const int g = lane >> 2, t = lane & 3;
  const int64_t bytes = n * k / 2;
  const uint8_t* s = src + gi * bytes;
  const auto tl = static_cast<nvfp4_mma::Tiling>(tiling);
  uint8_t nib[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = nvfp4_mma::tile_row(tau, g + 8 * h, n, tl);
    const int64_t col = c * nvfp4_mma::kChunkK + 32 * t + 4 * i;  // even: 2 whole bytes
    const uint16_t two = *reinterpret_cast<const uint16_t*>(s + row * (k / 2) + col / 2);
#pragma unroll
    for (int j = 0; j < 4; ++j) nib[h][j] = static_cast<uint8_t>((two >> (4 * j)) & 15u);
  }
  const uint32_t x = nvfp4_mma::pack_word(table.col, nib);
  *reinterpret_cast<uint32_t*>(dst + gi * bytes + nvfp4_mma::word_offset(tau, c, lane, i, k)) = x;
}

Status check(int64_t groups, int64_t n, int64_t k, nvfp4_mma::Tiling tiling) {
  if (groups < 1 || groups > 65535 || !nvfp4_mma::fits(n, k, tiling))
    return invalid_argument("[cuda.nvfp4_mma_repack] groups " + std::to_string(groups) + ", N " +
                            std::to_string(n) + ", K " + std::to_string(k) + ", tiling " +
                            std::to_string(static_cast<int>(tiling)) +
                            ": needs 1..65535 groups, K % 128 == 0, N % 16 == 0 and a tiling "
                            "of 1 or 2");
  return Status::ok();
}

}  // namespace

Status launch_nvfp4_mma_repack(const uint8_t* src, uint8_t* dst, int64_t groups, int64_t n,
                               int64_t k, nvfp4_mma::Tiling tiling, CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check(groups, n, k, tiling));
  if (src == nullptr || dst == nullptr || src == dst)
    return invalid_argument("[cuda.nvfp4_mma_repack] needs distinct non-null src and dst");
  Table table;
  for (int b = 0; b < 32; ++b) table.col[b] = nvfp4_mma::pack_table()[static_cast<size_t>(b)];
  const int64_t words = n * k / 8;
  const dim3 grid(static_cast<unsigned>((words + 255) / 256), static_cast<unsigned>(groups));
  nvfp4_repack_kernel<<<grid, 256, 0, stream>>>(src, dst, words, n, k, static_cast<int>(tiling),
                                                table);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(nvfp4_repack_kernel);
  return Status::ok();
}

Status nvfp4_mma_repack_in_place(uint8_t* w, int64_t groups, int64_t n, int64_t k,
                                 nvfp4_mma::Tiling tiling, CUstream_st* stream) {
  M3_RETURN_IF_ERROR(check(groups, n, k, tiling));
  return repack_in_place(
      w, groups, n * k / 2,
      [&](const uint8_t* src, uint8_t* dst) {
        return launch_nvfp4_mma_repack(src, dst, 1, n, k, tiling, stream);
      },
      stream);
}

}  // namespace m3::cuda

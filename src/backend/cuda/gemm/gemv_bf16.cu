// kBf16SplitK: the BF16 GEMV on the CUDA cores (the lm_head at one row, 579 us on the H200: 88 %
// of HBM; the router above the fused router's rows), split over K.
//
// Work split: a warp owns a K-slice of 256 elements (one 16-byte load per lane per weight row) of
// kRowsPerWarp = 4 weight rows of one group and keeps its lane's slice of MT (1, 2, 4) activation
// rows in registers, as float. The 4 rows' loads are issued before the first is used, and the
// lane partial sums are reduced by one transposing butterfly (6 shuffles per 4 rows and
// activation row instead of 20). Lane 0 of each row writes partial[s, r, n]; the epilogue sums
// the slices.
#include "backend/cuda/gemm/gemv_common.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda::gemv {

namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kLog2RowsPerWarp = 2;

// out[m] += the dot product of one lane's 8 BF16 weights (wv) with its 8 elements of activation
// row m.
template <int MT>
__device__ __forceinline__ void bf16_lane_dot(uint4 wv, const float (&x)[MT][8],
                                              float (&out)[MT]) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float a = bf16_lo(words[q]), b = bf16_hi(words[q]);
#pragma unroll
    for (int m = 0; m < MT; ++m) out[m] = fmaf(b, x[m][2 * q + 1], fmaf(a, x[m][2 * q], out[m]));
  }
}

template <int MT>
__global__ void __launch_bounds__(kWarps * 32, 2) gemv_bf16_kernel(QuantGemvParams p) {
  using T = FormatTraits<QuantFormat::kBf16>;
  constexpr int E = T::kElemsPerLane;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t num_slices = p.k / T::kSlice;
  const int64_t row_tiles = (p.n + kRowsPerWarp - 1) / kRowsPerWarp;
  const int64_t wid = blockIdx.x * int64_t{kWarps} + warp;
  if (wid >= row_tiles * num_slices) return;
  const int64_t tile = wid / num_slices, s = wid % num_slices;
  int64_t g = 0, r_begin = 0, r_end = p.num_rows;
  if (p.group_offsets != nullptr) {
    g = p.active_groups[blockIdx.y];
    if (g < 0) return;
    r_begin = p.group_offsets[g];
    r_end = p.group_offsets[g + 1];
  }
  const int64_t row_bytes = p.k * T::kBits / 8;
  const uint8_t* wg = p.w + g * p.n * row_bytes;
  const int64_t k0 = s * T::kSlice + int64_t{lane} * E;
  const int64_t n0 = tile * kRowsPerWarp;
  const int rows_here = static_cast<int>(p.n - n0 < kRowsPerWarp ? p.n - n0 : kRowsPerWarp);

  // Issue every weight load of the tile first: they do not depend on the activations.
  uint4 wv[kRowsPerWarp];
  const uint8_t* wp = wg + n0 * row_bytes + k0 * T::kBits / 8;
#pragma unroll
  for (int u = 0; u < kRowsPerWarp; ++u) {
    const bool ok = u < rows_here;
    wv[u] = ok ? ld_stream(wp) : make_uint4(0, 0, 0, 0);
    wp += row_bytes;
  }
  for (int64_t r0 = r_begin; r0 < r_end; r0 += MT) {
    float x[MT][E];
    int64_t rid[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const bool valid = r0 + m < r_end;
      rid[m] = valid ? (p.sorted_rows ? p.sorted_rows[r0 + m] : r0 + m) : -1;
      const int64_t xr = valid ? rid[m] / p.x_row_div : 0;
      const uint4* src = reinterpret_cast<const uint4*>(p.x + xr * p.ldx + k0);
#pragma unroll
      for (int v = 0; v < E / 8; ++v) {
        const uint4 b = valid ? __ldg(src + v) : make_uint4(0, 0, 0, 0);
        x[m][8 * v + 0] = bf16_lo(b.x), x[m][8 * v + 1] = bf16_hi(b.x);
        x[m][8 * v + 2] = bf16_lo(b.y), x[m][8 * v + 3] = bf16_hi(b.y);
        x[m][8 * v + 4] = bf16_lo(b.z), x[m][8 * v + 5] = bf16_hi(b.z);
        x[m][8 * v + 6] = bf16_lo(b.w), x[m][8 * v + 7] = bf16_hi(b.w);
      }
    }
    float part[MT][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kRowsPerWarp; ++u) {
      float out[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) out[m] = 0.0f;
      bf16_lane_dot<MT>(wv[u], x, out);
#pragma unroll
      for (int m = 0; m < MT; ++m) part[m][u] = out[m];
    }
    // Transposing butterfly: round r (xor 16 >> r) halves the values a lane keeps; after
    // log2(R) rounds a lane holds the sum over R lanes of one row, whose index bits are the
    // lane bits 4, 3, ... used; the remaining lane bits are summed by plain xor shuffles.
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      int row = 0;
#pragma unroll
      for (int r = 0; r < kLog2RowsPerWarp; ++r) {
        const int bit = 16 >> r, w = kRowsPerWarp >> (r + 1);
        const bool upper = (lane & bit) != 0;
        row = 2 * row + (upper ? 1 : 0);
#pragma unroll
        for (int j = 0; j < w; ++j) {
          const float lo_v = part[m][j], hi_v = part[m][j + w];
          const float got = __shfl_xor_sync(0xffffffffu, upper ? lo_v : hi_v, bit);
          part[m][j] = (upper ? hi_v : lo_v) + got;
        }
      }
      float total = part[m][0];
#pragma unroll
      for (int bit = 16 >> kLog2RowsPerWarp; bit >= 1; bit >>= 1)
        total += __shfl_xor_sync(0xffffffffu, total, bit);
      constexpr int kLowMask = (32 >> kLog2RowsPerWarp) - 1;  // lanes that share a row
      if ((lane & kLowMask) == 0 && row < rows_here && rid[m] >= 0)
        p.partial[(s * p.num_rows + rid[m]) * p.n + n0 + row] = total;
    }
  }
}

}  // namespace

Status launch_bf16_splitk(const QuantGemvParams& p, int mt, cudaStream_t s) {
  constexpr int64_t kSlice = FormatTraits<QuantFormat::kBf16>::kSlice;
  // x over (row tiles x K-slices) in blocks of kWarps warps, y over group slots.
  const int64_t warps = (p.n + kRowsPerWarp - 1) / kRowsPerWarp * (p.k / kSlice);
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps),
                  static_cast<unsigned>(p.group_offsets ? p.num_slots : 1));
  const int m = mt <= 1 ? 1 : mt <= 2 ? 2 : 4;
  if (m == 1) {
    gemv_bf16_kernel<1><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 2) {
    gemv_bf16_kernel<2><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (m == 4) {
    gemv_bf16_kernel<4><<<grid, kWarps * 32, 0, s>>>(p);
  }
  M3_CUDA_RETURN_IF_LAUNCH_ERROR("gemv_bf16_kernel");
  return Status::ok();
}

}  // namespace m3::cuda::gemv

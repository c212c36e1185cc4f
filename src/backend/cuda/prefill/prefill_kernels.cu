// Element-wise kernels of the prefill GEMM path (see prefill_gemm.h): exact dequantisation to
// bf16, f32 -> bf16, bf16 row gather, SwiGLU-OAI to bf16, row inversion and the sorted combine.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/gemm/gemv_mma.cuh"
#include "backend/cuda/gemm/scale_codes.cuh"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "quant/mxfp8_mma_layout.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int per_thread = 1) {
  const int64_t work = (n + per_thread - 1) / per_thread;
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 65535 * 8));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 32 E4M3 codes (8 words, element 4w + j in byte j of word w) times one E8M0 scale -> 32 bf16
// at out (4×16-byte stores). e4m3·2^e is exact in bf16 unless it underflows.
__device__ __forceinline__ void mxfp8_block_to_bf16(const uint32_t (&words)[8], float s,
                                                    uint16_t* out) {
  uint32_t o[16];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    const uint32_t v = words[w];
    o[2 * w] = pack_bf16x2(e4m3_to_float(v & 0xFF) * s, e4m3_to_float((v >> 8) & 0xFF) * s);
    o[2 * w + 1] = pack_bf16x2(e4m3_to_float((v >> 16) & 0xFF) * s, e4m3_to_float(v >> 24) * s);
  }
  uint4* dst = reinterpret_cast<uint4*>(out);
#pragma unroll
  for (int q = 0; q < 4; ++q)
    dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
}

// One thread per 32-element MXFP8 block: 2×16-byte code loads, one scale, 4×16-byte stores.
__global__ void dequant_mxfp8_kernel(const uint8_t* __restrict__ codes,
                                     const uint8_t* __restrict__ scales, int64_t blocks,
                                     uint16_t* __restrict__ out) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < blocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    const uint4 c0 = reinterpret_cast<const uint4*>(codes)[2 * b];
    const uint4 c1 = reinterpret_cast<const uint4*>(codes)[2 * b + 1];
    const uint32_t words[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    mxfp8_block_to_bf16(words, e8m0_to_float(scales[b]), out + 32 * b);
  }
}

// The same from the mma layout (quant/mxfp8_mma_layout.h): block b (row, 32 columns) is four
// lanes' 8-byte halves of a (tile, stage) block. `matrix` is row 0 of the [N, K] matrix.
__global__ void dequant_mxfp8_packed_kernel(const uint8_t* __restrict__ matrix,
                                            const uint8_t* __restrict__ scales, int64_t row0,
                                            int64_t blocks, int64_t n, int64_t k, int tiling,
                                            uint16_t* __restrict__ out) {
  const int64_t bpr = k / 32;
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < blocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = row0 + b / bpr, col0 = (b % bpr) * 32;
    uint32_t words[8];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int64_t o = mxfp8_mma::offset(row, col0 + 8 * t, n, k,
                                          static_cast<mxfp8_mma::Tiling>(tiling));
      const uint2 v = *reinterpret_cast<const uint2*>(matrix + o);
      words[2 * t] = v.x;
      words[2 * t + 1] = v.y;
    }
    mxfp8_block_to_bf16(words, e8m0_to_float(scales[row * bpr + col0 / 32]), out + 32 * b);
  }
}

// One thread per 16-element NVFP4 block: one 8-byte load (element 2i in the low nibble), one
// scale, 2×16-byte stores. e2m1·e4m3 has at most 6 significant bits: exact in bf16.
__global__ void dequant_nvfp4_kernel(const uint8_t* __restrict__ packed,
                                     const uint8_t* __restrict__ scales, int64_t blocks,
                                     uint16_t* __restrict__ out) {
  for (int64_t b = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; b < blocks;
       b += int64_t{gridDim.x} * blockDim.x) {
    const uint2 c = reinterpret_cast<const uint2*>(packed)[b];
    const float s = e4m3_to_float(scales[b]);
    const uint32_t words[2] = {c.x, c.y};
    uint32_t o[8];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t byte = (words[w] >> (8 * j)) & 0xFF;
        o[4 * w + j] = pack_bf16x2(e2m1_to_float(byte & 0xF) * s, e2m1_to_float(byte >> 4) * s);
      }
    }
    uint4* dst = reinterpret_cast<uint4*>(out) + 2 * b;
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

// The same from the mma layout (quant/nvfp4_mma_layout.h), in storage order: one thread per lane
// of a (tile, chunk), whose 32 contiguous bytes hold tile rows g and g + 8 (lane = 4g + t) at the
// 32 columns 128c + 32t .. + 31. A warp reads one (tile, chunk), 1024 contiguous bytes, each byte
// once, and writes each of the tile's rows in the window as 256 contiguous bytes (4 lanes x 64).
// The values come from the words' f16 fragments (as the decode GEMV reads them), two per
// conversion. Decoding code by code instead (code_of and the E2M1 table per element), whether in
// this order or block by block through locate(), made the kernel 8.1x the checkpoint order's
// (234.5 against 28.8 us per expert matrix on an H200); with the fragments it is 1.6x (48.2
// against 29.4 us on an H100; docs/performance.md). Tiles [tau0, tau0 + tiles)
// (nvfp4_mma::tiles_of_rows) cover the rows [row0, row0 + rows); rows outside are skipped.
// `matrix` is row 0 of the [N, K] matrix.
__global__ void dequant_nvfp4_packed_kernel(const uint8_t* __restrict__ matrix,
                                            const uint8_t* __restrict__ scales, int64_t row0,
                                            int64_t rows, int64_t n, int64_t k, int tiling,
                                            int64_t tau0, int64_t tiles,
                                            uint16_t* __restrict__ out) {
  const int64_t chunks = k / nvfp4_mma::kChunkK, bpr = k / 16;
  const int64_t lanes = tiles * chunks * 32;
  const auto tl = static_cast<nvfp4_mma::Tiling>(tiling);
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < lanes;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int lane = static_cast<int>(idx & 31);
    const int64_t q = idx >> 5;  // (tile - tau0) * chunks + chunk
    const int64_t tau = tau0 + q / chunks, c = q % chunks;
    uint32_t words[8];  // k-steps 0..7, as the decode GEMV reads them
    gemv::nvfp4_lane_words(matrix + (tau * chunks + c) * nvfp4_mma::kChunkBytes, lane, words);
    const int g = lane >> 2, t = lane & 3;
    const int64_t col0 = c * nvfp4_mma::kChunkK + 32 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = nvfp4_mma::tile_row(tau, 8 * h + g, n, tl);
      if (row < row0 || row >= row0 + rows) continue;
      // Fragment h of a word is the f16x2 of columns 4i, 4i + 1 times 2^-14, fragment 2 + h that of
      // 4i + 2, 4i + 3 (the GEMV's operands): times the block scale · 2^14, exact (a code has at
      // most 2 significant bits, an E4M3 scale 4).
      const float s0 = e4m3_to_float(scales[row * bpr + col0 / 16]) * 16384.0f;
      const float s1 = e4m3_to_float(scales[row * bpr + col0 / 16 + 1]) * 16384.0f;
      uint32_t o[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t w = words[i];
        const float s = i < 4 ? s0 : s1;
        o[2 * i] = scale_to_bf16x2(nvfp4_mma::fragment(w, h), s);
        o[2 * i + 1] = scale_to_bf16x2(nvfp4_mma::fragment(w, 2 + h), s);
      }
      uint4* dst = reinterpret_cast<uint4*>(out + (row - row0) * k + col0);
#pragma unroll
      for (int m = 0; m < 4; ++m)
        dst[m] = make_uint4(o[4 * m], o[4 * m + 1], o[4 * m + 2], o[4 * m + 3]);
    }
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y,
                                   int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    y[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

// One block per output row; 16-byte copies (dim % 8 == 0) else 2-byte.
__global__ void gather_bf16_kernel(const uint16_t* __restrict__ x, const int32_t* __restrict__ rows,
                                   int64_t row_div, int64_t dim, uint16_t* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t src = rows[i] / row_div;
  if (dim % 8 == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(x + src * dim);
    uint4* d = reinterpret_cast<uint4*>(out + i * dim);
    for (int64_t j = threadIdx.x; j < dim / 8; j += blockDim.x) d[j] = s[j];
  } else {
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) out[i * dim + j] = x[src * dim + j];
  }
}

// Same float expression as the float32 op (moe/swiglu_oai.cu), then bf16 rounding.
__global__ void swiglu_oai_bf16_kernel(const float* __restrict__ h, int64_t rows, int64_t inter,
                                       float alpha, float limit, uint16_t* __restrict__ act) {
  const int64_t n = rows * inter;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx / inter, i = idx % inter;
    const float g = h[r * 2 * inter + i], u = h[r * 2 * inter + inter + i];
    const float gc = fminf(g, limit);
    const float uc = fminf(fmaxf(u, -limit), limit);
    const float sig = 1.0f / __fadd_rn(1.0f, expf(-__fmul_rn(gc, alpha)));
    const __nv_bfloat16 b = __float2bfloat16_rn(__fmul_rn(__fmul_rn(gc, sig), __fadd_rn(uc, 1.0f)));
    act[idx] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

__global__ void invert_rows_kernel(const int32_t* __restrict__ sorted_rows, int64_t n,
                                   int32_t* __restrict__ inv) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    inv[sorted_rows[i]] = static_cast<int32_t>(i);
}

// One block per token; every thread owns columns j, j + blockDim, ...
__global__ void moe_combine_sorted_kernel(const float* __restrict__ y,
                                          const int32_t* __restrict__ inv,
                                          const float* __restrict__ weights,
                                          const float* __restrict__ shared, int64_t top_k,
                                          int64_t hidden, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < top_k; ++s) {
      const int32_t r = inv[t * top_k + s];
      if (r < 0) continue;
      acc = __fadd_rn(acc, __fmul_rn(weights[t * top_k + s], y[int64_t{r} * hidden + j]));
    }
    if (shared != nullptr) acc = __fadd_rn(acc, shared[t * hidden + j]);
    out[t * hidden + j] = acc;
  }
}

}  // namespace

Status launch_dequant_bf16(const DequantBf16Params& p, CUstream_st* stream) {
  if (p.rows == 0) return Status::ok();
  const QuantWeight& w = p.w;
  if (w.format == QuantFormat::kMxfp8) {
    if (w.k % 32 != 0) return invalid_argument("[cuda.dequant_bf16] MXFP8 K % 32 != 0");
    const int64_t blocks = p.rows * w.k / 32;
    if (w.layout != WeightLayout::kRowMajor) {
      if (!mxfp8_mma::fits(w.n, w.k, static_cast<mxfp8_mma::Tiling>(w.layout)))
        return invalid_argument("[cuda.dequant_bf16] MXFP8 mma layout " +
                                std::to_string(static_cast<int>(w.layout)) + " does not fit N " +
                                std::to_string(w.n) + ", K " + std::to_string(w.k));
      dequant_mxfp8_packed_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(
          w.w, w.w_scale, p.row0, blocks, w.n, w.k, static_cast<int>(w.layout), p.out);
      M3_CUDA_RETURN_IF_LAUNCH_ERROR(dequant_mxfp8_packed_kernel);
      return Status::ok();
    }
    const uint8_t* codes = w.w + p.row0 * w.k;
    const uint8_t* scales = w.w_scale + p.row0 * (w.k / 32);
    dequant_mxfp8_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(codes, scales, blocks, p.out);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(dequant_mxfp8_kernel);
  } else if (w.format == QuantFormat::kNvfp4) {
    if (w.k % 16 != 0) return invalid_argument("[cuda.dequant_bf16] NVFP4 K % 16 != 0");
    const int64_t blocks = p.rows * w.k / 16;
    if (w.layout != WeightLayout::kRowMajor) {
      if (!nvfp4_mma::fits(w.n, w.k, static_cast<nvfp4_mma::Tiling>(w.layout)))
        return invalid_argument("[cuda.dequant_bf16] NVFP4 mma layout " +
                                std::to_string(static_cast<int>(w.layout)) + " does not fit N " +
                                std::to_string(w.n) + ", K " + std::to_string(w.k));
      const auto tiling = static_cast<nvfp4_mma::Tiling>(w.layout);
      const nvfp4_mma::TileRange tr = nvfp4_mma::tiles_of_rows(p.row0, p.rows, w.n, tiling);
      const int64_t tiles = tr.end - tr.first;
      dequant_nvfp4_packed_kernel<<<grid_for(tiles * (w.k / nvfp4_mma::kChunkK) * 32),
                                    kThreads, 0, stream>>>(w.w, w.w_scale, p.row0, p.rows, w.n,
                                                           w.k, static_cast<int>(w.layout),
                                                           tr.first, tiles, p.out);
      M3_CUDA_RETURN_IF_LAUNCH_ERROR(dequant_nvfp4_packed_kernel);
      return Status::ok();
    }
    const uint8_t* packed = w.w + p.row0 * (w.k / 2);
    const uint8_t* scales = w.w_scale + p.row0 * (w.k / 16);
    dequant_nvfp4_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(packed, scales, blocks, p.out);
    M3_CUDA_RETURN_IF_LAUNCH_ERROR(dequant_nvfp4_kernel);
  } else {
    M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(p.out, w.w + p.row0 * w.k * 2, p.rows * w.k * 2,
                                            cudaMemcpyDeviceToDevice, stream));
  }
  return Status::ok();
}

Status launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, CUstream_st* stream) {
  if (n == 0) return Status::ok();
  f32_to_bf16_kernel<<<grid_for(n, 4), kThreads, 0, stream>>>(x, y, n);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(f32_to_bf16_kernel);
  return Status::ok();
}

Status launch_gather_bf16(const uint16_t* x, const int32_t* rows, int64_t row_div,
                          int64_t num_rows, int64_t dim, uint16_t* out, CUstream_st* stream) {
  if (num_rows == 0) return Status::ok();
  if (num_rows > INT32_MAX) return invalid_argument("[cuda.gather_bf16] too many rows");
  gather_bf16_kernel<<<static_cast<unsigned>(num_rows), 128, 0, stream>>>(x, rows, row_div, dim,
                                                                          out);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(gather_bf16_kernel);
  return Status::ok();
}

Status launch_swiglu_oai_bf16(const float* h, int64_t rows, int64_t inter, float alpha,
                              float limit, uint16_t* act, CUstream_st* stream) {
  if (rows * inter == 0) return Status::ok();
  swiglu_oai_bf16_kernel<<<grid_for(rows * inter, 4), kThreads, 0, stream>>>(h, rows, inter, alpha,
                                                                            limit, act);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(swiglu_oai_bf16_kernel);
  return Status::ok();
}

Status launch_invert_rows(const int32_t* sorted_rows, int64_t num_rows, int32_t* inv,
                          CUstream_st* stream) {
  if (num_rows == 0) return Status::ok();
  invert_rows_kernel<<<grid_for(num_rows), kThreads, 0, stream>>>(sorted_rows, num_rows, inv);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(invert_rows_kernel);
  return Status::ok();
}

Status launch_moe_combine_sorted(const float* y, const int32_t* inv, const float* weights,
                                 const float* shared, int64_t t, int64_t top_k, int64_t hidden,
                                 float* out, CUstream_st* stream) {
  if (t == 0) return Status::ok();
  if (t > INT32_MAX) return invalid_argument("[cuda.moe_combine_sorted] too many tokens");
  moe_combine_sorted_kernel<<<static_cast<unsigned>(t), 256, 0, stream>>>(y, inv, weights, shared,
                                                                          top_k, hidden, out);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(moe_combine_sorted_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

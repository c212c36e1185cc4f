// Two questions before an FP8 tensor-core path for the batch-1 NVFP4 experts is built
// (the answers: docs/design/decode-kernels.md, "Measured facts the design rests on"):
//
// 1. Precision. How exactly does Hopper's mma.sync m16n8k32 e4m3 x e4m3 -> f32 sum its 32 exact
//    products (DeepSeek-V3 reports ~14 bits kept by Hopper's FP8 GEMM accumulation)? Random
//    A (E2M1 codes placed into E4M3: the value x 2^6) and B (random finite E4M3) tiles, a zero
//    and a large C; each D element against the exact sum in double. Printed: the worst
//    |D - exact| / Σ|a·b| (the unit the CPU bound of quant_gemv_mma_test scales), and the worst
//    |D - exact| in units of the largest product, over many tiles.
//
// 2. Issue cost. The consumer loop of one warp on weights already in shared memory (no HBM, no
//    L2: what the SM can issue), per 256 NVFP4 weights (one 16 x 16 block, 144 bytes with its
//    scales):
//      f16:  the tensor-core GEMV's packed step (gemv_mma.cuh): a word -> four f16x2 fragments by
//            bit placement, four HMUL2 by the block scale, one mma.m16n8k16 f16 (the scales
//            arrive as f16x2 words: kMmaRing converts them from E4M3 once per 8 k-steps);
//      fp8:  two words -> four E4M3 registers by bit placement, one mma.m16n8k32 e4m3 (two
//            blocks: activation terms of block 0 in columns 0-3, block 1 in 4-7), four FFMA by
//            the lane's block scale (E4M3 -> f32 per step).
//    At 4-32 warps per SM; printed: ns per 256 weights per SM and the weight bytes per second
//    the whole GPU could consume at that rate (132 SMs): the ceiling the dequantisation puts on
//    a batch-1 expert GEMV.
//
// Usage: fp8_mma_probe   (no arguments; ~2 s)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/gemm/gemv_mma.cuh"
#include "core/dtype.h"
#include "cuda_bench_util.h"
#include "quant/nvfp4_mma_layout.h"

namespace {

// An E2M1 code (s e e m) placed into an E4M3 byte: s -> bit 7, e e m -> bits 4..2 (value x 2^6).
uint8_t e2m1_as_e4m3(uint8_t c) { return static_cast<uint8_t>(((c & 8) << 4) | ((c & 7) << 2)); }

__device__ __forceinline__ void mma_e4m3_k32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
using m3::cuda::gemv::hmul2;
using m3::cuda::gemv::mma_f16;

// ---- 1. Precision: tiles[t] = A (16 x 32 bytes, row-major) and B (8 x 32 bytes, column n's 32
// k values contiguous); C = c_value everywhere; D out [tiles][16][8].
__global__ void precision_kernel(const uint8_t* a, const uint8_t* b, float c_value, float* d) {
  const int tile = blockIdx.x, lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const uint8_t* at = a + tile * 16 * 32;
  const uint8_t* bt = b + tile * 8 * 32;
  uint32_t af[4];
  // m16n8k32 8-bit A: a0 (row g, k 4t..4t+3), a1 (row g+8, same), a2 (row g, k 16+4t..),
  // a3 (row g+8, k 16+4t..); B: b0 (k 4t.., column g), b1 (k 16+4t.., column g).
  af[0] = *reinterpret_cast<const uint32_t*>(at + g * 32 + 4 * t);
  af[1] = *reinterpret_cast<const uint32_t*>(at + (g + 8) * 32 + 4 * t);
  af[2] = *reinterpret_cast<const uint32_t*>(at + g * 32 + 16 + 4 * t);
  af[3] = *reinterpret_cast<const uint32_t*>(at + (g + 8) * 32 + 16 + 4 * t);
  const uint32_t b0 = *reinterpret_cast<const uint32_t*>(bt + g * 32 + 4 * t);
  const uint32_t b1 = *reinterpret_cast<const uint32_t*>(bt + g * 32 + 16 + 4 * t);
  float acc[4] = {c_value, c_value, c_value, c_value};
  mma_e4m3_k32(acc, af, b0, b1);
  // D: (row g, columns 2t, 2t+1), (row g+8, columns 2t, 2t+1).
  float* dt = d + tile * 128;
  dt[g * 8 + 2 * t] = acc[0];
  dt[g * 8 + 2 * t + 1] = acc[1];
  dt[(g + 8) * 8 + 2 * t] = acc[2];
  dt[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

void precision_probe() {
  constexpr int kTiles = 4096;
  std::mt19937 rng(7);
  std::vector<uint8_t> a(kTiles * 16 * 32), b(kTiles * 8 * 32);
  for (auto& v : a) v = e2m1_as_e4m3(static_cast<uint8_t>(rng() & 15));
  for (auto& v : b) {  // random finite E4M3 bytes (no NaN: exponent and mantissa not all ones)
    do v = static_cast<uint8_t>(rng() & 0xFF);
    while ((v & 0x7F) == 0x7F);
  }
  uint8_t *da, *db;
  float* dd;
  CHECK_CUDA(cudaMalloc(&da, a.size()));
  CHECK_CUDA(cudaMalloc(&db, b.size()));
  CHECK_CUDA(cudaMalloc(&dd, kTiles * 128 * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(da, a.data(), a.size(), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db, b.data(), b.size(), cudaMemcpyHostToDevice));
  for (float c_value : {0.0f, 1024.0f}) {
    precision_kernel<<<kTiles, 32>>>(da, db, c_value, dd);
    CHECK_CUDA(cudaGetLastError());
    std::vector<float> d(kTiles * 128);
    CHECK_CUDA(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst_mag = 0, worst_max = 0, worst_f32 = 0;
    for (int tile = 0; tile < kTiles; ++tile)
      for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
          double exact = 0, mag = 0, pmax = 0;
          float f32 = 0.0f;  // sequential float32 sum, for scale
          for (int k = 0; k < 32; ++k) {
            const double p = m3::e4m3_to_f32(a[tile * 512 + r * 32 + k]) * m3::e4m3_to_f32(b[tile * 256 + n * 32 + k]);
            exact += p;
            mag += std::abs(p);
            pmax = std::max(pmax, std::abs(p));
            f32 += static_cast<float>(p);
          }
          const double got = static_cast<double>(d[tile * 128 + r * 8 + n]) - c_value;
          const double err = std::abs(got - exact);
          if (mag > 0) worst_mag = std::max(worst_mag, err / mag);
          if (pmax > 0) worst_max = std::max(worst_max, err / pmax);
          if (mag > 0) worst_f32 = std::max(worst_f32, std::abs(double(f32) - exact) / mag);
        }
    std::printf("precision m16n8k32 e4m3, C = %-6g: worst |D - exact| / sum|ab| = %.3g (2^%.1f), "
                "/ max|ab| = %.3g; a float32 sequential sum: %.3g (2^%.1f)\n",
                c_value, worst_mag, std::log2(worst_mag + 1e-300), worst_max, worst_f32,
                std::log2(worst_f32 + 1e-300));
  }
  CHECK_CUDA(cudaFree(da));
  CHECK_CUDA(cudaFree(db));
  CHECK_CUDA(cudaFree(dd));
}

// ---- 2. Issue cost. Each warp owns 4 KB of shared memory (words, scale bytes, activations) and
// runs `steps` iterations of 2 blocks (512 weights) over it; results are stored so nothing is
// dead. The data are arbitrary bytes (timing only).
constexpr int kWarpBytes = 4096;

template <bool kFp8>
__global__ void issue_kernel(int steps, float* out, long long* cycles) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint8_t* ws = smem + warp * kWarpBytes;
  for (int i = lane; i < kWarpBytes / 4; i += 32)
    reinterpret_cast<uint32_t*>(ws)[i] = 0x3C3C3C3Cu * (i + 1) ^ (blockIdx.x * 977u);
  __syncwarp();
  float acc[4] = {0, 0, 0, 0}, acc2[4] = {0, 0, 0, 0};
  const long long t0 = clock64();
  for (int s = 0; s < steps; ++s) {
    const int off = (s * 64) & (kWarpBytes / 2 - 1);  // cycles through the first 2 KB
    const uint2 w = *reinterpret_cast<const uint2*>(ws + off + lane * 8 % 256);
    const uint32_t sc = *reinterpret_cast<const uint32_t*>(ws + 2048 + ((off / 8 + lane) & 255) * 4);
    const uint2 x = *reinterpret_cast<const uint2*>(ws + 3072 + ((off + lane * 8) & 1023));
    if constexpr (kFp8) {
      // Two blocks: words w.x (block 0) and w.y (block 1); each: row g in the low nibbles, row
      // g + 8 in the high nibbles. E4M3 = s -> 7, e e m -> 4..2.
      uint32_t a[4];
      a[0] = ((w.x << 2) & 0x1C1C1C1Cu) | ((w.x << 4) & 0x80808080u);
      a[1] = ((w.x >> 2) & 0x1C1C1C1Cu) | (w.x & 0x80808080u);
      a[2] = ((w.y << 2) & 0x1C1C1C1Cu) | ((w.y << 4) & 0x80808080u);
      a[3] = ((w.y >> 2) & 0x1C1C1C1Cu) | (w.y & 0x80808080u);
      float d[4] = {0, 0, 0, 0};
      mma_e4m3_k32(d, a, x.x, x.y);
      // The lane's block scales (rows g, g + 8 of its block) E4M3 -> f16x2 -> f32.
      uint32_t h;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(static_cast<uint16_t>(sc)));
      const float s_lo = __half2float(__ushort_as_half(static_cast<uint16_t>(h)));
      const float s_hi = __half2float(__ushort_as_half(static_cast<uint16_t>(h >> 16)));
      acc[0] = fmaf(d[0], s_lo, acc[0]);
      acc[1] = fmaf(d[1], s_lo, acc[1]);
      acc[2] = fmaf(d[2], s_hi, acc[2]);
      acc[3] = fmaf(d[3], s_hi, acc[3]);
    } else {
      // Two k-steps of kMmaRing's packed path: per word four fragments, four HMUL2, one mma.
      const uint32_t words[2] = {w.x, w.y};
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t sl = (sc & 0x3FFF3FFFu) | 0x38003800u, sh = sl ^ 0x04000400u;
        const uint32_t a0 = hmul2(m3::nvfp4_mma::fragment(words[i], 0), sl),
                       a1 = hmul2(m3::nvfp4_mma::fragment(words[i], 1), sh),
                       a2 = hmul2(m3::nvfp4_mma::fragment(words[i], 2), sl),
                       a3 = hmul2(m3::nvfp4_mma::fragment(words[i], 3), sh);
        mma_f16(i ? acc2 : acc, a0, a1, a2, a3, x.x, x.y);
      }
    }
  }
  const long long t1 = clock64();
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3] + acc2[0] + acc2[1];
  if (lane == 0) cycles[blockIdx.x * (blockDim.x / 32) + warp] = t1 - t0;
}

void issue_probe() {
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int steps = 4096;
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    auto* kernel = fp8 ? issue_kernel<true> : issue_kernel<false>;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (int warps : {4, 8, 16, 32}) {
      // One CTA per SM of `warps` warps (at most 1024 threads).
      float* out;
      long long* cyc;
      CHECK_CUDA(cudaMalloc(&out, sms * warps * 32 * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&cyc, sms * warps * sizeof(long long)));
      const size_t smem = static_cast<size_t>(warps) * kWarpBytes;
      kernel<<<sms, warps * 32, smem>>>(steps / 8, out, cyc);  // warm-up
      cudaEvent_t e0, e1;
      CHECK_CUDA(cudaEventCreate(&e0));
      CHECK_CUDA(cudaEventCreate(&e1));
      CHECK_CUDA(cudaEventRecord(e0));
      kernel<<<sms, warps * 32, smem>>>(steps, out, cyc);
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      CHECK_CUDA(cudaGetLastError());
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      std::vector<long long> c(sms * warps);
      CHECK_CUDA(cudaMemcpy(c.data(), cyc, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
      double mean = 0;
      for (long long v : c) mean += double(v);
      mean /= double(c.size());
      // Per SM: warps x steps x 2 blocks of 256 weights, in the loop's mean cycles and in the
      // kernel's time (events: includes the launch and the shared-memory fill, small here).
      const double cyc_per_256 = mean / (double(warps) * steps * 2);
      const double ns_per_256 = ms * 1e6 / (double(warps) * steps * 2);
      const double bytes_per_s = 144.0 * sms / (ns_per_256 * 1e-9);
      std::printf("issue %s, %2d warps/SM: %.2f cycles per 256 weights per SM (loop), %.3f ns "
                  "(kernel time): whole GPU %.2f TB/s of NVFP4 weights\n",
                  fp8 ? "fp8 k32" : "f16 k16", warps, cyc_per_256, ns_per_256, bytes_per_s * 1e-12);
      CHECK_CUDA(cudaFree(out));
      CHECK_CUDA(cudaFree(cyc));
      CHECK_CUDA(cudaEventDestroy(e0));
      CHECK_CUDA(cudaEventDestroy(e1));
    }
  }
}

}  // namespace

int main() {
  precision_probe();
  issue_probe();
  return 0;
}

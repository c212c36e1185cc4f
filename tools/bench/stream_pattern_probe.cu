// Does the order in which a batch-1 expert GEMV's warps walk their weights limit its HBM rate?
// (The answer: docs/design/decode-kernels.md, "Measured facts the design rests on".)
//
// The tensor-core ring GEMV (gemm/gemv_mma.cuh, kMmaRing) at one token runs one wave of 1536 CTAs x 2 warps over the
// four routed experts' gate|up; each warp streams its own contiguous ~24 KB (half of one tile in
// the mma layout) in 2-KB stages through a 2-slot cp.async ring (one stage in flight while one is
// computed). It reaches ~2 TB/s, a plain grid-stride read of the same bytes ~3.5+, and neither
// fewer instructions per stage nor more stages in flight moved it. This probe
// keeps only the access pattern: the same number of warps, stages and stage size, cp.async into
// the same ring, a fixed spin per stage standing in for the compute, no arithmetic. It varies:
//   layout 0  each warp's stages contiguous (the mma layout: warp w reads [w·S, (w+1)·S) stages),
//   layout 1  the stages interleaved over the warps (stage s of warp w at s·warps + w: at any
//             moment the GPU's requests cover one contiguous region),
//   ring      2, 3 slots (1, 2 stages in flight while one is consumed),
//   spin      0, 1000, 2000 cycles per stage (the compute stand-in; the real stage is ~205
//             instructions per warp, 6 warps per scheduler),
//   warps     2 or 4 per CTA (1536 CTAs and the same bytes: 4 warps read half as many stages
//             each, two waves' worth of warps),
// and prints each configuration's time and rate beside the plain read (read_probe.cu).
//
// `stream_pattern_probe reg` instead asks the same of kMmaDirect's pattern
// (gemm/gemv_mma_direct.cu: o_proj at one row, 384 CTAs x W warps, each warp's contiguous share
// of its tile's 64 stages of 2 KB loaded straight into registers, NS stages in flight, a spin per
// stage for the compute): whether register-fed loads reach the rate of a plain read and of
// cp.async into shared memory with the same bytes in flight.
//
// Usage: stream_pattern_probe [reg]   (a few seconds)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "backend/cuda/gemm/gemv_common.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "cuda_bench_util.h"
#include "read_probe.h"

namespace {

using namespace m3;
using namespace m3::cuda;
using namespace m3::cuda_bench;

constexpr int kStageBytes = 2048;

template <int R>
__global__ void pattern_kernel(const uint8_t* __restrict__ base, int stages, int layout, int spin,
                               uint32_t* sink) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int64_t gw = int64_t{blockIdx.x} * nw + warp, total = int64_t{gridDim.x} * nw;
  uint8_t* ring = smem + warp * R * kStageBytes;
  const uint32_t ring_s = smem_u32(ring);
  auto src = [&](int s) {
    return base + (layout == 0 ? gw * stages + s : int64_t{s} * total + gw) * kStageBytes;
  };
  auto issue = [&](int s, int slot) {
    const uint8_t* p = src(s);
#pragma unroll
    for (int h = 0; h < kStageBytes / 512; ++h)
      cp_async16(ring_s + slot * kStageBytes + 16 * (lane + 32 * h), p + 16 * (lane + 32 * h), 16);
  };
#pragma unroll
  for (int i = 0; i < R - 1; ++i) {
    if (i < stages) issue(i, i);
    cp_async_commit();
  }
  uint32_t acc = 0;
  for (int i = 0; i < stages; ++i) {
    const int next = i + R - 1;
    if (next < stages) issue(next, next % R);
    cp_async_commit();
    cp_async_wait<R - 1>();
    __syncwarp();
    acc ^= reinterpret_cast<const uint32_t*>(ring + (i % R) * kStageBytes)[lane];
    if (spin > 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < spin) {
      }
    }
    __syncwarp();
  }
  if (acc == 0x12345678u) sink[gw] = acc;  // keeps the reads
}

// The plain read of `bytes` (copies rotating) at 4 and 8 CTAs per SM: the reference rows.
void plain_reads(uint8_t* buf, int64_t bytes, int64_t copies, uint32_t* sink, int sms) {
  for (int per_sm : {4, 8}) {
    const double ms = median_ms(
        [&](int i) { CHECK_OK(launch_read_probe(buf + (i % copies) * bytes, bytes, per_sm * sms, sink, st())); },
        5, 15, 4);
    std::printf("plain read, %d CTAs/SM %40s %9.1f %9.2f\n", per_sm, "", ms * 1e3, bytes / ms / 1e9);
  }
}

// kMmaDirect's weight stream without its arithmetic: tile = CTA, warp w takes stages [S·w/W,
// S·(w+1)/W) of the tile's S contiguous 2-KB stages, lane l 16 bytes at u·512 + 16·l of each; NS
// stages in registers, stage i + NS requested once stage i is consumed (slots unrolled, so the
// registers stay registers).
template <int NS>
__global__ void __launch_bounds__(256) register_pattern_kernel(const uint8_t* __restrict__ base,
                                                               int stages, int spin,
                                                               uint32_t* sink) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int st_begin = stages * warp / nw, st_end = stages * (warp + 1) / nw;
  const int nst = st_end - st_begin;
  const uint8_t* w = base + int64_t{blockIdx.x} * stages * kStageBytes + 16 * lane;
  uint4 r[NS][4];
  auto load = [&](int st, int slot) {
#pragma unroll
    for (int u = 0; u < 4; ++u) r[slot][u] = gemv::ld_stream(w + int64_t{st} * kStageBytes + u * 512);
  };
#pragma unroll
  for (int j = 0; j < NS; ++j)
    if (j < nst) load(st_begin + j, j);
  uint32_t acc = 0;
  for (int i0 = 0; i0 < nst; i0 += NS) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int i = i0 + j;
      if (i < nst) {
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= r[j][u].x ^ r[j][u].y ^ r[j][u].z ^ r[j][u].w;
        if (spin > 0) {
          const long long t0 = clock64();
          while (clock64() - t0 < spin) {
          }
        }
        if (i + NS < nst) load(st_begin + i + NS, j);
      }
    }
  }
  if (acc == 0x12345678u) sink[blockIdx.x * nw + warp] = acc;  // keeps the reads
}

void register_patterns(uint8_t* buf, int64_t pool, uint32_t* sink, int sms) {
  const int tiles = 384, stages = 64;  // o_proj [6144 x 8192] in the mma layout
  const int64_t bytes = int64_t{tiles} * stages * kStageBytes;  // 50.3 MB
  const int64_t copies = pool / bytes;
  std::printf("%-52s %9s %9s\n", "kMmaDirect's pattern (50.3 MB, 2-KB stages)", "us", "TB/s");
  plain_reads(buf, bytes, copies, sink, sms);
  for (int warps : {4, 6, 8})
    for (int ns : {1, 2, 3, 4})
      for (int spin : {0, 400}) {
        const double ms = median_ms(
            [&](int i) {
              const uint8_t* b = buf + (i % copies) * bytes;
              const dim3 grid(tiles), block(32 * warps);
              if (ns == 1) register_pattern_kernel<1><<<grid, block, 0, g_stream>>>(b, stages, spin, sink);
              if (ns == 2) register_pattern_kernel<2><<<grid, block, 0, g_stream>>>(b, stages, spin, sink);
              if (ns == 3) register_pattern_kernel<3><<<grid, block, 0, g_stream>>>(b, stages, spin, sink);
              if (ns == 4) register_pattern_kernel<4><<<grid, block, 0, g_stream>>>(b, stages, spin, sink);
            },
            5, 15, 4);
        std::printf("registers: warps %d, %d stages in flight, spin %4d %15s %9.1f %9.2f\n", warps,
                    ns, spin, "", ms * 1e3, bytes / ms / 1e9);
      }
}

}  // namespace

int main(int argc, char** argv) {
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t pool = int64_t{1} << 30;
  uint8_t* buf = dalloc<uint8_t>(pool);
  CHECK_CUDA(cudaMemsetAsync(buf, 0x5A, pool, g_stream));
  uint32_t* sink = dalloc<uint32_t>(1 << 20);
  if (argc > 1 && std::strcmp(argv[1], "reg") == 0) {
    register_patterns(buf, pool, sink, sms);
    return 0;
  }
  const int total_warps = 3072, total_stages = 12;  // kMmaRing at one token: 1536 CTAs x 2 x 12
  const int64_t bytes = int64_t{total_warps} * total_stages * kStageBytes;  // 75.5 MB
  const int64_t copies = pool / bytes;
  std::printf("%-52s %9s %9s\n", "pattern (75.5 MB, 2-KB stages, one wave)", "us", "TB/s");
  plain_reads(buf, bytes, copies, sink, sms);
  for (int warps : {2, 4})
    for (int layout : {0, 1})
      for (int ring : {2, 3})
        for (int spin : {0, 1000, 2000}) {
          const int ctas = total_warps / 2, stages = total_stages * 2 / warps;
          const int smem = warps * ring * kStageBytes;
          const double ms = median_ms(
              [&](int i) {
                const uint8_t* b = buf + (i % copies) * bytes;
                if (ring == 2)
                  pattern_kernel<2><<<ctas, 32 * warps, smem, g_stream>>>(b, stages, layout, spin, sink);
                else
                  pattern_kernel<3><<<ctas, 32 * warps, smem, g_stream>>>(b, stages, layout, spin, sink);
              },
              5, 15, 4);
          std::printf("warps %d layout %d (%s) ring %d spin %4d %12s %9.1f %9.2f\n", warps, layout,
                      layout == 0 ? "per warp" : "interleaved", ring, spin, "", ms * 1e3,
                      bytes / ms / 1e9);
        }
  return 0;
}

// kDequantSplitK: the MXFP8 / NVFP4 GEMV on the CUDA cores for 1..8 (per group) activation rows,
// designed for HBM bandwidth on the H200 (the first CUDA-core GEMV was latency-bound: 96
// registers, 25 % occupancy, the scale load issued after the weight load was consumed).
//
// Work split: a CTA (8 warps) owns one K-slice of kC chunks (a chunk = one 16-byte load per lane
// per weight row: 512 MXFP8 / 1024 NVFP4 elements) and a tile of 8·RW·iters weight rows of one
// group. Each warp takes RW rows at a time and issues all RW·kC weight loads and their scale loads
// before using any (6-8 independent 16-byte loads per lane in flight), so one memory latency
// covers the whole row-slice; `__launch_bounds__(256, 4)` caps registers at 64 so 32 warps per SM
// keep ~128 KB in flight.
//
// Activations live in shared memory as float32 (converted once per CTA), for up to P rows
// (host-chosen, <= 8), in a lane-major layout xs[row][chunk][float4 j][lane] so that a warp's
// float4 reads hit 32 distinct 16-byte bank groups (no conflicts). The weights of a row-slice stay
// in registers while the P activation rows are processed MT at a time, so for up to P rows per
// group every weight byte is read from HBM once per launch. Per weight row, lane sums over the kC
// chunks are reduced once over the warp.
//
// Split-K: the partial sums of the ceil(K / (kC·chunk)) slices go to partial[s, r, n] and the
// deterministic epilogue sums them (see quant_gemv.h); the slice count is
// quant_gemv_num_slices(format, k), the launch shape plan_dequant_splitk's (gemv_plan.h).
// Requirements: K % 32 == 0, 16-byte aligned rows (K is
// otherwise free: lanes past K load nothing).
#pragma once

#include "backend/cuda/gemm/gemv_common.cuh"
#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda::gemv {

constexpr int kSplitKThreads = 256;

// One chunk (one 16-byte word set per weight row) of RW weight rows times MT activation rows
// from shared memory, block scales applied, accumulated into acc[m][u]. Loop order: word q outer,
// so only the MT float4s of activations of one word are live (each is reused by the RW rows).
// MXFP8: 16 E4M3 codes, one E8M0 scale. NVFP4: 32 E2M1 codes in two 16-element blocks, two E4M3
// scales in scale_raw; g includes the 2^14 of the f16 trick and the global multiplier.
template <QuantFormat F, int MT, int RW>
__device__ __forceinline__ void dequant_splitk_chunk(const uint4 (&wv)[RW], const uint32_t (&sc)[RW], float g,
                                         const float4* xs, int x0, int m_stride,
                                         float (&acc)[MT][RW]) {
  float a[MT][RW];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if (q == 0 || (F == QuantFormat::kNvfp4 && q == 2)) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int u = 0; u < RW; ++u) a[m][u] = 0.0f;
    }
    if constexpr (F == QuantFormat::kMxfp8) {
      float4 xv[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) xv[m] = xs[x0 + m * m_stride + q * 32];
#pragma unroll
      for (int u = 0; u < RW; ++u) {
        const uint32_t w = q == 0 ? wv[u].x : q == 1 ? wv[u].y : q == 2 ? wv[u].z : wv[u].w;
        const float2 lo = e4m3x2_to_float2(static_cast<uint16_t>(w & 0xFFFFu));
        const float2 hi = e4m3x2_to_float2(static_cast<uint16_t>(w >> 16));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          a[m][u] = fmaf(lo.x, xv[m].x, a[m][u]);
          a[m][u] = fmaf(lo.y, xv[m].y, a[m][u]);
          a[m][u] = fmaf(hi.x, xv[m].z, a[m][u]);
          a[m][u] = fmaf(hi.y, xv[m].w, a[m][u]);
        }
      }
    } else {
      float4 xa[MT], xb[MT];  // elements 8q .. 8q+3 and 8q+4 .. 8q+7
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        xa[m] = xs[x0 + m * m_stride + (2 * q) * 32];
        xb[m] = xs[x0 + m * m_stride + (2 * q + 1) * 32];
      }
#pragma unroll
      for (int u = 0; u < RW; ++u) {
        const uint32_t w = q == 0 ? wv[u].x : q == 1 ? wv[u].y : q == 2 ? wv[u].z : wv[u].w;
        const float2 p0 = e2m1_pair<0>(w), p1 = e2m1_pair<1>(w), p2 = e2m1_pair<2>(w),
                     p3 = e2m1_pair<3>(w);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          a[m][u] = fmaf(p0.x, xa[m].x, a[m][u]);
          a[m][u] = fmaf(p0.y, xb[m].x, a[m][u]);
          a[m][u] = fmaf(p1.x, xa[m].y, a[m][u]);
          a[m][u] = fmaf(p1.y, xb[m].y, a[m][u]);
          a[m][u] = fmaf(p2.x, xa[m].z, a[m][u]);
          a[m][u] = fmaf(p2.y, xb[m].z, a[m][u]);
          a[m][u] = fmaf(p3.x, xa[m].w, a[m][u]);
          a[m][u] = fmaf(p3.y, xb[m].w, a[m][u]);
        }
      }
    }
    const bool block_end = F == QuantFormat::kMxfp8 ? q == 3 : (q == 1 || q == 3);
    if (block_end) {
#pragma unroll
      for (int u = 0; u < RW; ++u) {
        float f;
        if constexpr (F == QuantFormat::kMxfp8) {
          f = e8m0_to_f32(static_cast<uint8_t>(sc[u]));
        } else {
          const float2 s2 = e4m3x2_to_float2(static_cast<uint16_t>(sc[u]));
          f = (q == 1 ? s2.x : s2.y) * g;
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[m][u] = fmaf(a[m][u], f, acc[m][u]);
      }
    }
  }
}

// F: MXFP8 or NVFP4. MT: activation rows per register pass; RW: weight rows per warp step; KC:
// chunks per K-slice. p_rows: activation rows held in shared memory (a multiple of MT); iters:
// warp steps per CTA.
template <QuantFormat F, int MT, int RW, int KC>
__global__ void __launch_bounds__(kSplitKThreads, 4)
    gemv_dequant_splitk_kernel(QuantGemvParams p, int p_rows, int iters) {
  using T = FormatTraits<F>;
  constexpr int E = T::kElemsPerLane;
  constexpr int kChunk = 32 * E;
  constexpr int kSliceK = KC * kChunk;
  constexpr int kF4 = E / 4;  // float4s of activations per lane per chunk
  extern __shared__ float4 xs[];  // [p_rows][KC][kF4][32]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_slices = static_cast<int>((p.k + kSliceK - 1) / kSliceK);
  const int s = static_cast<int>(blockIdx.x % num_slices);
  const int tile = static_cast<int>(blockIdx.x / num_slices);
  pdl_launch_dependents();  // the epilogue may be scheduled (it waits for this grid)
  int64_t g = 0;
  int r_begin = 0, r_end = static_cast<int>(p.num_rows);
  if (p.group_offsets != nullptr) {
    pdl_wait();  // the groups come from the previous kernel
    g = p.active_groups[blockIdx.y];
    if (g < 0) return;  // whole block
    r_begin = p.group_offsets[g];
    r_end = p.group_offsets[g + 1];
  }
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int64_t row_bytes = int64_t{k} * T::kBits / 8;
  const int64_t scale_cols = k / T::kScaleBlock;
  const int kbase = s * kSliceK;
  const int k0 = kbase + lane * E;  // this lane's first element; chunk c adds c·kChunk
  // Lane base pointers (the group's matrix, this lane's K offset).
  const uint8_t* wl = p.w + g * int64_t{n} * row_bytes + int64_t{k0} * T::kBits / 8;
  const uint8_t* sl = p.w_scale + g * int64_t{n} * scale_cols + k0 / T::kScaleBlock;
  float gf = 1.0f;
  if constexpr (F == QuantFormat::kNvfp4) gf = (p.w_global ? p.w_global[g] : 1.0f) * 16384.0f;
  // Chunks of this lane inside K (all lanes of a warp agree except at a K tail).
  const int nvalid = k0 + E <= k ? min(KC, (k - k0 - E) / kChunk + 1) : 0;
  const int n_cta = tile * (8 * RW * iters);

  uint4 wv[RW][KC];
  uint32_t sc[RW][KC];
  // Every weight and scale load of a warp step's RW rows x KC chunks, issued together.
  auto load_step = [&](int n0) {
#pragma unroll
    for (int u = 0; u < RW; ++u) {
      const bool row_ok = n0 + u < n;
      const uint8_t* wr = wl + int64_t{n0 + u} * row_bytes;
      const uint8_t* sr = sl + int64_t{n0 + u} * scale_cols;
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        const bool ok = row_ok && c < nvalid;
        wv[u][c] = ok ? ld_stream(wr + c * (kChunk * T::kBits / 8)) : make_uint4(0, 0, 0, 0);
        if constexpr (F == QuantFormat::kMxfp8) {
          sc[u][c] = ok ? __ldg(sr + c * (kChunk / 32)) : 0u;
        } else {
          sc[u][c] = ok ? __ldg(reinterpret_cast<const uint16_t*>(sr + c * (kChunk / 16))) : 0u;
        }
      }
    }
  };
  // The first step's weights are requested before the activation fill, so the fill's latency
  // (and its barrier) overlaps them instead of leaving HBM idle at the start of every CTA.
  // Only where it stays spill-free under 64 registers (ptxas -v): MXFP8 with one row per pass,
  // the batch-1 dense linears.
  constexpr bool kPrefetch = F == QuantFormat::kMxfp8 && MT == 1;
  bool loaded = false;
  if (kPrefetch && r_begin < r_end && n_cta + warp * RW < n) {
    load_step(n_cta + warp * RW);
    loaded = true;
  }
  // Under programmatic dependent launch the weight requests above run under the previous
  // kernel's tail; activations, groups and the partial buffer are touched only after this. (An
  // L2 prefetch of the first step for the other instantiations made MT = 2, 4 spill: left out.)
  pdl_wait();

  for (int r0 = r_begin; r0 < r_end; r0 += p_rows) {
    const int rows_here = min(r_end - r0, p_rows);
    const int fill_rows = min(p_rows, (rows_here + MT - 1) / MT * MT);  // rows the passes read
    // Activations of rows r0 .. r0 + fill_rows (zero past rows_here or K) -> shared, float.
    __syncthreads();
    const int total = fill_rows * KC * kF4 * 32;
#pragma unroll 1
    for (int i = threadIdx.x; i < total; i += kSplitKThreads) {
      const int l = i & 31, j = (i >> 5) % kF4, c = (i / (32 * kF4)) % KC, m = i / (32 * kF4 * KC);
      const int kk = kbase + c * kChunk + l * E + 4 * j;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (m < rows_here && kk < k) {
        const int r = r0 + m;
        const int64_t rid = p.sorted_rows ? p.sorted_rows[r] : r;
        const uint2 b =
            __ldg(reinterpret_cast<const uint2*>(p.x + (rid / p.x_row_div) * p.ldx + kk));
        v = make_float4(bf16_lo(b.x), bf16_hi(b.x), bf16_lo(b.y), bf16_hi(b.y));
      }
      xs[i] = v;
    }
    __syncthreads();

#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
      const int n0 = n_cta + (it * 8 + warp) * RW;
      if (n0 >= n) break;  // warp-uniform
      if (!kPrefetch || !loaded) load_step(n0);
      loaded = false;
#pragma unroll 1
      for (int mb = 0; mb < rows_here; mb += MT) {
        // Keep the dequantisation inside this loop: hoisted out of it (loop-invariant), RW·KC·16
        // converted floats would spill.
#pragma unroll
        for (int u = 0; u < RW; ++u)
#pragma unroll
          for (int c = 0; c < KC; ++c)
            asm volatile("" : "+r"(wv[u][c].x), "+r"(wv[u][c].y), "+r"(wv[u][c].z),
                         "+r"(wv[u][c].w), "+r"(sc[u][c]));
        float acc[MT][RW];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int u = 0; u < RW; ++u) acc[m][u] = 0.0f;
#pragma unroll
        for (int c = 0; c < KC; ++c) {
          uint4 w_c[RW];
          uint32_t s_c[RW];
#pragma unroll
          for (int u = 0; u < RW; ++u) w_c[u] = wv[u][c], s_c[u] = sc[u][c];
          dequant_splitk_chunk<F, MT, RW>(w_c, s_c, gf, xs, ((mb * KC + c) * kF4) * 32 + lane, KC * kF4 * 32,
                              acc);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          const int r = r0 + mb + m;
          const bool rvalid = mb + m < rows_here;
          const int rid = rvalid ? (p.sorted_rows ? p.sorted_rows[r] : r) : -1;
#pragma unroll
          for (int u = 0; u < RW; ++u) {
            const float v = warp_sum(acc[m][u]);
            if (lane == 0 && rid >= 0 && n0 + u < n)
              p.partial[(int64_t{s} * p.num_rows + rid) * n + n0 + u] = v;
          }
        }
      }
    }
  }
}

// Launches one instantiation of the kernel above with the host plan (gemv_plan.h), shared by the
// per-format instantiation files (gemv_dequant_splitk_mxfp8.cu, gemv_dequant_splitk_nvfp4.cu).
// The shared-memory opt-in and the resident-CTA count are cached per instantiation.
template <QuantFormat F, int MT, int RW, int KC>
Status launch_dequant_splitk(const QuantGemvParams& p, const DequantSplitKPlan& plan,
                             cudaStream_t s) {
  auto* kernel = gemv_dequant_splitk_kernel<F, MT, RW, KC>;
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
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kSplitKThreads, plan.smem));
    resident = (occ > 0 ? occ : 1) * sms;
    occ_smem = plan.smem;
  }
  DequantSplitKPlan pl = plan;
  choose_dequant_splitk_iters(p, resident, &pl);
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, kernel, dim3(pl.grid_x, pl.grid_y),
                                        dim3(kSplitKThreads), pl.smem, s, p, pl.p_rows, pl.iters));
  return Status::ok();
}

}  // namespace m3::cuda::gemv

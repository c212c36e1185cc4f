// kMmaDirect: MXFP8 weights of one matrix at any number of activation rows on the tensor
// cores, the weights loaded straight into registers two stages ahead (no shared-memory ring),
// from the mma layout (quant/mxfp8_mma_layout.h: 2-KB contiguous runs) or row-major.
//
// Why (measured on the H200): at one row kDequantSplitK (float FMAs, ~0.24 instructions
// per weight byte) ran qkv [9856 x 6144] in 22.5 us and kMmaRing (tensor cores through a
// cp.async ring) in 25.0 us, against a 17.5-us plain read of the same bytes. This kernel on
// row-major weights was no faster (26.7 us): each warp's 16 rows are 32-byte pieces K bytes
// apart. Reading each (16-row tile, 128 columns) as 2 KB contiguous bytes it takes 19.1 us, and
// o_proj [6144 x 8192] 17.1 (kDequantSplitK: 20.7), the shared expert's gate|up 14.3 and down
// 9.6 (kMmaRing: 17.7 and 11.1).
//
// Operands (kMmaRing's, gemv_mma.cuh): A = 16 weight rows of a tile; lane (g, t) holds
// the 8 codes at element 8t of each 32-element block for rows g and g + 8, k-step i of the block
// takes elements 8t + 4i .. + 3 (cvt.rn.f16x2.e4m3x2, exact); both k-steps accumulate into a
// zeroed fragment, scaled by the block's E8M0 factor in f32. B = up to 8 activation rows per
// group (NG groups per pass): either xh (f16 x a power of two per row, x_f16.h, read per block
// through L1) or, without it (up to 8 rows), the bf16 rows converted by each warp for its own K
// range into shared memory, times a power of two chosen from that range (exact); that warp's
// fragment is multiplied by the inverse before the warps are summed.
//
// Work split: one CTA per 16-row tile (SwiGLU: gate rows i0 .. i0 + 7 with up rows N/2 + i0 ..,
// so a lane holds gate and up of one output), its W warps splitting K into contiguous ranges of
// 4-block stages (one 32-bit scale load per row per stage; the scales stay row-major). The
// warps' fragments are summed in warp order through shared memory (deterministic), then
// kMmaRing's fused epilogue stores f32 (or adds) or applies SwiGLU-OAI to bf16 / f16 x 2^8.
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/gemv_mma.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/reduce.cuh"
#include "backend/cuda/runtime/stream.h"
#include "quant/mxfp8_mma_layout.h"

namespace m3::cuda::gemv {

namespace {

// A warp's register pipeline over its stages st_begin .. st_begin + nst: stage
// i is computed from register slot i % NS (compute(stage, slot)), whose registers then take stage
// i + NS (load(stage, slot)); the first NS stages are loaded by the caller. Slots are
// compile-time constants after unrolling, so the loads stay in registers.
template <int NS, typename Compute, typename Load>
__device__ __forceinline__ void register_pipeline(int st_begin, int nst, Compute compute,
                                                  Load load) {
  for (int i0 = 0; i0 < nst; i0 += NS) {
#pragma unroll
    for (int j = 0; j < NS; ++j) {
      const int i = i0 + j;
      if (i < nst) {
        compute(st_begin + i, j);
        if (i + NS < nst) load(st_begin + i + NS, j);
      }
    }
  }
}


constexpr int kBlock = 32;                    // elements per E8M0 scale
constexpr int kStageBlocks = 4;               // blocks per stage: one 32-bit scale word per row
constexpr int kStageK = kBlock * kStageBlocks;
constexpr int kMaxRows = 8;                   // the mma's N
constexpr int kMaxWarps = 8;
constexpr int kPad = 8;                       // f16 elements after each activation row (banks)
// Stages each warp keeps in flight in registers (2 x 2 KB; 3 or 4 spend the registers of more
// warps and were no faster on the H200).
constexpr int kStagesInFlight = 2;

__device__ __forceinline__ uint2 ld_stream8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p));
  return v;
}

// Shared memory of a CTA of `warps` warps: the bf16-converted activation rows (x_f16: none) and
// the cross-warp sums.
size_t smem_bytes(int64_t fill_rows, int64_t k, int warps, int ng) {
  return static_cast<size_t>(fill_rows * (k + kPad) * 2) +
         static_cast<size_t>(warps) * ng * 32 * 16 + static_cast<size_t>(warps) * kMaxRows * 4;
}

// NG: groups of 8 activation rows per pass (the mma's N; more rows take more passes, each
// streaming the weights again). PACKED: weights in the mma layout (kMmaRows16 / kMmaSwigluPairs). XF16: the
// activations are p.xh (f16 x a power of two per row, x_f16.h), read per block through L1;
// else the bf16 rows (at most 8) are converted by each warp into shared memory.
template <int NG, bool PACKED, bool XF16>
__global__ void __launch_bounds__(256, 2) gemv_mma_direct_kernel(QuantGemvParams p) {
  constexpr int NS = kStagesInFlight;
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const int rows = static_cast<int>(p.num_rows);
  const int fill_rows = XF16 ? 0 : rows;
  const int64_t ldxs = k + kPad;  // f16 elements per activation row in shared memory
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);
  float4* red = reinterpret_cast<float4*>(smem + fill_rows * ldxs * 2);  // [W][NG][32]
  float* inv_s = reinterpret_cast<float*>(red + nwarps * NG * 32);      // [W][8]
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  auto weight_row = [&](int r) { return mma_tile_weight_row(tile, r, n, swiglu); };
  // Rows past N read row 0 (valid memory; their outputs are not stored).
  const int row_lo = max(weight_row(g), 0), row_hi = max(weight_row(g + 8), 0);
  const int64_t scale_cols = k / kBlock;
  const int stages = k / kStageK;
  const uint8_t* w_lo = p.w + int64_t{row_lo} * k + 8 * t;
  const uint8_t* w_hi = p.w + int64_t{row_hi} * k + 8 * t;
  const uint8_t* w_pk = p.w + int64_t{tile} * stages * mxfp8_mma::kStageBytes + 16 * lane;
  const uint8_t* s_lo = p.w_scale + int64_t{row_lo} * scale_cols;
  const uint8_t* s_hi = p.w_scale + int64_t{row_hi} * scale_cols;

  const int st_begin = static_cast<int>(int64_t{stages} * warp / nwarps);
  const int st_end = static_cast<int>(int64_t{stages} * (warp + 1) / nwarps);
  const int nst = st_end - st_begin;

  uint2 wl[NS][kStageBlocks], wh[NS][kStageBlocks];
  uint32_t sl[NS], sh[NS];
  auto load = [&](int s, int slot) {
#pragma unroll
    for (int u = 0; u < kStageBlocks; ++u) {
      if constexpr (PACKED) {  // rows g and g + 8 of block u: one 16-byte piece of 2 KB runs
        const uint4 v = ld_stream(w_pk + int64_t{s} * mxfp8_mma::kStageBytes + u * 512);
        wl[slot][u] = make_uint2(v.x, v.y);
        wh[slot][u] = make_uint2(v.z, v.w);
      } else {
        wl[slot][u] = ld_stream8(w_lo + int64_t{s} * kStageK + u * kBlock);
        wh[slot][u] = ld_stream8(w_hi + int64_t{s} * kStageK + u * kBlock);
      }
    }
    sl[slot] = __ldg(reinterpret_cast<const uint32_t*>(s_lo + s * kStageBlocks));
    sh[slot] = __ldg(reinterpret_cast<const uint32_t*>(s_hi + s * kStageBlocks));
  };

  // This CTA's pass: activation rows r0 .. r0 + rows_here (grid.y = the passes; each streams
  // the weights again).
  const int r0 = static_cast<int>(blockIdx.y) * 8 * NG;
  const int rows_here = min(rows - r0, 8 * NG);
  // The weights depend on no kernel: the first NS stages are requested before the wait for the
  // previous kernel (launched with p.pdl; no-ops without), so they stream under its tail.
  pdl_launch_dependents();
#pragma unroll
  for (int i = 0; i < NS; ++i)
    if (i < nst) load(st_begin + i, i);
  pdl_wait();

  if constexpr (!XF16) {
    // This warp's K range of every activation row (rows <= 8, one pass) -> f16 x 2^sh.
    const int kb = st_begin * kStageK, ke = st_end * kStageK;
    for (int r = 0; r < rows; ++r) {
      const uint16_t* xr = p.x + int64_t{r} * p.ldx;
      float m = 0.0f;
      for (int e = kb + 8 * lane; e < ke; e += 256) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(xr + e));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; ++q)
          m = fmaxf(m, fmaxf(fabsf(__uint_as_float(w4[q] << 16)),
                             fabsf(__uint_as_float(w4[q] & 0xFFFF0000u))));
      }
      m = warp_max(m);
      const int shift = f16_row_shift(m);
      const float sc = ldexpf(1.0f, shift);
      if (lane == 0) inv_s[warp * kMaxRows + r] = ldexpf(1.0f, -shift);
      for (int e = kb + 8 * lane; e < ke; e += 256) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(xr + e));
        const uint32_t w4[4] = {v.x, v.y, v.z, v.w};
        uint32_t h[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const __half2 h2 = __floats2half2_rn(__uint_as_float(w4[q] << 16) * sc,
                                                __uint_as_float(w4[q] & 0xFFFF0000u) * sc);
          h[q] = *reinterpret_cast<const uint32_t*>(&h2);
        }
        *reinterpret_cast<uint4*>(xs + r * ldxs + e) = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
    __syncwarp();  // the warp reads only its own range
  }

  // B column g of group ng = activation row r0 + 8ng + g (rows past the last read row r0:
  // valid memory, not stored).
  const uint16_t* xl[NG];
#pragma unroll
  for (int ng = 0; ng < NG; ++ng) {
    const int m = 8 * ng + g < rows_here ? 8 * ng + g : 0;
    xl[ng] = XF16 ? p.xh + int64_t{r0 + m} * p.ldx + 8 * t : xs + m * ldxs + 8 * t;
  }
  float acc[NG][4];
#pragma unroll
  for (int ng = 0; ng < NG; ++ng)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[ng][j] = 0.0f;
  auto compute = [&](int s, int slot) {
#pragma unroll
    for (int u = 0; u < kStageBlocks; ++u) {
      const int c = s * kStageBlocks + u;
      uint4 xv[NG];
#pragma unroll
      for (int ng = 0; ng < NG; ++ng)
        xv[ng] = XF16 ? __ldg(reinterpret_cast<const uint4*>(xl[ng] + c * kBlock))
                      : *reinterpret_cast<const uint4*>(xl[ng] + c * kBlock);
      const uint2 a = wl[slot][u], b = wh[slot][u];
      const uint32_t a00 = e4m3x2_to_f16x2(a.x), a01 = e4m3x2_to_f16x2(b.x),
                     a02 = e4m3x2_to_f16x2(a.x >> 16), a03 = e4m3x2_to_f16x2(b.x >> 16);
      const uint32_t a10 = e4m3x2_to_f16x2(a.y), a11 = e4m3x2_to_f16x2(b.y),
                     a12 = e4m3x2_to_f16x2(a.y >> 16), a13 = e4m3x2_to_f16x2(b.y >> 16);
      const float f_lo = e8m0_exact((sl[slot] >> (8 * u)) & 0xFFu),
                  f_hi = e8m0_exact((sh[slot] >> (8 * u)) & 0xFFu);
#pragma unroll
      for (int ng = 0; ng < NG; ++ng) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_f16(d, a00, a01, a02, a03, xv[ng].x, xv[ng].y);
        mma_f16(d, a10, a11, a12, a13, xv[ng].z, xv[ng].w);
        acc[ng][0] = fmaf(d[0], f_lo, acc[ng][0]);
        acc[ng][1] = fmaf(d[1], f_lo, acc[ng][1]);
        acc[ng][2] = fmaf(d[2], f_hi, acc[ng][2]);
        acc[ng][3] = fmaf(d[3], f_hi, acc[ng][3]);
      }
    }
  };
  register_pipeline<NS>(st_begin, nst, compute, load);

  // The fragments (times the warp's own activation factors where it converted x), summed
  // over the warps in warp order; then the epilogue, one thread per (group, lane).
#pragma unroll
  for (int ng = 0; ng < NG; ++ng) {
    float f0 = 1.0f, f1 = 1.0f;
    if constexpr (!XF16) {
      f0 = inv_s[warp * kMaxRows + (2 * t < rows_here ? 2 * t : 0)];
      f1 = inv_s[warp * kMaxRows + (2 * t + 1 < rows_here ? 2 * t + 1 : 0)];
    }
    red[(warp * NG + ng) * 32 + lane] =
        make_float4(acc[ng][0] * f0, acc[ng][1] * f1, acc[ng][2] * f0, acc[ng][3] * f1);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < NG * 32; idx += blockDim.x) {
    const int ng = idx >> 5, ln = idx & 31;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int w = 0; w < nwarps; ++w) {
      const float4 f = red[(w * NG + ng) * 32 + ln];
      v[0] += f.x, v[1] += f.y, v[2] += f.z, v[3] += f.w;
    }
    int64_t rid[2];
    float f[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int m = 8 * ng + 2 * (ln & 3) + j;
      rid[j] = m < rows_here ? r0 + m : -1;
      f[j] = !XF16 || rid[j] < 0 ? 1.0f
                                 : (p.x_inv_scale ? p.x_inv_scale[rid[j]] : p.x_inv_const);
    }
    mma_fragment_store(p, v, weight_row(ln >> 2), weight_row((ln >> 2) + 8), rid, f);
  }
}

template <int NG, bool PK, bool XF>
Status launch_one(const QuantGemvParams& p, cudaStream_t s) {
  auto* kernel = gemv_mma_direct_kernel<NG, PK, XF>;
  const int sms = launch_limits().sms;
  static std::once_flag once;
  static int occ[kMaxWarps + 1] = {};
  static size_t occ_smem = ~size_t{0};
  std::call_once(once, [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  });
  const int64_t fill_rows = XF ? 0 : p.num_rows;
  // Resident CTAs per SM for each width at this shared-memory size (cached per size; the
  // model's shapes come in a handful of sizes).
  if (occ_smem != smem_bytes(fill_rows, p.k, kMaxWarps, NG)) {
    for (int w = 1; w <= kMaxWarps; ++w) {
      int o = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, 32 * w,
                                                        smem_bytes(fill_rows, p.k, w, NG)) !=
          cudaSuccess)
        o = 1;
      occ[w] = std::max(o, 1);
    }
    occ_smem = smem_bytes(fill_rows, p.k, kMaxWarps, NG);
  }
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  const int64_t tiles = swiglu ? (p.n / 2 + 7) / 8 : (p.n + 15) / 16;
  const int64_t stages = p.k / kStageK;
  const int warps = mma_direct_warps(tiles, stages, occ, sms);
  const int64_t passes = (p.num_rows + 8 * NG - 1) / (8 * NG);
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(
      p.pdl, kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(passes)),
      dim3(32 * warps), smem_bytes(fill_rows, p.k, warps, NG), s, p));
  return Status::ok();
}

template <bool PK>
Status launch_layout(const QuantGemvParams& p, cudaStream_t s) {
  if (p.xh == nullptr) return launch_one<1, PK, false>(p, s);
  switch (mma_direct_row_groups(p)) {
    case 1: return launch_one<1, PK, true>(p, s);
    case 2: return launch_one<2, PK, true>(p, s);
    default: return launch_one<4, PK, true>(p, s);
  }
}

}  // namespace

std::string mma_direct_params_problem(const QuantGemvParams& p) {
  if (p.format != QuantFormat::kMxfp8) return "needs MXFP8 weights";
  if (p.group_offsets != nullptr || p.num_groups != 1) return "runs one matrix (no groups)";
  if (p.k <= 0 || p.k % kStageK != 0 || p.k > (int64_t{1} << 30) || p.n <= 0 ||
      p.n > (int64_t{1} << 30))
    return "K = " + std::to_string(p.k) + " must be a positive multiple of 128";
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  if (p.w_layout != WeightLayout::kRowMajor) {
    const auto tiling = static_cast<mxfp8_mma::Tiling>(p.w_layout);
    if (!mxfp8_mma::fits(p.n, p.k, tiling) || (tiling == mxfp8_mma::Tiling::kSwigluPairs) != swiglu)
      return "mma layout " + std::to_string(static_cast<int>(p.w_layout)) +
             " needs N % 16 == 0 and the pair tiling exactly with the SwiGLU epilogue";
  }
  if (p.xh == nullptr) {
    if (p.num_rows < 1 || p.num_rows > kMaxRows)
      return "reads bf16 rows only up to 8 (more need xh), got " + std::to_string(p.num_rows);
    if (smem_bytes(p.num_rows, p.k, kMaxWarps, 1) > 227 * 1024)
      return "rows x K too large for shared memory";
    if (p.x == nullptr || p.ldx < p.k || p.ldx % 8 != 0 ||
        (reinterpret_cast<uintptr_t>(p.x) & 15) != 0)
      return "x (bf16) rows must be 16-byte aligned with ldx >= K";
  } else if (p.ldx < p.k || p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.xh) & 15) != 0) {
    return "xh (f16) rows must be 16-byte aligned with ldx >= K";
  }
  if (p.w == nullptr || p.w_scale == nullptr || (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w_scale) & 3) != 0)
    return "weights must be 16-byte and scales 4-byte aligned";
  const GemvEpilogueParams& e = p.epilogue;
  if (!swiglu) {
    if (e.y == nullptr || e.ldy < p.n) return "the f32 epilogue needs y with ldy >= N";
  } else if (e.act == nullptr || p.n % 16 != 0) {
    return "SwiGLU needs act and N % 16 == 0";
  }
  return "";
}

Status launch_mma_direct(const QuantGemvParams& p, cudaStream_t s) {
  const std::string why = mma_direct_params_problem(p);
  if (!why.empty()) return invalid_argument("[cuda.quant_gemv] kMmaDirect " + why);
  return p.w_layout != WeightLayout::kRowMajor ? launch_layout<true>(p, s)
                                               : launch_layout<false>(p, s);
}

}  // namespace m3::cuda::gemv

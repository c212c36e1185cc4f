// EXPERIMENT, not yet run on a GPU (session 16's device time ran out after it was built): off
// unless QuantGemvParams::variant = 8 or M3_NVFP4_DIRECT=1; its first device call is in
// docs/dev/decode-persistent-layer.md, "Session 16".
//
// NVFP4 "direct" GEMV for one activation row per group (batch-1 routed experts): variant 5's
// tensor-core step (quant_gemv_mma.cuh, the mma layout of quant/nvfp4_mma_layout.h) with the
// weights and block scales loaded straight into registers two stages ahead, as variant 7 does for
// MXFP8 (gemv_mma_direct.cu), instead of through a cp.async ring in shared memory.
//
// Why: at one row the MXFP8 matrices ran 15-20 % faster that way (H200, shared gate|up 14.5
// against 18.1 us on variant 5, docs/perf-log.md session 16); variant 5 spends ~60 of its ~350
// instructions per 2-KB stage on the copies and their waits (SASS, session 16).
//
// Work split: one CTA per (16-row tile, group), its W warps splitting K into contiguous ranges of
// 256-column stages (two 128-column chunks = two 1-KB blocks of the layout). Each lane reads its
// 32 bytes of a block as two 16-byte loads (for lanes with bit 2 set the layout stores the halves
// swapped: selected in registers) and the two 16-bit words of block scales it needs per chunk
// (rows g and g + 8, blocks 2t and 2t + 1; the scales stay row-major). The row's activations
// (f16, x_f16.h) of the warp's K range are copied once into shared memory (16-byte pieces placed
// by nvfp4_x_piece_slot, so a quarter-warp's reads hit distinct banks). Each warp keeps variant
// 5's two accumulation chains (even and odd k-steps); the warps' fragments are summed in warp
// order and variant 5's epilogue stores f32 or SwiGLU-OAI to bf16 / f16 x 2^8.
// Requirements (nvfp4_direct_params_problem): NVFP4 in the mma layout, K % 256 == 0, N % 16 ==
// 0, at most one row per group (a group with more rows is computed one row per pass, correct but
// streaming the weights again), 16-byte aligned f16 rows, 2-byte aligned scales.
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_mma.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/stream.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda::gemv {

namespace {

constexpr int kChunkK = nvfp4_mma::kChunkK;  // 128 columns: one 1-KB block per 16-row tile
constexpr int kStageChunks = 2;
constexpr int kStageK = kChunkK * kStageChunks;
constexpr int kInFlight = 2;  // stages each warp holds in registers ahead of the one computed
constexpr int kMaxWarps = 8;

// Shared memory of a CTA: the activation row (K f16) and the cross-warp sums.
size_t smem_bytes(int64_t k, int warps) {
  return static_cast<size_t>(2 * k) + static_cast<size_t>(warps) * 32 * 16;
}

__device__ __forceinline__ uint32_t ldg_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint16_t*>(p));
}

__global__ void __launch_bounds__(256, 2) nvfp4_direct_kernel(QuantGemvParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  // The group (expert) comes from the previous kernel: wait before anything is read.
  pdl_launch_dependents();
  pdl_wait();
  int64_t grp;
  int r_begin, r_end;
  if (!cta_group_rows(p, &grp, &r_begin, &r_end)) return;  // whole CTA
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  auto weight_row = [&](int r) { return mma_tile_weight_row(tile, r, n, swiglu); };
  const int chunks = k / kChunkK, stages = k / kStageK;
  const int64_t scale_cols = k / 16;
  const uint8_t* wt = p.w + grp * int64_t{n} * (k / 2) + int64_t{tile} * chunks * 1024 + 32 * lane;
  const uint8_t* sbase = p.w_scale + grp * int64_t{n} * scale_cols + 2 * t;
  const uint8_t* s_lo = sbase + int64_t{weight_row(g)} * scale_cols;
  const uint8_t* s_hi = sbase + int64_t{weight_row(g + 8)} * scale_cols;
  const int st_begin = static_cast<int>(int64_t{stages} * warp / nwarps);
  const int st_end = static_cast<int>(int64_t{stages} * (warp + 1) / nwarps);
  const int nst = st_end - st_begin;
  const bool swap = (lane >> 2) & 1;  // this lane's halves are stored swapped

  uint4 wa[kInFlight][kStageChunks][2];
  uint32_t sc[kInFlight][kStageChunks][2];
  auto load = [&](int s, int slot) {
#pragma unroll
    for (int u = 0; u < kStageChunks; ++u) {
      const int c = s * kStageChunks + u;
      wa[slot][u][0] = ld_stream(wt + int64_t{c} * 1024);
      wa[slot][u][1] = ld_stream(wt + int64_t{c} * 1024 + 16);
      sc[slot][u][0] = ldg_u16(s_lo + c * 8);
      sc[slot][u][1] = ldg_u16(s_hi + c * 8);
    }
  };
  uint8_t* xs = smem;                                      // [K] f16, pieces swizzled
  float4* red = reinterpret_cast<float4*>(smem + 2 * k);  // [W][32]
  const int kb = st_begin * kStageK, ke = st_end * kStageK;

  for (int r0 = r_begin; r0 < r_end; ++r0) {
    // The weights first (their latency overlaps the activation copy below).
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (i < nst) load(st_begin + i, i);
    const int64_t rid = p.sorted_rows ? p.sorted_rows[r0] : r0;
    const uint16_t* xrow = p.xh + (rid / p.x_row_div) * p.ldx;
    __syncwarp();  // the previous pass's reads of this warp's range are done
    for (int e = kb + 8 * lane; e < ke; e += 256) {
      const int piece = e / 8;
      *reinterpret_cast<uint4*>(xs + 16 * nvfp4_x_piece_slot(piece)) =
          __ldg(reinterpret_cast<const uint4*>(xrow + e));
    }
    __syncwarp();  // the warp reads only its own range

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto compute = [&](int s, int slot) {
#pragma unroll
      for (int u = 0; u < kStageChunks; ++u) {
        const int c = s * kStageChunks + u;
        const uint4 h0 = wa[slot][u][0], h1 = wa[slot][u][1];
        const uint4 w0 = swap ? h1 : h0, w1 = swap ? h0 : h1;
        // Blocks 2t, 2t + 1 of rows g (l) and g + 8 (h) (nvfp4_lane_scales' values).
        uint32_t sl0, sl1, sh0, sh1;
        nvfp4_scale_operands(sc[slot][u][0], sc[slot][u][1], &sl0, &sl1, &sh0, &sh1);
        uint4 xc[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
          xc[q] = *reinterpret_cast<const uint4*>(
              xs + 16 * nvfp4_x_piece_slot(c * 16 + 4 * t + q));
        const uint32_t wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        nvfp4_chunk_mma(wv, sl0, sl1, sh0, sh1, xc,
                        [&](int i) -> float(&)[4] { return i % 2 ? acc_odd : acc; });
      }
    };
    register_pipeline<kInFlight>(st_begin, nst, compute, load);
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] += acc_odd[j];

    // The warps' fragments in warp order, then the epilogue (one warp).
    red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (warp == 0) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int w = 0; w < nwarps; ++w) {
        const float4 f = red[w * 32 + lane];
        v[0] += f.x, v[1] += f.y, v[2] += f.z, v[3] += f.w;
      }
      int64_t rids[2];
      float f[2];
      mma_fragment_tokens<QuantFormat::kNvfp4>(p, lane, 0, 1, r0, grp, rids, f);
      mma_fragment_store(p, v, weight_row(g), weight_row(g + 8), rids, f);
    }
    __syncthreads();  // red is reused by the next pass
  }
}

}  // namespace

std::string nvfp4_direct_params_problem(const QuantGemvParams& p) {
  if (p.format != QuantFormat::kNvfp4 || p.w_layout == 0)
    return "needs NVFP4 weights in the mma layout";
  if (p.k <= 0 || p.k % kStageK != 0 || p.k > (int64_t{1} << 30))
    return "K = " + std::to_string(p.k) + " must be a positive multiple of 256";
  if (p.n <= 0 || p.n % 16 != 0 || p.n > (int64_t{1} << 30))
    return "N = " + std::to_string(p.n) + " must be a positive multiple of 16";
  if ((reinterpret_cast<uintptr_t>(p.w_scale) & 1) != 0) return "scales must be 2-byte aligned";
  if (smem_bytes(p.k, kMaxWarps) > 227 * 1024) return "K too large for the activation row";
  if (const std::string why = tensor_core_params_problem(p); !why.empty()) return why;
  return "";
}

Status launch_nvfp4_direct(const QuantGemvParams& p, cudaStream_t s) {
  const std::string why = nvfp4_direct_params_problem(p);
  if (!why.empty()) return invalid_argument("[cuda.quant_gemv] NVFP4 direct: " + why);
  auto* kernel = nvfp4_direct_kernel;
  const int sms = launch_limits().sms;
  static std::once_flag once;
  std::call_once(once, [&] {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  });
  // Resident CTAs per SM for each width at this K (cached per K).
  static int occ[kMaxWarps + 1] = {};
  static int64_t occ_k = -1;
  if (occ_k != p.k) {
    for (int w = 1; w <= kMaxWarps; ++w) {
      int o = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, 32 * w, smem_bytes(p.k, w)) !=
          cudaSuccess)
        o = 1;
      occ[w] = std::max(o, 1);
    }
    occ_k = p.k;
  }
  const int64_t tiles = p.n / 16;
  const int64_t slots = p.group_offsets ? std::max<int64_t>(1, p.num_slots) : 1;
  const int64_t ctas = tiles * slots, stages = p.k / kStageK;
  // Warps per CTA: variant 7's rule (the widest whose grid is resident in one wave with at most
  // ~24 warps per SM), M3_NVFP4_DIRECT_WIDTH overriding it for benchmarks.
  static const int forced = [] {
    const char* e = std::getenv("M3_NVFP4_DIRECT_WIDTH");
    return e ? std::atoi(e) : 0;
  }();
  int warps = 1;
  for (int w = 1; w <= kMaxWarps; ++w)
    if (ctas * w <= int64_t{24} * sms && ctas <= int64_t{occ[w]} * sms) warps = w;
  if (forced >= 1 && forced <= kMaxWarps) warps = forced;
  warps = static_cast<int>(std::min<int64_t>(warps, stages));
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(
      p.pdl, kernel, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(slots)),
      dim3(32 * warps), smem_bytes(p.k, warps), s, p));
  return Status::ok();
}

}  // namespace m3::cuda::gemv

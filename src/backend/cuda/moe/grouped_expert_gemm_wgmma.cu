// The grouped expert GEMM's Hopper main loop (GroupedExpertKernel::kWgmma, grouped_expert_gemm.h):
// the same problem, grid, tiles (128 gathered rows x 128 weight rows, 128 columns per stage),
// cp.async ring, exact in-shared-memory dequantisation and epilogues as the mma.sync kernel, with
// the multiplication issued as wgmma.mma_async by two warpgroups.
//
// Why wgmma: mma.sync m16n8k16 feeds the tensor cores from registers loaded by ldmatrix; at 8
// warps that path reached 112-126 TFLOP/s on the H200 (docs/performance.md), ~12 % of the bf16
// peak. wgmma m64nNk16 reads both operands straight from shared memory, is issued by a whole
// warpgroup (128 threads) and runs asynchronously: the issuing threads are free until they wait.
//
// Schedule (256 threads = warpgroups 0 and 1; warpgroup w multiplies gathered rows 64w .. 64w+63
// against all 128 weight rows of the CTA, m64n128k16, 64 float32 accumulators per thread):
//
//   prologue: copy stages 0 and 1 (cp.async), convert stage 0's weights to bf16 tile B0
//   iteration ks:
//     wait for my cp.async groups; fence.proxy.async; __syncthreads      (1)
//     wgmma.fence; 8 x wgmma (k = 0..127 of stage ks, A slot ks % 3, B tile ks & 1); commit
//     cp.async stage ks + 2 into ring slot (ks + 2) % 3                     (2)
//     convert stage ks + 1's weights into B tile (ks + 1) & 1              (3)
//     wgmma.wait_group 0
//
// (3) runs on the ALU / load-store pipes while the tensor cores work through the 8 wgmmas of
// (1): the conversion's cost (estimated from the source at about the multiplication's time per
// stage, docs/design/prefill-expert-gemm.md) is hidden rather than added, which is what a
// warp-specialised producer / converter / consumer split would buy, without its mbarrier
// protocol (nothing here can deadlock on a miscounted barrier). The price is one CTA-wide
// barrier per 128-column stage: the tensor pipe drains there (the 16 wgmmas of a stage take
// ~1000 cycles, the barrier and the re-issue an estimated ~100).
//
// Hazards, all closed by barrier (1) of the next iteration:
//   - ring slot (ks + 2) % 3 == (ks - 1) % 3 was last read by the wgmmas of iteration ks - 1,
//     which every warpgroup waited for (wait_group 0) before that barrier;
//   - B tile (ks + 1) & 1 == (ks - 1) & 1, likewise;
//   - the raw codes of stage ks + 1 were copied by other threads: waited (cp.async.wait_group)
//     by their copiers before the barrier.
// Proxies: cp.async and st.shared write through the generic proxy; wgmma reads its operands
// through the async proxy. Every thread executes fence.proxy.async.shared::cta after its own
// writes (its cp.async groups complete, its converted stores done) and before barrier (1), so the
// wgmmas issued after the barrier see them.
//
// Shared-memory layout of an operand tile (A: 128 gathered rows, B: 128 weight rows): the
// 128-byte-swizzled K-major tile of wgmma.cuh.
// Bank conflicts: an 8-thread phase of the A copy writes one row's 8 chunks of one half (8
// distinct positions); the converter's phase writes one weight row's 16-byte chunks, even chunks
// of half 0 by threads 0-3 and odd chunks of half 1 by threads 4-7 first, so again 8 positions.
//
// Accumulators: the m64nN fragment of wgmma.cuh.
// SwiGLU pairing: the CTA's local weight rows 0..63 are gate rows 64nt .. 64nt + 63 and rows
// 64..127 the matching up rows N/2 + 64nt ..; so gate column c sits in d[4(c/8) + ..] and its up
// column in d[4(c/8 + 8) + ..] of the same thread. Every output element is written by one thread
// from a sum over K in a fixed order: deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/moe/grouped_expert_stage.cuh"
#include "backend/cuda/moe/wgmma.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

using grouped::kBK;
using grouped::kBM;
using grouped::kBN;

constexpr int kThreads = 256;                    // 2 warpgroups
constexpr int kRowsPerWarpgroup = 64;            // wgmma m64
constexpr int kHalfBytes = wgmma::kHalfBytes;
constexpr int kTileBytes = wgmma::kTileBytes;
constexpr int kSwizzleAtomBytes = wgmma::kSwizzleAtomBytes;
static_assert(kBM == kBN && kBM == wgmma::kTileRows, "A and B tiles share the layout helpers");
static_assert(kBM == 2 * kRowsPerWarpgroup, "two warpgroups of 64 rows");

constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

template <QuantFormat F>
struct Ring : grouped::StageGeometry<F> {
  using Base = grouped::StageGeometry<F>;
  // Ring slots: the stage being multiplied, the one being converted, the one being copied.
  static constexpr int kStages = 3;
  // A tile, raw codes, scales; a whole number of swizzle atoms so every A tile is aligned.
  static constexpr int kStageBytes =
      round_up(kTileBytes + Base::kRawBytes + Base::kScaleBytes, kSwizzleAtomBytes);
  // + two bf16 B tiles + the row tables + slack to align the dynamic shared memory to 1024.
  static constexpr int kSmemBytes =
      kStages * kStageBytes + 2 * kTileBytes + 2 * kBM * 4 + kSwizzleAtomBytes;
  static_assert(kSmemBytes <= 232448, "more shared memory than an H100/H200 SM offers");
};

using wgmma::sw128_desc;
using wgmma::sw128_off;

// Local weight row lr (0..127) of column tile nt -> the matrix row (SwiGLU: gate rows, then the
// matching up rows; the 8 mma-layout tiles 8nt .. 8nt + 7 hold exactly these rows in both
// tilings, as for the mma.sync kernel).
template <GroupedEpilogue EP>
__device__ __forceinline__ int weight_row(int lr, int nt, int n) {
  if constexpr (EP == GroupedEpilogue::kSwigluBf16) {
    const int j = nt * (kBN / 2) + (lr & 63);
    return lr < 64 ? j : n / 2 + j;
  } else {
    return nt * kBN + lr;
  }
}

template <QuantFormat F, GroupedEpilogue EP>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_expert_gemm_wgmma_kernel(GroupedExpertGemmParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using G = Ring<F>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzle is a function of address bits 4-9: align the base to 1024 ourselves.
  const uint32_t raw_base = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((raw_base + kSwizzleAtomBytes - 1) & ~(kSwizzleAtomBytes - 1)) -
                              raw_base);
  uint8_t* btiles = smem + G::kStages * G::kStageBytes;  // 2 x bf16 weights [kBN][kBK]
  int32_t* a_src = reinterpret_cast<int32_t*>(btiles + 2 * kTileBytes);  // [kBM] x row, -1 none
  int32_t* w_row = a_src + kBM;                                     // [kBN] weight row

  const int E = static_cast<int>(p.num_experts);
  const int mt = blockIdx.y, nt = blockIdx.x;
  if (mt >= p.tile_offsets[E]) return;  // past the routed rows (uniform over the CTA)
  const grouped::RowTile tile = grouped::row_tile(p, mt);
  const int e = tile.e, row_begin = tile.row_begin, rows = tile.rows;

  const int n = static_cast<int>(p.w.n), k = static_cast<int>(p.w.k);
  const int tid = threadIdx.x;
  if (tid < kBM) {
    a_src[tid] = grouped::source_row(p, tile, tid);
  } else {
    w_row[tid - kBM] = weight_row<EP>(tid - kBM, nt, n);
  }
  __syncthreads();

  const int64_t nk = int64_t{n} * k;
  grouped::StageSource wsrc;
  wsrc.wq = p.w.w + static_cast<int64_t>(e) * (G::kNv ? nk / 2 : nk);
  wsrc.ws = p.w.w_scale + static_cast<int64_t>(e) * (nk / G::kBlock);
  wsrc.w_row = w_row;
  wsrc.n = n;
  wsrc.k = k;
  wsrc.k_stages = k / kBK;
  wsrc.tiling = static_cast<int>(p.w.layout);
  wsrc.tau0 = nt * 8;  // mma layouts: the CTA's 8 tiles of 16 rows (both tilings)
  const float global = (G::kNv && p.w.w_global != nullptr) ? p.w.w_global[e] : 1.0f;
  const int k_stages = wsrc.k_stages;

  auto load_stage = [&](int slot, int ks) {
    uint8_t* st = smem + slot * G::kStageBytes;
    const uint32_t a_s = smem_u32(st);
    // Activations: 128 rows x 16 chunks of 16 bytes; rows past the tile's end read nothing and
    // are zero-filled (their products are 0, their outputs not written).
#pragma unroll
    for (int i = 0; i < kBM * 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, r = idx >> 4, c = idx & 15;
      const int32_t src = a_src[r];
      const uint16_t* g = src >= 0 ? p.a + int64_t{src} * p.lda + ks * kBK + c * 8 : p.a;
      cp_async16(a_s + sw128_off(r, c), g, src >= 0 ? 16 : 0);
    }
    grouped::load_stage_weights<F, kThreads>(a_s + kTileBytes, wsrc, ks, tid);
  };

  // The stage's quantised weights -> bf16 B tile (swizzled as above). Each thread converts 4
  // groups of 16 consecutive columns, group q of local weight row (tid + 256q) / 8; where a
  // group's codes and scale sit in a raw stage is the same for every stage, so it is located
  // once (the mma layouts' tile arithmetic is a quarter of the conversion's instructions).
  constexpr int kGroupsPerThread = kBN * (kBK / 16) / kThreads;
  grouped::Loc16 loc[kGroupsPerThread];
#pragma unroll
  for (int q = 0; q < kGroupsPerThread; ++q) {
    const int gi = tid + q * kThreads;
    loc[q] = grouped::locate16<F>(wsrc, gi >> 3, gi & 7);
  }
  auto convert_stage = [&](int slot, uint8_t* btile) {
    const uint8_t* raw = smem + slot * G::kStageBytes + kTileBytes;
#pragma unroll
    for (int q = 0; q < kGroupsPerThread; ++q) {
      const int gi = tid + q * kThreads, lr = gi >> 3, cg = gi & 7;
      uint32_t o[8];
      grouped::convert16<F>(raw, wsrc.tiling, loc[q], o);
      const uint4 lo = make_uint4(o[0], o[1], o[2], o[3]);  // chunk 2cg
      const uint4 hi = make_uint4(o[4], o[5], o[6], o[7]);  // chunk 2cg + 1
      // Threads 4-7 of a phase (half 1) store their odd chunk first: no bank conflict.
      const bool odd_first = cg >= 4;
      *reinterpret_cast<uint4*>(btile + sw128_off(lr, 2 * cg + (odd_first ? 1 : 0))) =
          odd_first ? hi : lo;
      *reinterpret_cast<uint4*>(btile + sw128_off(lr, 2 * cg + (odd_first ? 0 : 1))) =
          odd_first ? lo : hi;
    }
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const int wg = tid >> 7;  // warpgroup: gathered rows 64wg .. 64wg + 63

  static_assert(G::kStages == 3, "the wait counts below assume 3 ring slots");
  load_stage(0, 0);
  cp_async_commit();
  if (1 < k_stages) load_stage(1, 1);
  cp_async_commit();
  cp_async_wait<1>();  // stage 0
  __syncthreads();
  convert_stage(0, btiles);
  for (int ks = 0; ks < k_stages; ++ks) {
    const int slot = ks % G::kStages;
    // Committed groups: stages 0 .. ks + 1; wait for all (stage ks + 1 is converted below).
    cp_async_wait<0>();
    wgmma::fence_proxy_async_smem();  // my copies and converted stores -> visible to wgmma
    __syncthreads();
    const uint32_t a_s =
        smem_u32(smem + slot * G::kStageBytes) + wg * kRowsPerWarpgroup * 128;
    const uint32_t b_s = smem_u32(btiles + (ks & 1) * kTileBytes);
    wgmma::fence();
    wgmma::fence_operands(acc);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint32_t off = (kk >> 2) * kHalfBytes + (kk & 3) * 32;
      wgmma::m64n128k16_ss(acc, sw128_desc(a_s + off), sw128_desc(b_s + off));
    }
    wgmma::commit();
    wgmma::fence_operands(acc);
    if (ks + 2 < k_stages) load_stage((ks + 2) % G::kStages, ks + 2);
    cp_async_commit();
    if (ks + 1 < k_stages) convert_stage((ks + 1) % G::kStages, btiles + ((ks + 1) & 1) * kTileBytes);
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
  }
  cp_async_wait<0>();

  // Epilogue (fragment layout in the header comment).
  const int lane = tid & 31, quarter = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = wg * kRowsPerWarpgroup + quarter * 16 + g + 8 * hh;
    if (r >= rows) continue;
    const int64_t out_row = int64_t{row_begin} + r;
    if constexpr (EP == GroupedEpilogue::kSwigluBf16) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = nt * (kBN / 2) + 8 * j + 2 * t;
        const float g0 = acc[4 * j + 2 * hh] * global, g1 = acc[4 * j + 2 * hh + 1] * global;
        const float u0 = acc[4 * (j + 8) + 2 * hh] * global;
        const float u1 = acc[4 * (j + 8) + 2 * hh + 1] * global;
        const __nv_bfloat162 v =
            __floats2bfloat162_rn(grouped::swiglu_oai(g0, u0, p.alpha, p.limit),
                                  grouped::swiglu_oai(g1, u1, p.alpha, p.limit));
        *reinterpret_cast<__nv_bfloat162*>(p.act + out_row * p.ldact + col) = v;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = nt * kBN + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(p.y + out_row * p.ldy + col) =
            make_float2(acc[4 * j + 2 * hh] * global, acc[4 * j + 2 * hh + 1] * global);
      }
    }
  }
#else
  __trap();  // wgmma needs sm_90a; the launcher refuses other devices
#endif
}

template <QuantFormat F, GroupedEpilogue EP>
Status launch_typed(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = Ring<F>::kSmemBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(grouped_expert_gemm_wgmma_kernel<F, EP>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  M3_CUDA_RETURN_IF_ERROR(attr);
  const int64_t n_tiles = p.w.n / kBN;
  const int64_t m_tiles = grouped_expert_gemm_max_row_tiles(p.max_rows, p.num_experts);
  if (m_tiles > 65535 || n_tiles > 65535)
    return invalid_argument("[cuda.grouped_expert_gemm] grid too large: " +
                            std::to_string(m_tiles) + " row tiles");
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles));
  grouped_expert_gemm_wgmma_kernel<F, EP><<<grid, kThreads, kSmem, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR((grouped_expert_gemm_wgmma_kernel<F, EP>));
  return Status::ok();
}

}  // namespace

Status launch_grouped_expert_gemm_wgmma(const GroupedExpertGemmParams& p, CUstream_st* stream) {
  // wgmma exists on compute capability 9.0 only (the binary is built for sm_90a).
  int dev = 0, major = 0, minor = 0;
  M3_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return invalid_argument("[cuda.grouped_expert_gemm] the wgmma kernel needs an sm_90 GPU "
                            "(H100/H200), this device is sm_" +
                            std::to_string(major) + std::to_string(minor));
  const bool swiglu = p.epilogue == GroupedEpilogue::kSwigluBf16;
  if (p.w.format == QuantFormat::kNvfp4) {
    return swiglu ? launch_typed<QuantFormat::kNvfp4, GroupedEpilogue::kSwigluBf16>(p, stream)
                  : launch_typed<QuantFormat::kNvfp4, GroupedEpilogue::kStoreF32>(p, stream);
  }
  return swiglu ? launch_typed<QuantFormat::kMxfp8, GroupedEpilogue::kSwigluBf16>(p, stream)
                : launch_typed<QuantFormat::kMxfp8, GroupedEpilogue::kStoreF32>(p, stream);
}

}  // namespace m3::cuda

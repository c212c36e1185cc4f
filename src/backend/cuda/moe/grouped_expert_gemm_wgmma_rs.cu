// The grouped expert GEMM with the weights as wgmma's register operand
// (GroupedExpertKernel::kWgmmaRegisterWeights, grouped_expert_gemm.h): NVFP4 weights in the mma
// layouts only (quant/nvfp4_mma_layout.h).
//
// Why: the two other main loops convert each stage's weights into a bf16 tile in shared memory
// before the tensor cores read it, one barrier per stage, and every CTA of an expert's token tiles
// converts the same weights again; they reach 13-18 % of the bf16 peak (docs/performance.md). Here
// the product is computed transposed, C^T = W · A^T: the weights are wgmma's A operand (M = weight
// rows), taken from registers, and the gathered token rows are its B operand (N = 128 tokens)
// from a 128-byte-swizzled shared-memory ring. The NVFP4 mma layout already stores, per 16-row
// tile and 128 columns, the 32 bytes each lane of a warp needs for mma.m16n8k16's A registers over
// 8 k-steps (the decode GEMV's operands), so every lane loads its weights straight from global
// memory into registers (two 16-byte loads per tile and stage), converts one k-step at a time to
// exact bf16 (e2m1·e4m3 is a bf16 number: one bf16 multiply of the code bits by the block scale,
// nvfp4_mma::fragment_bf16; the per-matrix multiplier is applied in the epilogue),
// and no weight byte passes through shared memory.
//
// K order. In the mma layout, k-step i of a 128-column chunk pairs mma's logical k (2t + jj,
// 2t + 8 + jj) of lane 4g + t with the physical columns 32t + 4i + jj and 32t + 4i + 2 + jj
// (jj = 0, 1). Any order of K gives the same sum as long as both operands use it, so the token
// rows are copied into shared memory in that order (nvfp4_mma::k_order_position): physical
// column pair (2m, 2m + 1) of a chunk goes to logical columns L, L + 1 with L = 16i + 2t +
// 8·(m & 1), where t = m / 16, i = (m / 2) % 8. From activations in the checkpoint's order the copy
// is made of 4-byte cp.async (one column pair each; a warp reads 128 contiguous bytes of a row);
// from activations already in that order (a_in_k_order: launch_to_k_order, or the act that this
// kernel's SwiGLU epilogue wrote with act_in_k_order) of 16-byte ones, a quarter of the
// instructions.
//
// Tiles: a CTA computes 128·kBlocks weight rows x 128 gathered token rows. 256 threads = two
// warpgroups; warpgroup w holds kBlocks blocks of 64 weight rows (warp q: the 16-row mma tile
// tau0 + 4·(w·kBlocks + b) + q of block b), each m64n128k16 with 64 float32 accumulators a
// thread. kBlocks = 2 where N allows (N % 256 == 0): the activation bytes per multiply-add, the
// kernel's main L2 traffic, halve.
//
// Pipeline, per 128-column stage ks (4 ring slots of 32 KB for the token tile), k-step kk = 0..7:
//   wgmma.fence; kBlocks x wgmma (A from registers, B slot ks % 4); commit;
//   cp.async of part kk of stage ks + 2's token tile into slot (ks + 2) % 4 (one commit group a
//   stage, closed at kk = 7); at kk = 0 the global loads of stage ks + 1's weights and scales
//   (no instruction reads the loaded registers before that stage converts them, so the warp
//   waits on these loads a whole stage later, not here);
//   at kk = 6: wait for stage ks + 1's group; fence.proxy.async; __syncthreads;
//   wgmma.wait_group 1; convert the next k-step into the other A registers
// wait_group 1 keeps one k-step in flight while the next is converted, so the conversion runs
// under the tensor cores. The copies are spread over the k-steps and the barrier sits in k-step 6,
// with k-steps 5 and 6 still queued on the tensor cores, so nothing waits at the stage boundary
// (a burst of copies and a barrier there left the tensor cores idle for several hundred cycles a
// stage). Hazards: the A registers of k-step kk + 1 were last read by k-step kk - 1, which
// wait_group 1 after k-step kk has retired; slot (ks + 2) % 4 was last read by stage ks - 2,
// whose last k-step retired at the first wait_group 1 of stage ks - 1, before the barrier of
// stage ks - 1 that every thread passed before its first copy of stage ks (hence 4 slots, not 3).
// Proxies: cp.async writes through the generic proxy, wgmma reads through the async proxy: every
// thread fences (fence.proxy.async) after its copies landed, before the barrier.
//
// Epilogue: accumulator (weight row, token) pairs (wgmma.cuh). kStoreF32 writes
// y[token, weight row]; kSwigluBf16 (kMmaSwigluPairs: tile rows 0..7 are gate rows 8τ + g, rows
// 8..15 the matching up rows) holds gate and up of one (token, intermediate column) in the same
// thread and writes act[token, 8τ + g]. Every output element is written by one thread from a sum
// over K in a fixed order: deterministic (the order differs from the other loops': results agree
// within the float32 accumulation bound).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/gemm/scale_codes.cuh"
#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/moe/grouped_expert_stage.cuh"
#include "backend/cuda/moe/wgmma.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "quant/nvfp4_mma_layout.h"

namespace m3::cuda {
namespace {

constexpr int kThreads = 256;                           // 2 warpgroups
constexpr int kTokens = static_cast<int>(kGroupedTileM);  // gathered rows per CTA (wgmma N)
constexpr int kK = static_cast<int>(kGroupedTileK);       // columns per stage
constexpr int kSlots = 4;                               // token-tile ring (see the hazards)
constexpr int kSmemBytes =
    kSlots * wgmma::kTileBytes + kTokens * 4 + wgmma::kSwizzleAtomBytes;
static_assert(kTokens == wgmma::kTileRows && kK == nvfp4_mma::kChunkK, "one chunk per stage");
static_assert(kSmemBytes <= 232448, "more shared memory than an H100/H200 SM offers");

// One lane's weights of one 16-row tile for one stage: its 8 words (k-steps 0..7, nvfp4_mma) and
// the E4M3 block scales of its rows g and g + 8, blocks 2t (low byte) and 2t + 1 (k-steps 4..7).
// Nothing here combines the loaded values (that would wait for the loads where they are issued).
struct LaneWeights {
  uint4 w03, w47;
  uint32_t scales_g, scales_g8;
};

__device__ __forceinline__ LaneWeights load_lane_weights(const uint8_t* chunk, const uint8_t* sc_g,
                                                         const uint8_t* sc_g8, int lane) {
  const uint8_t* wl = chunk + lane * 32;
  // The layout swaps the 16-byte halves of lanes with bit 2 set. The swap is done on the
  // addresses, not on the loaded values: a select of the values would wait for the loads right
  // here, in the stage's first k-step, instead of seven k-steps later where they are converted.
  const int first = ((lane >> 2) & 1) * 16;
  LaneWeights r;
  r.w03 = __ldg(reinterpret_cast<const uint4*>(wl + first));
  r.w47 = __ldg(reinterpret_cast<const uint4*>(wl + (16 - first)));
  r.scales_g = __ldg(reinterpret_cast<const uint16_t*>(sc_g));
  r.scales_g8 = __ldg(reinterpret_cast<const uint16_t*>(sc_g8));
  return r;
}

__device__ __forceinline__ uint32_t word_of(const LaneWeights& lw, int i) {
  const uint4& v = i < 4 ? lw.w03 : lw.w47;
  switch (i & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
  }
}

// The block scales of k-steps 0..3 (half 0) or 4..7 (half 1) of a lane's rows g and g + 8, as
// bf16x2 pairs times 2^112 (e4m3_to_bf16x2_x2p112): converted once per half stage.
struct HalfScales {
  uint32_t g, g8;
};
__device__ __forceinline__ HalfScales half_scales(const LaneWeights& lw, int half) {
  const int shift = 8 * half;
  return {e4m3_to_bf16x2_x2p112((lw.scales_g >> shift) & 0xFF),
          e4m3_to_bf16x2_x2p112((lw.scales_g8 >> shift) & 0xFF)};
}

// k-step i of a lane's weights as wgmma's A registers (bf16x2, the exact weights x 2^-14; the
// epilogue applies 2^14): fragments 0 / 2 are row g, 1 / 3 row g + 8 (nvfp4_mma::fragment_bf16,
// codes x 2^-126), times their half's block scales. Two shifts, two bit operations and one bf16
// multiply a register.
__device__ __forceinline__ void a_registers(const LaneWeights& lw, int i, const HalfScales& s,
                                            uint32_t (&a)[4]) {
  const uint32_t w = word_of(lw, i);
  a[0] = mul_bf16x2(nvfp4_mma::fragment_bf16(w, 0), s.g);
  a[1] = mul_bf16x2(nvfp4_mma::fragment_bf16(w, 1), s.g8);
  a[2] = mul_bf16x2(nvfp4_mma::fragment_bf16(w, 2), s.g);
  a[3] = mul_bf16x2(nvfp4_mma::fragment_bf16(w, 3), s.g8);
}

template <int kBlocks, GroupedEpilogue EP, bool kAInKOrder>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_expert_gemm_wgmma_rs_kernel(GroupedExpertGemmParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // The swizzle is a function of address bits 4-9: align the base to 1024 ourselves.
  const uint32_t raw_base = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((raw_base + wgmma::kSwizzleAtomBytes - 1) &
                               ~(wgmma::kSwizzleAtomBytes - 1)) - raw_base);
  int32_t* a_src = reinterpret_cast<int32_t*>(smem + kSlots * wgmma::kTileBytes);  // -1: none
  const uint32_t ring = smem_u32(smem);

  const int E = static_cast<int>(p.num_experts);
  const int mt = blockIdx.y, nt = blockIdx.x;
  if (mt >= p.tile_offsets[E]) return;  // past the routed rows (uniform over the CTA)
  const grouped::RowTile tile = grouped::row_tile(p, mt);
  const int e = tile.e, row_begin = tile.row_begin, rows = tile.rows;

  const int n = static_cast<int>(p.w.n), k = static_cast<int>(p.w.k);
  const int tid = threadIdx.x;
  if (tid < kTokens) a_src[tid] = grouped::source_row(p, tile, tid);
  __syncthreads();

  // Part `part` (0..7) of the token tile of stage ks, in the weights' k order: one eighth of the
  // stage's copies, so that a stage's copies are spread over its 8 k-steps instead of stalling
  // the tensor cores in one burst. Permuting: thread tid copies column pair m = tid % 64 of rows
  // tid / 64 + 4r, r = 4·part .. 4·part + 3. In order: 16-byte chunk tid % 16 of row
  // tid / 16 + 16·part.
  const int pair = tid & 63, row0 = tid >> 6;
  const int lpos = nvfp4_mma::k_order_position(2 * pair);
  const int chunk16 = lpos >> 3, in_chunk = (lpos & 7) * 2;
  auto load_token_part = [&](int slot, int ks, int part) {
    const uint32_t tile = ring + slot * wgmma::kTileBytes;
    if constexpr (kAInKOrder) {
      const int c = tid & 15, r = (tid >> 4) + 16 * part;
      const int32_t src = a_src[r];
      const uint16_t* g = src >= 0 ? p.a + int64_t{src} * p.lda + ks * kK + 8 * c : p.a;
      cp_async16(tile + wgmma::sw128_off(r, c), g, src >= 0 ? 16 : 0);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = row0 + 4 * (4 * part + i);
        const int32_t src = a_src[r];
        const uint16_t* g = src >= 0 ? p.a + int64_t{src} * p.lda + ks * kK + 2 * pair : p.a;
        cp_async4(tile + wgmma::sw128_off(r, chunk16) + in_chunk, g, src >= 0 ? 4 : 0);
      }
    }
  };
  static_assert(kTokens == 16 * 8 && kThreads == 256, "the parts above cover the tile once");

  // This lane's weight tiles: warpgroup wg, block b, warp q -> tile tau0 + 4·(wg·kBlocks + b) + q.
  const int lane = tid & 31, q = (tid >> 5) & 3, wg = tid >> 7, g = lane >> 2, t = lane & 3;
  const auto tiling = static_cast<nvfp4_mma::Tiling>(p.w.layout);
  const int chunks = k / kK;
  const int64_t nk = int64_t{n} * k;
  const uint8_t* wq = p.w.w + static_cast<int64_t>(e) * (nk / 2);
  const uint8_t* ws = p.w.w_scale + static_cast<int64_t>(e) * (nk / 16);
  const int tau0 = nt * 8 * kBlocks;
  int tau[kBlocks];
  const uint8_t* sc_g[kBlocks];
  const uint8_t* sc_g8[kBlocks];
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    tau[b] = tau0 + 4 * (wg * kBlocks + b) + q;
    sc_g[b] = ws + nvfp4_mma::tile_row(tau[b], g, n, tiling) * (k / 16) + 2 * t;
    sc_g8[b] = ws + nvfp4_mma::tile_row(tau[b], g + 8, n, tiling) * (k / 16) + 2 * t;
  }
  auto load_weights = [&](int ks, LaneWeights (&lw)[kBlocks]) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const uint8_t* chunk =
          wq + (int64_t{tau[b]} * chunks + ks) * nvfp4_mma::kChunkBytes;
      lw[b] = load_lane_weights(chunk, sc_g[b] + ks * 8, sc_g8[b] + ks * 8, lane);
    }
  };

  float acc[kBlocks][64];
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[b][i] = 0.0f;
  }
  uint32_t a_regs[2][kBlocks][4];  // k-steps of even / odd index
  LaneWeights cur[kBlocks] = {}, next[kBlocks] = {};

#pragma unroll
  for (int part = 0; part < 8; ++part) load_token_part(0, 0, part);
  cp_async_commit();
  if (1 < chunks) {
#pragma unroll
    for (int part = 0; part < 8; ++part) load_token_part(1, 1, part);
  }
  cp_async_commit();
  load_weights(0, cur);
  HalfScales sc[kBlocks];  // the scales of the half stage being converted
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    sc[b] = half_scales(cur[b], 0);
    a_registers(cur[b], 0, sc[b], a_regs[0][b]);
  }
  cp_async_wait<1>();  // stage 0 landed (stage 1 may be in flight)
  wgmma::fence_proxy_async_smem();
  __syncthreads();

  for (int ks = 0; ks < chunks; ++ks) {
    // Slot ks % 4 was made visible by the barrier in k-step 6 of the stage before (or above).
    const uint32_t b_tile = ring + (ks % kSlots) * wgmma::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      wgmma::fence();
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        wgmma::fence_operands(acc[b]);
        wgmma::m64n128k16_rs(acc[b], a_regs[kk & 1][b],
                             wgmma::sw128_desc(b_tile + wgmma::k_step_offset(kk)));
      }
      wgmma::commit();
      // Copies go out while the k-step just issued runs: an eighth of stage ks + 2's token
      // tile per k-step, one commit group per stage; the next stage's weights in k-step 0.
      if (ks + 2 < chunks) load_token_part((ks + 2) % kSlots, ks + 2, kk);
      if (kk == kK / 16 - 1) cp_async_commit();
      if (kk == 0 && ks + 1 < chunks) load_weights(ks + 1, next);
      if (kk == kK / 16 - 2 && ks + 1 < chunks) {
        // Stage ks + 1's group (committed in the last k-step of stage ks - 1, seven k-steps ago)
        // has landed; the barrier makes it visible to both warpgroups' wgmmas. It is taken with
        // this stage's last k-steps still queued on the tensor cores, so they do not drain at
        // the stage boundary.
        cp_async_wait<0>();
        wgmma::fence_proxy_async_smem();
        __syncthreads();
      }
      wgmma::wait<1>();
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        wgmma::fence_operands(acc[b]);
        if (kk + 1 < kK / 16) {
          if (kk + 1 == 4) sc[b] = half_scales(cur[b], 1);
          a_registers(cur[b], kk + 1, sc[b], a_regs[(kk + 1) & 1][b]);
        } else if (ks + 1 < chunks) {
          sc[b] = half_scales(next[b], 0);
          a_registers(next[b], 0, sc[b], a_regs[0][b]);
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) cur[b] = next[b];
  }
  wgmma::wait<0>();
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) wgmma::fence_operands(acc[b]);
  cp_async_wait<0>();

  // Epilogue: acc[b][4j + 2h + c] = (tile row g + 8h of tau[b], token 8j + 2t + c).
  // The A registers carry the weights x 2^-14 (a_registers).
  const float global = (p.w.w_global != nullptr ? p.w.w_global[e] : 1.0f) * 16384.0f;
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 8 * j + 2 * t + c;
        if (tok >= rows) continue;
        const int64_t out_row = int64_t{row_begin} + tok;
        if constexpr (EP == GroupedEpilogue::kSwigluBf16) {
          const float gate = acc[b][4 * j + c] * global, up = acc[b][4 * j + 2 + c] * global;
          int col = 8 * tau[b] + g;
          if (p.act_in_k_order) col = (col & ~127) + nvfp4_mma::k_order_position(col & 127);
          p.act[out_row * p.ldact + col] = __bfloat16_as_ushort(
              __float2bfloat16_rn(grouped::swiglu_oai(gate, up, p.alpha, p.limit)));
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t wrow = nvfp4_mma::tile_row(tau[b], g + 8 * h, n, tiling);
            p.y[out_row * p.ldy + wrow] = acc[b][4 * j + 2 * h + c] * global;
          }
        }
      }
    }
  }
#else
  __trap();  // wgmma needs sm_90a; the launcher refuses other devices
#endif
}

template <int kBlocks, GroupedEpilogue EP, bool kAInKOrder>
Status launch_typed(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(grouped_expert_gemm_wgmma_rs_kernel<kBlocks, EP, kAInKOrder>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  M3_CUDA_RETURN_IF_ERROR(attr);
  const int64_t n_tiles = p.w.n / (128 * kBlocks);
  const int64_t m_tiles = grouped_expert_gemm_max_row_tiles(p.max_rows, p.num_experts);
  if (m_tiles > 65535 || n_tiles > 65535)
    return invalid_argument("[cuda.grouped_expert_gemm] grid too large: " +
                            std::to_string(m_tiles) + " row tiles");
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles));
  grouped_expert_gemm_wgmma_rs_kernel<kBlocks, EP, kAInKOrder>
      <<<grid, kThreads, kSmemBytes, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR((grouped_expert_gemm_wgmma_rs_kernel<kBlocks, EP, kAInKOrder>));
  return Status::ok();
}

template <int kBlocks, GroupedEpilogue EP>
Status launch_for_order(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  return p.a_in_k_order ? launch_typed<kBlocks, EP, true>(p, stream)
                        : launch_typed<kBlocks, EP, false>(p, stream);
}

template <int kBlocks>
Status launch_for_epilogue(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  return p.epilogue == GroupedEpilogue::kSwigluBf16
             ? launch_for_order<kBlocks, GroupedEpilogue::kSwigluBf16>(p, stream)
             : launch_for_order<kBlocks, GroupedEpilogue::kStoreF32>(p, stream);
}

// Two 64-row blocks per warpgroup where N allows (half the activation traffic per multiply-add).
Status launch_for_blocks(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  return p.w.n % 256 == 0 ? launch_for_epilogue<2>(p, stream) : launch_for_epilogue<1>(p, stream);
}

}  // namespace

Status launch_grouped_expert_gemm_wgmma_rs(const GroupedExpertGemmParams& p,
                                           CUstream_st* stream) {
  if (!grouped_expert_gemm_register_weights_fit(p.w, p.epilogue))
    return invalid_argument(
        "[cuda.grouped_expert_gemm] unsupported weights for the register-weights kernel "
        "(NVFP4 in the mma layout of the epilogue only): format " +
        std::to_string(static_cast<int>(p.w.format)) + ", layout " +
        std::to_string(static_cast<int>(p.w.layout)));
  int dev = 0, major = 0, minor = 0;
  M3_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  M3_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return invalid_argument("[cuda.grouped_expert_gemm] the wgmma kernels need an sm_90 GPU "
                            "(H100/H200), this device is sm_" +
                            std::to_string(major) + std::to_string(minor));
  return launch_for_blocks(p, stream);
}

}  // namespace m3::cuda

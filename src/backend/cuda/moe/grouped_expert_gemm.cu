// The grouped expert GEMM (grouped_expert_gemm.h): routing tile schedule, device-counted row
// inversion, and the dequantise-in-the-main-loop mma.sync kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/moe/grouped_expert_stage.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {
namespace {

using grouped::kBK;
using grouped::kBM;
using grouped::kBN;
constexpr int kThreads = 256;        // 8 warps: 2 along M (64 rows) x 4 along N (32 columns)
constexpr int kTileRowBytes = kBK * 2;          // one bf16 row of a 128-column stage
constexpr int kTileBytes = kBM * kTileRowBytes;  // 32 KB (A stage, or the bf16 weight tile)

// Ring geometry of this kernel on top of the format's stage geometry.
template <QuantFormat F>
struct Fmt : grouped::StageGeometry<F> {
  using Base = grouped::StageGeometry<F>;
  // Ring slots: the stage being multiplied, the one being dequantised, the one being loaded.
  static constexpr int kStages = 3;
  static constexpr int kStageBytes = kTileBytes + Base::kRawBytes + Base::kScaleBytes;
  // + two bf16 weight tiles (multiplied / being written) + the row tables.
  static constexpr int kSmemBytes = kStages * kStageBytes + 2 * kTileBytes + 2 * kBM * 4;
  static_assert(kSmemBytes <= 232448, "more shared memory than an H100/H200 SM offers");
  static_assert(kStageBytes % 128 == 0, "stage alignment");
};

// Byte offset of (row r, 16-byte chunk c) in a 256-byte-row bf16 tile, XOR-swizzled so that the
// 8 rows an ldmatrix phase reads hit 8 different 16-byte bank groups.
__device__ __forceinline__ int tile_off(int r, int c) {
  return r * kTileRowBytes + ((c ^ (r & 7)) << 4);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Local weight row lr (0..127) of column tile nt -> the matrix row. SwiGLU: within each warp's 32
// local rows, 16 gate rows then the 16 matching up rows, so a thread's accumulators for gate
// column j and up column j sit in n8 tiles t and t + 2 of the same warp.
template <GroupedEpilogue EP>
__device__ __forceinline__ int weight_row(int lr, int nt, int n) {
  if constexpr (EP == GroupedEpilogue::kSwigluBf16) {
    const int j = nt * (kBN / 2) + (lr >> 5) * 16 + (lr & 15);
    return (lr & 16) ? n / 2 + j : j;
  } else {
    return nt * kBN + lr;
  }
}

template <QuantFormat F, GroupedEpilogue EP>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_expert_gemm_kernel(GroupedExpertGemmParams p) {
  using G = Fmt<F>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* wtiles = smem + G::kStages * G::kStageBytes;  // 2 x bf16 weights [kBN][kBK]
  int32_t* a_src = reinterpret_cast<int32_t*>(wtiles + 2 * kTileBytes);  // [kBM] x row, -1 none
  int32_t* w_row = a_src + kBM;                                     // [kBN] weight row

  const int E = static_cast<int>(p.num_experts);
  const int mt = blockIdx.y, nt = blockIdx.x;
  if (mt >= p.tile_offsets[E]) return;  // past the routed rows
  const grouped::RowTile tile = grouped::row_tile(p, mt);
  const int e = tile.e, row_begin = tile.row_begin, rows = tile.rows;

  const int n = static_cast<int>(p.w.n), k = static_cast<int>(p.w.k);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tiling = static_cast<int>(p.w.layout);
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
  wsrc.tiling = tiling;
  wsrc.tau0 = nt * 8;  // mma layouts: the CTA's 8 tiles of 16 rows (both tilings)
  const float global = (G::kNv && p.w.w_global != nullptr) ? p.w.w_global[e] : 1.0f;
  const int k_stages = wsrc.k_stages;

  auto load_stage = [&](int slot, int ks) {
    uint8_t* st = smem + slot * G::kStageBytes;
    const uint32_t a_s = smem_u32(st);
    // Activations: 128 rows x 16 chunks of 16 bytes.
#pragma unroll
    for (int i = 0; i < kBM * 16 / kThreads; ++i) {
      const int idx = tid + i * kThreads, r = idx >> 4, c = idx & 15;
      const int32_t src = a_src[r];
      const uint16_t* g = src >= 0 ? p.a + int64_t{src} * p.lda + ks * kBK + c * 8 : p.a;
      cp_async16(a_s + tile_off(r, c), g, src >= 0 ? 16 : 0);
    }
    // Weight codes and block scales.
    grouped::load_stage_weights<F, kThreads>(a_s + kTileBytes, wsrc, ks, tid);
  };

  // The stage's quantised weights -> bf16 wtile[n][k] (swizzled). Each thread converts 4 groups of
  // 16 consecutive columns of one row.
  auto dequant_stage = [&](int slot, uint8_t* wtile) {
    const uint8_t* raw = smem + slot * G::kStageBytes + kTileBytes;
#pragma unroll
    for (int q = 0; q < kBN * (kBK / 16) / kThreads; ++q) {
      const int gi = tid + q * kThreads, lr = gi >> 3, cg = gi & 7;
      uint32_t o[8];
      grouped::dequant16<F>(raw, wsrc, lr, cg, o);
      *reinterpret_cast<uint4*>(wtile + tile_off(lr, 2 * cg)) = make_uint4(o[0], o[1], o[2], o[3]);
      *reinterpret_cast<uint4*>(wtile + tile_off(lr, 2 * cg + 1)) =
          make_uint4(o[4], o[5], o[6], o[7]);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  const int wm = warp & 1, wn = warp >> 1;

  // Pipeline, one barrier per stage: in iteration ks the CTA multiplies stage ks (A in its ring
  // slot, weights already bf16 in wtiles[ks & 1]) and dequantises stage ks + 1 into the other
  // tile, while stage ks + 2 is in flight. Warps drift between the two phases, so the
  // conversion's ALU work and the tensor-core work of different warps overlap.
  static_assert(G::kStages == 3, "the wait counts below assume 3 ring slots");
  load_stage(0, 0);
  cp_async_commit();
  if (1 < k_stages) load_stage(1, 1);
  cp_async_commit();
  cp_async_wait<1>();  // stage 0
  __syncthreads();
  dequant_stage(0, wtiles);
  for (int ks = 0; ks < k_stages; ++ks) {
    const int slot = ks % G::kStages;
    // Committed groups: stages 0 .. ks + 1. Wait for stage ks + 1 (all of them).
    cp_async_wait<0>();
    // Stage ks + 1 visible; wtiles[ks & 1] complete; every warp done with iteration ks - 1
    // (its A slot, (ks + 2) % 3, and wtiles[(ks + 1) & 1] are free).
    __syncthreads();
    if (ks + 2 < k_stages) load_stage((ks + 2) % G::kStages, ks + 2);
    cp_async_commit();
    if (ks + 1 < k_stages)
      dequant_stage((ks + 1) % G::kStages, wtiles + ((ks + 1) & 1) * kTileBytes);
    const uint32_t wt_s = smem_u32(wtiles + (ks & 1) * kTileBytes);
    const uint32_t a_s = smem_u32(smem + slot * G::kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        // x4: rows 0-7 / 8-15 at k 0-7, then rows 0-7 / 8-15 at k 8-15 = a0, a1, a2, a3.
        const int r = wm * 64 + mi * 16 + (lane & 15);
        ldmatrix_x4(a_s + tile_off(r, kk * 2 + (lane >> 4)), af[mi]);
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        // x4 over W[n][k]: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
        // = b0, b1 of n8 tile 2np, then b0, b1 of tile 2np + 1.
        const int r = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t t4[4];
        ldmatrix_x4(wt_s + tile_off(r, kk * 2 + ((lane >> 3) & 1)), t4);
        bf[2 * np][0] = t4[0], bf[2 * np][1] = t4[1];
        bf[2 * np + 1][0] = t4[2], bf[2 * np + 1][1] = t4[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_bf16(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  }
  cp_async_wait<0>();

  // Epilogue. Accumulator (mi, ni): c0, c1 at row g, columns 2t, 2t + 1; c2, c3 at row g + 8.
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = wm * 64 + mi * 16 + g + 8 * hh;
      if (r >= rows) continue;
      const int64_t out_row = int64_t{row_begin} + r;
      if constexpr (EP == GroupedEpilogue::kSwigluBf16) {
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          const int j = nt * (kBN / 2) + wn * 16 + ni * 8 + 2 * t;
          const float g0 = acc[mi][ni][2 * hh] * global, g1 = acc[mi][ni][2 * hh + 1] * global;
          const float u0 = acc[mi][ni + 2][2 * hh] * global;
          const float u1 = acc[mi][ni + 2][2 * hh + 1] * global;
          const __nv_bfloat162 v = __floats2bfloat162_rn(grouped::swiglu_oai(g0, u0, p.alpha, p.limit),
                                                         grouped::swiglu_oai(g1, u1, p.alpha, p.limit));
          *reinterpret_cast<__nv_bfloat162*>(p.act + out_row * p.ldact + j) = v;
        }
      } else {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const int col = nt * kBN + wn * 32 + ni * 8 + 2 * t;
          *reinterpret_cast<float2*>(p.y + out_row * p.ldy + col) =
              make_float2(acc[mi][ni][2 * hh] * global, acc[mi][ni][2 * hh + 1] * global);
        }
      }
    }
  }
}

// One thread: E is small (128) and the kernel runs once per layer.
__global__ void moe_tile_schedule_kernel(const int32_t* __restrict__ off, int num_experts,
                                         int32_t* __restrict__ tile_off) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int32_t acc = 0;
  tile_off[0] = 0;
  for (int e = 0; e < num_experts; ++e) {
    acc += (off[e + 1] - off[e] + kBM - 1) / kBM;
    tile_off[e + 1] = acc;
  }
}

__global__ void invert_rows_counted_kernel(const int32_t* __restrict__ sorted_rows,
                                           const int32_t* __restrict__ count, int64_t max_rows,
                                           int32_t* __restrict__ inv) {
  const int64_t c = *count, n = c < max_rows ? c : max_rows;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    inv[sorted_rows[i]] = static_cast<int32_t>(i);
}

template <QuantFormat F, GroupedEpilogue EP>
Status launch_typed(const GroupedExpertGemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = Fmt<F>::kSmemBytes;
  // Opt in once per instantiation (not a stream operation, but kept out of graph captures after
  // the first call).
  static const cudaError_t attr = cudaFuncSetAttribute(
      grouped_expert_gemm_kernel<F, EP>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  M3_CUDA_RETURN_IF_ERROR(attr);
  // SwiGLU: N / 128 tiles of 64 gate + 64 up columns; store: N / 128 tiles of 128 columns.
  const int64_t n_tiles = p.w.n / kBN;
  const int64_t m_tiles = grouped_expert_gemm_max_row_tiles(p.max_rows, p.num_experts);
  if (m_tiles > 65535 || n_tiles > 65535)
    return invalid_argument("[cuda.grouped_expert_gemm] grid too large: " +
                            std::to_string(m_tiles) + " row tiles");
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(m_tiles));
  grouped_expert_gemm_kernel<F, EP><<<grid, kThreads, kSmem, stream>>>(p);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR((grouped_expert_gemm_kernel<F, EP>));
  return Status::ok();
}

}  // namespace

Status launch_grouped_expert_gemm(const GroupedExpertGemmParams& p, CUstream_st* stream) {
  if (p.max_rows == 0 || p.num_experts == 0) return Status::ok();
  if (!grouped_expert_gemm_fits(p.w, p.epilogue))
    return invalid_argument("[cuda.grouped_expert_gemm] unsupported weights: format " +
                            std::to_string(static_cast<int>(p.w.format)) + ", layout " +
                            std::to_string(static_cast<int>(p.w.layout)) + ", N " +
                            std::to_string(p.w.n) + ", K " + std::to_string(p.w.k));
  if (p.lda < p.w.k || p.lda % 8 != 0)
    return invalid_argument("[cuda.grouped_expert_gemm] lda must be >= K and a multiple of 8");
  if (p.max_rows > INT32_MAX / 2 || p.num_experts > 65535)
    return invalid_argument("[cuda.grouped_expert_gemm] too many rows or experts");
  const bool swiglu = p.epilogue == GroupedEpilogue::kSwigluBf16;
  if (swiglu ? (p.act == nullptr || p.ldact < p.w.n / 2 || p.ldact % 2 != 0)
             : (p.y == nullptr || p.ldy < p.w.n || p.ldy % 2 != 0))
    return invalid_argument("[cuda.grouped_expert_gemm] output missing or its stride too small");
  if ((p.a_in_k_order || p.act_in_k_order) &&
      p.kernel != GroupedExpertKernel::kWgmmaRegisterWeights)
    return invalid_argument("[cuda.grouped_expert_gemm] a_in_k_order / act_in_k_order are for the "
                            "register-weights kernel only");
  if (p.act_in_k_order && (!swiglu || (p.w.n / 2) % 128 != 0))
    return invalid_argument("[cuda.grouped_expert_gemm] act_in_k_order needs the SwiGLU "
                            "epilogue and N / 2 a multiple of 128");
  if (p.kernel == GroupedExpertKernel::kWgmma) return launch_grouped_expert_gemm_wgmma(p, stream);
  if (p.kernel == GroupedExpertKernel::kWgmmaRegisterWeights)
    return launch_grouped_expert_gemm_wgmma_rs(p, stream);
  if (p.kernel != GroupedExpertKernel::kMmaSync)
    return invalid_argument("[cuda.grouped_expert_gemm] unknown kernel " +
                            std::to_string(static_cast<int>(p.kernel)));
  if (p.w.format == QuantFormat::kNvfp4) {
    return swiglu ? launch_typed<QuantFormat::kNvfp4, GroupedEpilogue::kSwigluBf16>(p, stream)
                  : launch_typed<QuantFormat::kNvfp4, GroupedEpilogue::kStoreF32>(p, stream);
  }
  return swiglu ? launch_typed<QuantFormat::kMxfp8, GroupedEpilogue::kSwigluBf16>(p, stream)
                : launch_typed<QuantFormat::kMxfp8, GroupedEpilogue::kStoreF32>(p, stream);
}

namespace {
// One thread per column pair: a warp reads 128 contiguous bytes of a row.
__global__ void to_k_order_kernel(const uint32_t* __restrict__ x, int64_t ldx2, int64_t rows,
                                  int64_t pairs, uint32_t* __restrict__ out, int64_t ldout2) {
  const int64_t n = rows * pairs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / pairs, m = i % pairs;
    const int64_t chunk = m / 64, p = 2 * (m % 64);
    out[r * ldout2 + chunk * 64 + nvfp4_mma::k_order_position(static_cast<int>(p)) / 2] =
        x[r * ldx2 + m];
  }
}
}  // namespace

Status launch_to_k_order(const uint16_t* x, int64_t ldx, int64_t rows, int64_t cols,
                         uint16_t* out, int64_t ldout, CUstream_st* stream) {
  if (cols % 128 != 0 || ldx % 2 != 0 || ldout % 2 != 0 || ldx < cols || ldout < cols)
    return invalid_argument("[cuda.to_k_order] cols must be a multiple of 128 and the strides "
                            "even and >= cols");
  if (rows == 0) return Status::ok();
  const int64_t work = rows * (cols / 2);
  const int64_t blocks = std::min<int64_t>((work + 255) / 256, 65535 * 8);
  to_k_order_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(x), ldx / 2, rows, cols / 2,
      reinterpret_cast<uint32_t*>(out), ldout / 2);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(to_k_order_kernel);
  return Status::ok();
}

Status launch_moe_tile_schedule(const int32_t* group_offsets, int64_t num_experts,
                                int32_t* tile_offsets, CUstream_st* stream) {
  moe_tile_schedule_kernel<<<1, 32, 0, stream>>>(group_offsets, static_cast<int>(num_experts),
                                                 tile_offsets);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(moe_tile_schedule_kernel);
  return Status::ok();
}

Status launch_invert_rows_counted(const int32_t* sorted_rows, const int32_t* group_offsets,
                                  int64_t num_experts, int64_t max_rows, int32_t* inv,
                                  CUstream_st* stream) {
  if (max_rows == 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((max_rows + 255) / 256, 4096);
  invert_rows_counted_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      sorted_rows, group_offsets + num_experts, max_rows, inv);
  M3_CUDA_RETURN_IF_LAUNCH_ERROR(invert_rows_counted_kernel);
  return Status::ok();
}

}  // namespace m3::cuda

// GEMV variant 6: a persistent, mbarrier-pipelined tensor-core GEMV for 1..8 activation rows per
// group (batch-1 and small-batch decode). Written after ncu showed variant 5 (quant_gemv_mma.cuh)
// at ~41 % of HBM for the NVFP4 experts at batch 1, to test whether short-lived CTAs (one 16-row
// tile each: a pipeline fill and an exit per tile, per-lane cp.async addressing) were what held
// it back. Measured on the H200: no; at batch 1 it is between 6 %
// faster and 32 % slower than the best other variant per matrix, and slower
// inside the model, where its one-CTA-per-SM launches cannot overlap the shared expert's stream.
// It stays selectable
// (QuantGemvParams::variant = 6, CudaM3Options::decode_gemv_variant = 6) and tested, as the base
// for weight streaming under programmatic dependent launch.
//
// Shape of the kernel. One CTA per SM for the whole launch, 16 consumer warps and 1 producer warp.
//  * Work: items = (group with rows, 16-row tile), groups in slot order, tiles ascending; CTA c
//    takes the contiguous items [c·I/C, (c+1)·I/C). Groups (experts) are read on the device, so a
//    captured graph serves any routing.
//  * The producer warp streams every item's weights stage by stage (16 tile rows x 1024 MXFP8 /
//    2048 NVFP4 elements and their block scales) into a ring of shared-memory slots, each with a
//    "full" and an "empty" mbarrier. NVFP4 in the mma layout (quant/nvfp4_mma_layout.h) is one
//    contiguous bulk copy per stage (cp.async.bulk, L2 evict-first); MXFP8 rows and all scales go
//    by 16-byte cp.async (lanes 2r, 2r + 1 fill row r's 32-byte sectors), counted on the same
//    mbarrier by cp.async.mbarrier.arrive.noinc. (Bulk copies cost ~85 cycles each whatever their
//    size: one per row and per scale row streamed at 0.76 TB/s.)
//  * The consumer warps split each stage's units (NVFP4: one 128-element chunk each; MXFP8: two
//    32-element blocks each), dequantise into mma.m16n8k16 A fragments exactly as variant 5 does
//    (same k orders, same exact f16 products; four accumulation chains), release the slot and
//    keep per-warp partial fragments. At an item's end the partial fragments are summed in warp
//    order through shared memory (deterministic) and one warp (rotating) stores the result with
//    variant 5's epilogue.
//  * Activations: the group's rows (<= 8, the f16 form of x_f16.h) are copied into shared memory
//    when the group changes, so the mma's B operand is a shared-memory read; MXFP8 rows sit 1056
//    bytes apart, scale rows 48 / 144 bytes, so that a quarter-warp's reads hit distinct banks.
//  * Programmatic dependent launch: dense launches stream weights before griddepcontrol.wait
//    (weights are never written by earlier kernels); activations, groups and outputs are touched
//    after it. The ring leaves 40 KB of shared memory for the kernel before it.
// Requirements (quant_gemv_stream_fits): K % 512 (MXFP8) / K % 256 (NVFP4, mma layout), N % 16 ==
// 0, at most 8 rows per group, 16-byte aligned xh rows, weights and scales.
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/gemm/quant_gemv_mma.cuh"
#include "backend/cuda/runtime/mbarrier.cuh"
#include "backend/cuda/runtime/pdl.cuh"

namespace m3::cuda::gemv {

constexpr int kStreamConsumers = 16;
constexpr int kStreamThreads = 32 * (kStreamConsumers + 1);
constexpr int kStreamMaxRows = 8;  // rows per group (one n = 8 mma column block)

// A stage: 16 tile rows x kStageK elements and their scales. Producer lane l copies tile row
// l / 2, alternate 16-byte pieces (lanes 2r, 2r + 1 fill whole 32-byte sectors). Row and scale
// strides in shared memory keep a consumer quarter-warp's reads on distinct banks.
template <QuantFormat F>
struct StreamTraits;
template <>
struct StreamTraits<QuantFormat::kMxfp8> {
  static constexpr int kStageK = 1024;                    // 32 scale blocks: 2 per consumer warp
  static constexpr int kUnitK = 32;                       // a unit: one scale block
  static constexpr int kRowBytes = 1024;                  // a tile row's codes per stage
  static constexpr int kRowStride = 1056;                 // (row g: bank 8g)
  static constexpr int kWeightBytes = 16 * kRowStride;
  static constexpr int kScaleRow = 32;                    // E8M0 bytes per row per stage
  static constexpr int kScaleStride = 48;                 // (row g: bank 12g)
};
template <>
struct StreamTraits<QuantFormat::kNvfp4> {                // the mma layout only
  static constexpr int kStageK = 2048;                    // 16 chunks of 128: 1 per warp
  static constexpr int kUnitK = 128;                      // a unit: one (tile, chunk) block
  static constexpr int kWeightBytes = 16 * 1024;          // 16 contiguous (tile, chunk) blocks
  static constexpr int kScaleRow = 128;
  static constexpr int kScaleStride = 144;                // (row g: bank 4g)
};
template <QuantFormat F>
constexpr int stream_slot_bytes() {
  return StreamTraits<F>::kWeightBytes + 16 * StreamTraits<F>::kScaleStride;
}
constexpr int kStreamRedBytes = 2 * kStreamConsumers * 32 * 16;  // fragment sums, 2 items
// Bytes of one activation row in shared memory (K f16 + 64: rows of a quarter-warp on other banks).
__host__ __device__ inline int64_t stream_act_stride(int64_t k) { return 2 * k + 64; }

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kStreamConsumers) : "memory");
}

// One lane's MXFP8 scale block (variant 6; variant 5's k order within a block): the 8 codes of row g (`lo`) and of row g + 8 (`hi`) at
// elements 8t .. 8t + 7, the activations `xv` (f16) of the same elements and the block's E8M0
// factors; both k-steps into a zeroed fragment, which is added to acc scaled in f32.
__device__ __forceinline__ void stream_mxfp8_block(uint2 lo, uint2 hi, uint4 xv, float f_lo,
                                                   float f_hi, float (&acc)[4]) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma_f16(d, e4m3x2_to_f16x2(lo.x), e4m3x2_to_f16x2(hi.x), e4m3x2_to_f16x2(lo.x >> 16),
          e4m3x2_to_f16x2(hi.x >> 16), xv.x, xv.y);
  mma_f16(d, e4m3x2_to_f16x2(lo.y), e4m3x2_to_f16x2(hi.y), e4m3x2_to_f16x2(lo.y >> 16),
          e4m3x2_to_f16x2(hi.y >> 16), xv.z, xv.w);
  acc[0] = fmaf(d[0], f_lo, acc[0]);
  acc[1] = fmaf(d[1], f_lo, acc[1]);
  acc[2] = fmaf(d[2], f_hi, acc[2]);
  acc[3] = fmaf(d[3], f_hi, acc[3]);
}

// One warp's NVFP4 step of a stage in shared memory (the mma layout; variant 6): chunk `ci` of the stage `sp` (1 KB, 128 K x 16 rows) with
// its block scales in `sc` (rows `scale_stride` bytes apart, 8 bytes per chunk) against the
// activation row(s) `xr` (f16; chunk c of the row = elements 128c ..), c the chunk's index in
// K. This lane's 8 words (k-steps 0..7; halves swapped for lanes with bit 2 set) are dequantised
// exactly as variant 5 does into four accumulation chains.
__device__ __forceinline__ void stream_nvfp4_chunk(const uint8_t* sp, const uint8_t* sc,
                                                   const uint8_t* xr, int c, int ci, int lane,
                                                   int scale_stride, float (&acc)[4][4]) {
  const int g = lane >> 2, t = lane & 3;
  uint32_t wv[8];
  nvfp4_lane_words(sp + ci * 1024, lane, wv);
  uint32_t sl0, sl1, sh0, sh1;
  nvfp4_lane_scales(sc + ci * 8, g, t, &sl0, &sl1, &sh0, &sh1, scale_stride);
  uint4 xc[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    xc[q] = *reinterpret_cast<const uint4*>(xr + 2 * (c * 128 + 32 * t + 8 * q));
  nvfp4_chunk_mma(wv, sl0, sl1, sh0, sh1, xc, [&](int i) -> float(&)[4] { return acc[i % 4]; });
}

// ring: slots in the pipeline; cap: activation rows held per group (<= 8).
template <QuantFormat F>
__global__ void __launch_bounds__(kStreamThreads, 1)
    quant_gemv_stream_kernel(QuantGemvParams p, int ring, int cap) {
  using S = StreamTraits<F>;
  constexpr int kSlot = stream_slot_bytes<F>();
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
  // Stages per item; the last may hold fewer units (K % 512 / K % 256: whole 16-byte pieces).
  const int units = k / S::kUnitK;
  constexpr int kStageUnits = S::kStageK / S::kUnitK;
  const int stages = (units + kStageUnits - 1) / kStageUnits;
  const int tiles = n / 16;
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  const int64_t act_stride = stream_act_stride(k);
  uint8_t* act = smem + int64_t{ring} * kSlot;
  float4* red = reinterpret_cast<float4*>(act + cap * act_stride);
  const uint32_t full0 = smem_u32(reinterpret_cast<uint8_t*>(red) + kStreamRedBytes);
  const uint32_t empty0 = full0 + 8 * ring;

  if (threadIdx.x == 0) {
    for (int i = 0; i < ring; ++i) {
      mbar_init(full0 + 8 * i, 1 + 32);  // lane 0's arrive + the 32 lanes' cp.async arrivals
      mbar_init(empty0 + 8 * i, kStreamConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  // Groups with rows (their slots come first in active_groups, then -1).
  int groups = 1;
  if (p.group_offsets != nullptr) {
    pdl_wait();  // the routing comes from the previous kernel
    groups = 0;
    while (groups < p.num_slots && p.active_groups[groups] >= 0) ++groups;
  }
  const int64_t items = int64_t{groups} * tiles;
  const int it_begin = static_cast<int>(items * blockIdx.x / gridDim.x);
  const int it_end = static_cast<int>(items * (blockIdx.x + 1) / gridDim.x);
  auto group_of = [&](int it) -> int64_t {
    return p.group_offsets ? p.active_groups[it / tiles] : 0;
  };
  // Tile row r (0..15) of tile `tile` -> weight row (SwiGLU: gate rows i0 + r, up N/2 + i0 + r - 8).
  auto weight_row = [&](int tile, int r) {
    return swiglu ? (r >> 3 ? n / 2 : 0) + tile * 8 + (r & 7) : tile * 16 + r;
  };

  if (warp == kStreamConsumers) {
    // ---- Producer: every stage of every item, in order, into the ring. Bulk copies cost ~85
    // cycles each whatever their size (H200: 16 row copies + 16 scale copies per 8-KB stage
    // streamed at 0.76 TB/s), so only whole contiguous stages (NVFP4 in the mma layout) go by
    // one bulk copy; rows and scales go by 16-byte cp.async, counted on the same mbarrier
    // (cp.async.mbarrier.arrive.noinc: each lane arrives once its copies have landed).
    const uint64_t pol = l2_evict_first();
    const int64_t row_bytes = F == QuantFormat::kMxfp8 ? k : k / 2;
    const int64_t scale_cols = F == QuantFormat::kMxfp8 ? k / 32 : k / 16;
    const int r = lane >> 1, h = 16 * (lane & 1);
    int slot = 0;
    uint32_t phase = 0;
    for (int it = it_begin; it < it_end; ++it) {
      const int64_t grp = group_of(it);
      const int tile = it % tiles;
      const int64_t row = weight_row(tile, r);
      const uint8_t* wg = p.w + grp * n * row_bytes;
      const uint8_t* wsrc = wg + row * row_bytes;
      const uint8_t* ssrc = p.w_scale + (grp * n + row) * scale_cols;
      for (int st = 0; st < stages; ++st) {
        mbar_wait(empty0 + 8 * slot, phase ^ 1);
        const uint32_t bar = full0 + 8 * slot;
        const uint32_t dst = smem_u32(smem + slot * kSlot);
        const int valid = min(kStageUnits, units - st * kStageUnits);
        if constexpr (F == QuantFormat::kMxfp8) {
          if (lane == 0) mbar_arrive(bar);
          const uint8_t* src = wsrc + int64_t{st} * S::kRowBytes;
          const uint32_t d = dst + r * S::kRowStride;
#pragma unroll 8
          for (int o = h; o < 32 * valid; o += 32) cp_async16(d + o, src + o, 16);
        } else if (lane == 0) {  // the mma layout: the tile's chunks are 1-KB blocks in order
          mbar_expect_tx(bar, 1024 * valid);
          bulk_copy(dst, wg + (int64_t{tile} * units + int64_t{st} * kStageUnits) * 1024,
                    1024 * valid, bar, pol);
        }
        // Scales: MXFP8 one byte per unit, NVFP4 eight.
        const int sbytes = F == QuantFormat::kMxfp8 ? valid : 8 * valid;
        const uint8_t* src = ssrc + int64_t{st} * S::kScaleRow;
        const uint32_t d = dst + S::kWeightBytes + r * S::kScaleStride;
        for (int o = h; o < sbytes; o += 32) cp_async16(d + o, src + o, 16);
        cp_async_mbar_arrive_noinc(bar);
        if (++slot == ring) slot = 0, phase ^= 1;
      }
    }
    return;
  }

  // ---- Consumers.
  const int g = lane >> 2, t = lane & 3;
  if (p.group_offsets == nullptr) pdl_wait();  // the activations come from the previous kernel
  int slot = 0;
  uint32_t phase = 0;
  int64_t cur = -1;
  int rows_here = 0;
  int64_t rid[2];  // this lane's epilogue tokens (mma_fragment_tokens), per group
  float fac[2];
  for (int it = it_begin; it < it_end; ++it) {
    const int64_t grp = group_of(it);
    const int tile = it % tiles;
    if (grp != cur) {
      // The group's activation rows -> shared memory. Every consumer warp is past the previous
      // item's barrier below, so none still reads the previous group's rows.
      const int r0 = p.group_offsets ? p.group_offsets[grp] : 0;
      const int r1 = p.group_offsets ? p.group_offsets[grp + 1] : static_cast<int>(p.num_rows);
      rows_here = min(r1 - r0, cap);
      const int per_row = k / 8;  // 16-byte pieces
      for (int i = threadIdx.x; i < rows_here * per_row; i += 32 * kStreamConsumers) {
        const int m = i / per_row, q = i % per_row;
        const int64_t rr = p.sorted_rows ? p.sorted_rows[r0 + m] : r0 + m;
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.xh + (rr / p.x_row_div) * p.ldx) + q);
        *reinterpret_cast<uint4*>(act + m * act_stride + 16 * q) = v;
      }
      mma_fragment_tokens<F>(p, lane, 0, rows_here, r0, grp, rid, fac);
      consumers_sync();
      cur = grp;
    }
    // This lane's B column: token g of the group (tokens past the rows read row 0; their
    // columns are not stored).
    const uint8_t* xr = act + (g < rows_here ? g : 0) * act_stride;
    float acc[4][4] = {};  // independent accumulation chains, summed at the item's end
    for (int st = 0; st < stages; ++st) {
      mbar_wait(full0 + 8 * slot, phase);
      const uint8_t* sp = smem + slot * kSlot;
      const uint8_t* sc = sp + S::kWeightBytes;
      const int valid = min(kStageUnits, units - st * kStageUnits);  // (warp-uniform skips)
      if constexpr (F == QuantFormat::kMxfp8) {
        // Blocks 2·warp and 2·warp + 1 of the stage (variant 5's k order within a block).
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
          const int j = 2 * warp + hb;
          if (j >= valid) break;
          const uint2 wl = *reinterpret_cast<const uint2*>(sp + g * S::kRowStride + 32 * j + 8 * t);
          const uint2 wh =
              *reinterpret_cast<const uint2*>(sp + (g + 8) * S::kRowStride + 32 * j + 8 * t);
          const uint4 xv =
              *reinterpret_cast<const uint4*>(xr + 2 * (st * S::kStageK + 32 * j + 8 * t));
          stream_mxfp8_block(wl, wh, xv, e8m0_exact(sc[g * S::kScaleStride + j]),
                             e8m0_exact(sc[(g + 8) * S::kScaleStride + j]), acc[hb]);
        }
      } else if (warp < valid) {
        stream_nvfp4_chunk(sp, sc, xr, st * 16 + warp, warp, lane, S::kScaleStride, acc);
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * slot);
      if (++slot == ring) slot = 0, phase ^= 1;
    }
    // The item's sum over the warps in warp order, then the epilogue by one (rotating) warp.
    // Two buffers: the next item's writes cannot race this item's reader (it passes the next
    // barrier only after its epilogue).
    const int par = (it - it_begin) & 1;
    float4 mine;
    mine.x = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
    mine.y = (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]);
    mine.z = (acc[0][2] + acc[1][2]) + (acc[2][2] + acc[3][2]);
    mine.w = (acc[0][3] + acc[1][3]) + (acc[2][3] + acc[3][3]);
    red[(par * kStreamConsumers + warp) * 32 + lane] = mine;
    consumers_sync();
    if (warp == (it - it_begin) % kStreamConsumers) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int w = 0; w < kStreamConsumers; ++w) {
        const float4 f = red[(par * kStreamConsumers + w) * 32 + lane];
        v[0] += f.x, v[1] += f.y, v[2] += f.z, v[3] += f.w;
      }
      mma_fragment_store(p, v, weight_row(tile, g), weight_row(tile, g + 8), rid, fac);
    }
  }
}

}  // namespace m3::cuda::gemv

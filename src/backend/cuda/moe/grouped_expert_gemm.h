// Grouped expert GEMM for prefill: all routed experts of a layer in one launch, with NVFP4 or
// MXFP8 weights dequantised inside the main loop (no BF16 copy of the weights in memory), driven
// by device-side per-expert row counts so that the host never waits (the whole routed-expert
// block can be captured in a CUDA graph).
//
//   C[off[e] + m, :] = A[row(e, m), :] · W_e^T · global_e      for m < off[e + 1] - off[e]
//
// Routing: launch_group_by_expert (quant_gemv.h) writes off[E + 1] and the routed rows sorted by
// expert; launch_moe_tile_schedule turns off[] into tile_off[E + 1] (expert e owns row tiles
// tile_off[e] .. tile_off[e + 1] - 1 of kGroupedTileM rows). The grid is sized for the worst
// case (grouped_expert_gemm_max_row_tiles: ceil(rows / BM) + E) and a CTA past tile_off[E]
// exits at once, so the launch needs no host-side count.
//
// Tiles: 128 gathered rows x 128 weight rows x 128 columns per stage, 8 warps (2 x 4) of
// mma.sync.m16n8k16 bf16 with float32 accumulation. Every stage copies the quantised weight bytes
// (4 or 8 bits per weight) and their block scales into shared memory with cp.async, several
// stages ahead, together with the bf16 activation rows (gathered through the row list: no
// gathered copy of x is made); the CTA then converts the stage's weights to bf16 in shared memory
// (exact: e2m1·e4m3 and e4m3·2^e are bf16 numbers, the same values launch_dequant_bf16 writes)
// one stage ahead of the multiplication (two bf16 weight tiles, one barrier per stage). The NVFP4 per-matrix multiplier is applied to the float32 sums in the epilogue (as
// cuBLASLt's alpha on the dequantise-then-cuBLASLt path).
//
// Epilogues: kSwigluBf16 (the gate|up matrix, N = 2·inter: a CTA owns 64 gate columns and the
// matching 64 up columns, and each warp holds gate column j and up column j in the same thread)
// writes act[off[e] + m, j] = bf16(SwiGLU-OAI(gate, up)); kStoreF32 writes y[off[e] + m, n].
// Output rows are in the sorted (expert-grouped) order; launch_moe_combine_sorted puts them back.
// Deterministic: every output element is produced by one thread, sums in a fixed order.
//
// Weight layouts: row-major (the checkpoint's), and the mma layouts of quant/nvfp4_mma_layout.h /
// quant/mxfp8_mma_layout.h whose 16-row tiles match the CTA's rows (kMmaSwigluPairs for the
// SwiGLU epilogue, kMmaRows16 for the store): a (tile, 128 columns) of those is one contiguous run.
//
// This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

constexpr int64_t kGroupedTileM = 128;  // gathered rows per CTA
constexpr int64_t kGroupedTileN = 128;  // weight rows per CTA (SwiGLU: 64 gate + 64 up)
constexpr int64_t kGroupedTileK = 128;  // columns per pipeline stage

enum class GroupedEpilogue : int { kSwigluBf16 = 0, kStoreF32 = 1 };

// The main loop. kMmaSync: the kernel described above. kWgmma (grouped_expert_gemm_wgmma.cu,
// Hopper only): the same tiles, stages, dequantisation and epilogues, multiplied by two
// warpgroups with wgmma.mma_async (A and B read from 128-byte-swizzled shared memory), the
// conversion of the next stage overlapping the asynchronous multiplication of the current one.
// kWgmmaRegisterWeights (grouped_expert_gemm_wgmma_rs.cu, Hopper only, NVFP4 in the mma layouts
// only): the product transposed, the weights as wgmma's A operand converted in registers straight
// from their global loads (nothing converted through shared memory), the token rows as its B
// operand from a shared-memory ring, 256 weight rows x 128 tokens per CTA where N allows.
// They sum the same products in different orders (results agree within the float32
// accumulation bound, not bit for bit); each is deterministic.
enum class GroupedExpertKernel : int { kMmaSync = 0, kWgmma = 1, kWgmmaRegisterWeights = 2 };

// Whether the grouped kernel takes `w` ([E, N, K]) with this epilogue: NVFP4 or MXFP8, N and K
// multiples of 128, and a layout whose 16-row tiles the CTA can copy whole.
inline bool grouped_expert_gemm_fits(const QuantWeight& w, GroupedEpilogue ep) {
  if (w.format != QuantFormat::kNvfp4 && w.format != QuantFormat::kMxfp8) return false;
  if (w.n <= 0 || w.k <= 0 || w.n % kGroupedTileN != 0 || w.k % kGroupedTileK != 0) return false;
  if (w.layout == WeightLayout::kRowMajor) return true;
  return ep == GroupedEpilogue::kSwigluBf16 ? w.layout == WeightLayout::kMmaSwigluPairs
                                            : w.layout == WeightLayout::kMmaRows16;
}

// Whether kWgmmaRegisterWeights takes `w` as well: NVFP4 in the mma layout of the epilogue (its
// lanes load mma.m16n8k16's A registers straight from that layout).
inline bool grouped_expert_gemm_register_weights_fit(const QuantWeight& w, GroupedEpilogue ep) {
  return grouped_expert_gemm_fits(w, ep) && w.format == QuantFormat::kNvfp4 &&
         w.layout != WeightLayout::kRowMajor;
}

// Grid rows of the grouped launch: enough row tiles for any split of `rows` over `experts`.
inline int64_t grouped_expert_gemm_max_row_tiles(int64_t rows, int64_t experts) {
  return (rows + kGroupedTileM - 1) / kGroupedTileM + experts;
}

struct GroupedExpertGemmParams {
  // Activations, bf16 bits. a_rows non-null: row m of expert e is a[a_rows[off[e] + m] / a_row_div]
  // (routed row ids token·top_k + slot, a_row_div = top_k); null: a[off[e] + m] (sorted order).
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;
  int64_t a_row_div = 1;
  const int32_t* group_offsets = nullptr;  // [E + 1] (device)
  const int32_t* tile_offsets = nullptr;   // [E + 1] (device, launch_moe_tile_schedule)
  int64_t num_experts = 0;
  int64_t max_rows = 0;                    // an upper bound on off[E] (sizes the grid)
  QuantWeight w;                           // [E, N, K]; grouped_expert_gemm_fits must hold
  GroupedEpilogue epilogue = GroupedEpilogue::kStoreF32;
  float* y = nullptr;                      // kStoreF32: [max_rows, ldy]
  int64_t ldy = 0;
  uint16_t* act = nullptr;                 // kSwigluBf16: [max_rows, ldact], N/2 columns
  int64_t ldact = 0;
  float alpha = 1.702f, limit = 7.0f;
  GroupedExpertKernel kernel = GroupedExpertKernel::kMmaSync;
  // kWgmmaRegisterWeights only. a_in_k_order: every 128-column chunk of a's rows is already in
  // the weights' k order (nvfp4_mma::k_order_position; launch_to_k_order), so the token rows are
  // copied 16 bytes at a time instead of permuted 4 bytes at a time. act_in_k_order: the SwiGLU
  // epilogue writes act in that order (the input of a down projection by the same kernel).
  bool a_in_k_order = false;
  bool act_in_k_order = false;
};
Status launch_grouped_expert_gemm(const GroupedExpertGemmParams& p, CUstream_st* stream);

// out[r, 128c + k_order_position(p)] = x[r, 128c + p] for r < rows, all chunks c of `cols`
// (a multiple of 128) bf16 columns; ldx, ldout in elements.
Status launch_to_k_order(const uint16_t* x, int64_t ldx, int64_t rows, int64_t cols,
                         uint16_t* out, int64_t ldout, CUstream_st* stream);

// The kWgmma and kWgmmaRegisterWeights main loops (called by launch_grouped_expert_gemm after
// its argument checks).
Status launch_grouped_expert_gemm_wgmma(const GroupedExpertGemmParams& p, CUstream_st* stream);
Status launch_grouped_expert_gemm_wgmma_rs(const GroupedExpertGemmParams& p, CUstream_st* stream);

// tile_off[0] = 0, tile_off[e + 1] = tile_off[e] + ceil((off[e + 1] - off[e]) / kGroupedTileM).
Status launch_moe_tile_schedule(const int32_t* group_offsets, int64_t num_experts,
                                int32_t* tile_offsets, CUstream_st* stream);

// inv[sorted_rows[i]] = i for i < off[E] (read on the device; i < max_rows). inv must be
// pre-filled with -1.
Status launch_invert_rows_counted(const int32_t* sorted_rows, const int32_t* group_offsets,
                                  int64_t num_experts, int64_t max_rows, int32_t* inv,
                                  CUstream_st* stream);

}  // namespace m3::cuda

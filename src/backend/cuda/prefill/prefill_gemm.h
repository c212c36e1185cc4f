// Prefill GEMMs on the tensor cores (many tokens, T = 128 .. 32K) for BF16, MXFP8 and NVFP4
// weights. Hopper has no block-scaled FP4/FP8 tensor-core instruction, so a quantised weight
// matrix is dequantised tile by tile into a reusable BF16 scratch buffer (exactly: every MXFP8
// value e4m3·2^e and every NVFP4 value e2m1·e4m3 is a bf16 number) and multiplied with
// cuBLASLt (BF16 inputs, float32 accumulation and output). The NVFP4 per-matrix multiplier is
// applied by cuBLASLt as alpha (a device pointer), in float32, not folded into the bf16 values.
// BF16 weights are used in place (no dequantisation).
//
// Cost of the dequantisation: about 4.6 bytes of memory traffic per weight element (the codes and
// scales read, 2 bytes written, 2 read back by the GEMM) against 2·M flops per element for a GEMM
// of M rows. At the H100/H200 ratio of bf16 peak to HBM bandwidth (~250 flop per byte) that is
// small for a dense matrix at M = T in the thousands, but a routed expert gets M = T·top_k / E rows
// (1K of a 32K chunk on M3.1-Flash): there the dequantisation was ~12 of the 44 ms of a layer's
// routed experts on an H100 (docs/performance.md).
//
// Routed experts (moe): rows (token, slot) are grouped by expert (launch_group_by_expert), the
// token activations gathered in that order, and only experts that received tokens are
// dequantised; one cuBLASLt GEMM per active expert for gate|up, SwiGLU-OAI to bf16 activations,
// one GEMM per expert for down, then the weighted combine over the slots in ascending order
// (the CPU backend's order) plus the optional shared-expert output.
//
// PrefillMoeKernel::kGroupedInLoop replaces the per-expert loop by two launches of the grouped
// expert GEMM (moe/grouped_expert_gemm.h: NVFP4 / MXFP8 dequantised in the GEMM's main loop,
// SwiGLU-OAI fused into the gate|up epilogue), driven by device-side counts: no host sync, so the
// call can be captured in a CUDA graph; kGroupedWgmma runs the same two launches with the wgmma
// main loop (sm_90 only), kGroupedWgmmaRegisterWeights with the weights as wgmma's register
// operand where they are NVFP4 in the mma layouts. Weights they do not take (BF16, N or K not a multiple of 128, other mma
// tilings) fall back to kDequantCublas.
//
// This header includes no CUDA header.
#pragma once

#include <cstdint>
#include <memory>

#include "backend/cuda/gemm/quant_gemv.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

class CachingAllocator;

// One weight matrix [n, k] (or num_groups of them back to back, for experts), formats as in
// quant_gemv.h. K must be a multiple of 32 (MXFP8), 16 (NVFP4) or 8 (BF16).
struct QuantWeight {
  QuantFormat format = QuantFormat::kBf16;
  const uint8_t* w = nullptr;        // [G, N, K] e4m3 | [G, N, K/2] packed e2m1 | [G, N, K] bf16
  const uint8_t* w_scale = nullptr;  // [G, N, K/32] e8m0 | [G, N, K/16] e4m3 | unused
  const float* w_global = nullptr;   // [G] NVFP4 multiplier (device); nullptr = 1
  int64_t n = 0, k = 0;
  WeightLayout layout = WeightLayout::kRowMajor;  // the NVFP4 / MXFP8 mma layouts dequantised too
};

// Bytes of one matrix's data / scales (the stride between experts).
int64_t quant_weight_bytes(QuantFormat f, int64_t n, int64_t k);
int64_t quant_scale_bytes(QuantFormat f, int64_t n, int64_t k);

enum class PrefillOut : int { kF32 = 0, kBf16 = 1 };

// y[M, N] (+)= x[M, K] · W[N, K]^T (· global), bf16 x, float32 accumulation.
struct PrefillLinearParams {
  const uint16_t* x = nullptr;  // [M, ldx] bf16 bits
  int64_t ldx = 0, m = 0;
  QuantWeight w;                // one matrix
  void* y = nullptr;            // [M, ldy] float32 or bf16 (out)
  int64_t ldy = 0;
  PrefillOut out = PrefillOut::kF32;
  bool accumulate = false;      // y += (float32 output only)
};

enum class PrefillMoeKernel : int {
  kDequantCublas = 0,  // dequantise each active expert to bf16, one cuBLASLt GEMM per expert
  kGroupedInLoop = 1,  // one grouped launch per matrix, dequantised in the main loop, no sync
  kGroupedWgmma = 2,   // the same with the Hopper wgmma main loop (GroupedExpertKernel::kWgmma)
  // The same with the weights as wgmma's register operand (GroupedExpertKernel::
  // kWgmmaRegisterWeights) for a matrix it takes (NVFP4 in the mma layouts), kGroupedWgmma for the
  // other.
  kGroupedWgmmaRegisterWeights = 3,
};

// out[t] = Σ_s weight[t, s] · down_e(SwiGLU-OAI(gate_up_e(x[t]))) (+ shared[t]), e = ids[t, s].
// Ids outside [0, E) contribute nothing.
struct PrefillMoeParams {
  const uint16_t* x = nullptr;           // [T, hidden] bf16 bits
  const int32_t* topk_ids = nullptr;     // [T, top_k] (device)
  const float* topk_weights = nullptr;   // [T, top_k] (device)
  QuantWeight w13;                       // [E, 2·inter, hidden] (gate rows then up rows)
  QuantWeight w2;                        // [E, hidden, inter]
  const float* shared = nullptr;         // [T, hidden] or nullptr
  float* out = nullptr;                  // [T, hidden]
  int64_t t = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0;
  // Expert parallelism: topk_ids are global and w13 / w2 hold the rank's num_experts experts
  // [expert_base, expert_base + num_experts); the other experts' slots contribute nothing here
  // (GroupByExpertParams::expert_base).
  int64_t expert_base = 0;
  float alpha = 1.702f, limit = 7.0f;
  PrefillMoeKernel kernel = PrefillMoeKernel::kDequantCublas;
};

struct PrefillMoeStats {
  // Experts dequantised and multiplied in the last moe() call (kDequantCublas; the grouped
  // kernel never reads the counts on the host and leaves 0).
  int64_t active_experts = 0;
};

class PrefillGemm {
 public:
  // `alloc` must outlive the object; scratch for one dequantised tile of at most
  // `scratch_bytes` (a tile is a whole number of 128-row panels, at least one).
  static Result<std::unique_ptr<PrefillGemm>> create(CachingAllocator* alloc,
                                                     int64_t scratch_bytes = int64_t{128} << 20);
  ~PrefillGemm();
  PrefillGemm(const PrefillGemm&) = delete;
  PrefillGemm& operator=(const PrefillGemm&) = delete;

  Status linear(const PrefillLinearParams& p, CUstream_st* stream);
  // kDequantCublas synchronises the stream once (the host needs the per-expert row counts);
  // the grouped kernels do not.
  Status moe(const PrefillMoeParams& p, CUstream_st* stream);
  PrefillMoeStats last_moe_stats() const { return moe_stats_; }

  struct Impl;

 private:
  PrefillGemm() = default;
  Status moe_grouped(const PrefillMoeParams& p, CUstream_st* stream);
  std::unique_ptr<Impl> impl_;
  PrefillMoeStats moe_stats_;
};

// Kernels (prefill_kernels.cu).

// Dequantises rows [row0, row0 + rows) of one matrix to bf16 out[rows, K] (exact, see above;
// the NVFP4 global multiplier is NOT applied).
struct DequantBf16Params {
  QuantWeight w;
  int64_t row0 = 0, rows = 0;
  uint16_t* out = nullptr;  // [rows, K] bf16 bits
};
Status launch_dequant_bf16(const DequantBf16Params& p, CUstream_st* stream);

// y[i] = bf16(x[i]) (round to nearest even), n elements.
Status launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, CUstream_st* stream);

// out[i, :] = x[rows[i] / row_div, :] (bf16 rows of `dim`), i < num_rows.
Status launch_gather_bf16(const uint16_t* x, const int32_t* rows, int64_t row_div,
                          int64_t num_rows, int64_t dim, uint16_t* out, CUstream_st* stream);

// act[r, i] = bf16(SwiGLU-OAI(h[r, i], h[r, I + i])), r < rows, i < I.
Status launch_swiglu_oai_bf16(const float* h, int64_t rows, int64_t inter, float alpha,
                              float limit, uint16_t* act, CUstream_st* stream);

// inv[sorted_rows[i]] = i for i < num_rows (inv must be pre-filled with -1).
Status launch_invert_rows(const int32_t* sorted_rows, int64_t num_rows, int32_t* inv,
                          CUstream_st* stream);

// out[t] = Σ_s w[t, s] · y[inv[t·K + s]] (ascending s, inv -1 skipped) (+ shared[t]).
Status launch_moe_combine_sorted(const float* y, const int32_t* inv, const float* weights,
                                 const float* shared, int64_t t, int64_t top_k, int64_t hidden,
                                 float* out, CUstream_st* stream);

}  // namespace m3::cuda

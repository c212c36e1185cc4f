// MiniMax-M3 weights on the GPU in their storage formats, for the real-shape kernels: MXFP8
// (E4M3 codes + E8M0 scales) and NVFP4 (packed E2M1 + E4M3 scales + a per-matrix multiplier) as
// stored, everything else BF16; the router and the routing bias float32 (the router rounded to
// bf16 can flip near-tied expert choices against the float32 reference). Linears that read the same input are
// fused by rows at load (q|k|v|index_q|index_k, gate|up), which needs their formats to agree;
// otherwise (or when the source has no raw access, or NVFP4 gate/up multipliers differ) the fused
// matrix is BF16 (exact for BF16 and MXFP8 storage; NVFP4 values are rounded to bf16), and
// `bf16_fallbacks` counts it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "backend/cuda/runtime/device_memory.h"

namespace m3::minimax_m3 {

// G matrices [N, K] back to back in one format (G = 1 except routed experts).
struct DevMatrix {
  cuda::QuantFormat format = cuda::QuantFormat::kBf16;
  uint8_t* w = nullptr;      // [G, N, K] e4m3 | [G, N, K/2] packed e2m1 | [G, N, K] bf16
  uint8_t* scale = nullptr;  // [G, N, K/32] e8m0 | [G, N, K/16] e4m3 | a 16-byte dummy (BF16)
  float* global = nullptr;   // [G] NVFP4 multiplier; nullptr otherwise
  int64_t n = 0, k = 0, groups = 1;
  // Storage order: row-major as loaded; the model repacks some matrices into the decode GEMVs'
  // mma layouts after loading (quant/nvfp4_mma_layout.h, quant/mxfp8_mma_layout.h).
  cuda::WeightLayout layout = cuda::WeightLayout::kRowMajor;

  cuda::QuantWeight prefill() const {
    cuda::QuantWeight q;
    q.format = format;
    q.w = w;
    q.w_scale = format == cuda::QuantFormat::kBf16 ? nullptr : scale;
    q.w_global = global;
    q.n = n;
    q.k = k;
    q.layout = layout;
    return q;
  }
};

struct DevLayer {
  bool moe = false;
  bool sparse = true;  // MSA sparse attention (indexer); false: full_attention, no index weights
  uint16_t *in_norm = nullptr, *post_norm = nullptr;  // [Hd] bf16
  uint16_t *q_norm = nullptr, *k_norm = nullptr;      // [D]
  uint16_t *iq_norm = nullptr, *ik_norm = nullptr;    // [Dix]; nullptr on a full layer
  // Sparse: [H·D + 2·Hkv·D + Hix·Dix + Dix, Hd]: q | k | v | index q | index k.
  // Full attention: [H·D + 2·Hkv·D, Hd]: q | k | v.
  DevMatrix qkv;
  DevMatrix o;    // [Hd, H·D]
  DevMatrix mlp_gu, mlp_down;        // dense MLP: [2·I_dense, Hd], [Hd, I_dense]
  float* router = nullptr;           // [E, Hd] float32, as checkpoints store it
  float* router_bias = nullptr;      // [E] float32 (zeros when the checkpoint has none)
  DevMatrix experts_gu;              // [E, 2·I, Hd] (gate rows then up rows per expert)
  DevMatrix experts_down;            // [E, Hd, I]
  DevMatrix shared_gu, shared_down;  // n == 0 when there is no shared expert
};

struct DevWeights {
  // Vocabulary rows [vocab_first, vocab_first + vocab_rows) of the embedding and the head: all
  // V of them for the whole model, a tensor-parallel rank's slice (RankSlices::vocab_begin /
  // vocab_count) under --tp.
  uint16_t* embed = nullptr;       // [vocab_rows, Hd] bf16
  uint16_t* final_norm = nullptr;  // [Hd] bf16
  DevMatrix lm_head;               // [vocab_rows, Hd] bf16
  int64_t vocab_first = 0, vocab_rows = 0;
  std::vector<DevLayer> layers;
  int64_t bf16_fallbacks = 0;      // fused matrices stored BF16 although the checkpoint quantised
  int64_t quantised_matrices = 0;  // fused matrices kept in MXFP8 / NVFP4
};

// Loads the text-model weights of `cfg` (the whole model's config) that the tensor-parallel rank
// with slices `rs` holds (tensor_parallel.h; rank_slices(cfg, 0, 1) for the whole model) from
// `src` into `arena`: its heads' rows of q|k|v|index q, its heads' columns of o_proj, its
// intermediate rows of every gate|up and columns of every down projection, its experts
// (rs.expert_begin .. + rs.expert_count: under expert parallelism only those, in their stored
// NVFP4 / MXFP8 format, as groups 0 .. expert_count - 1 of experts_gu / experts_down; a
// full_attention layer has no index projections or norms), and its vocabulary rows
// (rs.vocab_begin .. + rs.vocab_count) of the embedding and the head; only those windows of the
// checkpoint are read. Shapes are then rank_config(cfg, ...)'s.
Result<DevWeights> load_dev_weights(const MiniMaxM3Config& cfg, const WeightSource& src,
                                    const RankSlices& rs, cuda::DeviceArena* arena);

// `--load-format dummy` on the GPU (`cfg` at the rank's shapes, rank_config): random weights generated in place (src/backend/cuda/dummy)
// in M3.1-Flash's storage formats: attention, indexer, dense-MLP and shared-expert linears MXFP8,
// routed experts NVFP4 (multiplier 2e-4), router, embedding, lm_head and norms BF16, routing bias
// float32. Values depend on (seed, tensor); they are not DummyWeightSource's host values.
// `experts_held`: the routed experts per MoE layer (an expert-parallel rank's share; 0: all);
// `vocab_first` / `vocab_rows`: the vocabulary rows of the embedding and head (0 rows: all).
Result<DevWeights> make_dummy_dev_weights(const MiniMaxM3Config& cfg, uint64_t seed,
                                          cuda::DeviceArena* arena, int64_t experts_held = 0,
                                          int64_t vocab_first = 0, int64_t vocab_rows = 0);

// Single tensors for other models on the same kernels (the DSpark draft, cuda_dspark_draft.h):
// a fused matrix of `parts` (name, rows; all [rows, k]) in their common stored format when they
// agree (MXFP8 / NVFP4; else BF16), and a vector as bf16. Errors name the tensor.
Result<DevMatrix> load_dev_matrix(const WeightSource& src,
                                  const std::vector<std::pair<std::string, int64_t>>& parts,
                                  int64_t k, cuda::DeviceArena* arena);
Result<uint16_t*> load_dev_vec_bf16(const WeightSource& src, const std::string& name, int64_t n,
                                    cuda::DeviceArena* arena);
// Random ones generated on the GPU as make_dummy_dev_weights does (values depend on the seed).
Result<DevMatrix> make_dummy_dev_matrix(cuda::QuantFormat format, int64_t n, int64_t k,
                                        uint64_t seed, cuda::DeviceArena* arena);
Result<uint16_t*> make_dummy_dev_vec_bf16(int64_t n, float scale, uint64_t seed,
                                          cuda::DeviceArena* arena);

}  // namespace m3::minimax_m3

// MiniMax-M3 text-model weights: checkpoint names (m3-architecture.md §4.2) and their float32
// copies on a backend. Names are resolved once at load: the prefix of the text model
// ("language_model.model." in the original multimodal checkpoint, "model." in a bare text model)
// and the naming variants of the dense MLP and the router bias are detected from the names
// present, so a missing tensor is reported by the name we looked for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {

// Where the text model sits inside the checkpoint.
struct WeightNaming {
  std::string model_prefix;  // "language_model.model." | "model." | "model.language_model."
  std::string lm_head;       // "language_model.lm_head.weight" | "lm_head.weight"; "" = tied
  std::string layer(int64_t i) const { return model_prefix + "layers." + std::to_string(i) + "."; }
};

// Picks the naming from the names present; the error lists what was looked for.
Result<WeightNaming> detect_naming(const WeightSource& src, const MiniMaxM3Config& cfg);

struct LayerWeights {
  bool sparse = false;  // has an indexer (layer_types[i] == kSparse)
  bool moe = false;     // MoE block (mlp_layer_types[i] == kMoe), else dense MLP

  DeviceBuffer<float> input_norm;  // [Hd]
  DeviceBuffer<float> post_norm;   // [Hd]
  DeviceBuffer<float> wq;          // [H·D, Hd]
  DeviceBuffer<float> wk, wv;      // [Hkv·D, Hd]
  DeviceBuffer<float> wo;          // [Hd, H·D]
  DeviceBuffer<float> q_norm, k_norm;  // [D]

  // Indexer (sparse layers only).
  DeviceBuffer<float> wiq;             // [Hix·Dix, Hd]
  DeviceBuffer<float> wik;             // [Dix, Hd]
  DeviceBuffer<float> iq_norm, ik_norm;  // [Dix]

  // Dense MLP (dense layers): gate rows then up rows.
  DeviceBuffer<float> mlp_w13;  // [2·I_dense, Hd]
  DeviceBuffer<float> mlp_w2;   // [Hd, I_dense]

  // MoE (MoE layers).
  DeviceBuffer<float> router;       // [E, Hd]
  DeviceBuffer<float> router_bias;  // [E] (zeros when the checkpoint has none)
  // The routed experts this rank holds (all E without expert parallelism): local expert l is the
  // model's expert expert_begin + l.
  int64_t expert_begin = 0;
  std::vector<DeviceBuffer<float>> expert_w13;  // [2·I, Hd] each
  std::vector<DeviceBuffer<float>> expert_w2;   // [Hd, I] each
  std::vector<const float*> expert_w13_ptrs, expert_w2_ptrs;  // views for MoeExpertsParams
  DeviceBuffer<float> shared_w13;   // [2·I_shared, Hd]; empty when there is no shared expert
  DeviceBuffer<float> shared_w2;    // [Hd, I_shared]
  int64_t shared_inter = 0;
};

struct ModelWeights {
  WeightNaming naming;
  DeviceBuffer<float> embed;       // [V, Hd]
  DeviceBuffer<float> final_norm;  // [Hd]
  // Vocabulary rows [lm_head_first_row, lm_head_first_row + lm_head.size() / Hd) of the head:
  // all V with one rank (and on rank 0 with ParallelLayout::whole_lm_head_on_rank0), else the
  // rank's RankSlices::vocab_begin/vocab_count rows.
  DeviceBuffer<float> lm_head;     // [rows, Hd]
  int64_t lm_head_first_row = 0;
  std::vector<LayerWeights> layers;
};

// Loads every text-model weight as float32 onto `backend`, checking shapes against `cfg` (the
// whole model's config). With tp.ranks > 1, only rank tp.rank's slices and experts
// (tensor_parallel.h); only their tensors are read, and the buffers have rank_config()'s shapes.
Result<ModelWeights> load_weights(const WeightSource& src, const MiniMaxM3Config& cfg,
                                  Backend* backend, const ParallelLayout& tp = {});

}  // namespace m3::minimax_m3

// The DSpark draft's own weights (m3-architecture.md §5.2, 97 stored tensors in the released
// M3.1-Flash `dspark/`: 62 logical weights, the MXFP8 linears each with its `weight_scale_inv`),
// loaded as float32 onto a backend. The draft has no embedding table and no lm_head: it uses the
// target's (TargetSharedWeights).
//
// Names: `<prefix>fc.weight`, `<prefix>layers.{i}.decoder_layer.self_attn.q_proj.weight`, ...
// with prefix "language_model.model.dspark." (the released checkpoint), "model.dspark.",
// "dspark." or "" (a draft exported on its own); the prefix is detected from the names present.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/dspark/dspark_config.h"
#include "model/minimax_m3/weights.h"

namespace m3::minimax_m3::dspark {

// The accepted prefixes, in detection order.
const std::vector<std::string>& dspark_prefixes();

// The logical weight names of a draft with config `c` under `prefix`, sorted.
std::vector<std::string> dspark_weight_names(const DSparkConfig& c, const std::string& prefix);

struct DSparkLayerWeights {
  DeviceBuffer<float> input_norm, post_norm;  // [Hd]
  DeviceBuffer<float> wq;                     // [H·D, Hd]
  DeviceBuffer<float> wk, wv;                 // [Hkv·D, Hd]
  DeviceBuffer<float> wo;                     // [Hd, H·D]
  DeviceBuffer<float> q_norm, k_norm;         // [D]
  DeviceBuffer<float> mlp_w13;                // [2·I, Hd]: gate rows, then up rows
  DeviceBuffer<float> mlp_w2;                 // [Hd, I]
};

struct DSparkWeights {
  std::string prefix;
  DeviceBuffer<float> fc;           // [Hd, n_ids·Hd]
  DeviceBuffer<float> hidden_norm;  // [Hd]
  DeviceBuffer<float> final_norm;   // [Hd]
  DeviceBuffer<float> markov_w1;    // [V, r], rows looked up by the previous token
  DeviceBuffer<float> markov_w2;    // [V, r], a Linear r -> V
  // The confidence head (enable_confidence_head): loaded so a checkpoint is checked whole; not
  // used by the forward (m3serve drafts a fixed block, docs/dspark.md).
  DeviceBuffer<float> confidence_w;  // [1, Hd (+ r)]
  DeviceBuffer<float> confidence_b;  // [1]
  std::vector<DSparkLayerWeights> layers;
};

// Loads every draft weight of `cfg` from `src` (float32, dequantised by the source). `where`
// names the source in messages (the dspark directory). A missing tensor or a wrong shape is an
// error naming `where` and the tensor.
Result<DSparkWeights> load_dspark_weights(const WeightSource& src, const DSparkConfig& cfg,
                                          Backend* backend, const std::string& where);

// The target's tensors the draft reads: embedding table (query block), lm_head (draft logits)
// and final norm (the kFinalNormLast capture convention). Either views of a loaded target
// model's buffers, or owned copies loaded from the target's WeightSource.
struct TargetSharedWeights {
  const float* embed = nullptr;       // [V, Hd]
  const float* lm_head = nullptr;     // [V, Hd]
  const float* final_norm = nullptr;  // [Hd]
  DeviceBuffer<float> owned_embed, owned_lm_head, owned_final_norm;

  static TargetSharedWeights view_of(const ModelWeights& w);
  static Result<TargetSharedWeights> load(const WeightSource& target_src,
                                          const MiniMaxM3Config& target_cfg, Backend* backend);
};

}  // namespace m3::minimax_m3::dspark

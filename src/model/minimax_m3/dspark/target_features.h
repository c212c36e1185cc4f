// The draft's input: for every committed target token, the hidden states of the target layers in
// dspark_target_layer_ids, concatenated in that order ([T, n_ids·Hd], §5.2 step 1).
//
// The target captures the residual stream after each listed layer (Model::forward's
// capture_layers; ModelOutput::hidden is [n_ids, T, Hd] per sequence). Under
// CaptureConvention::kFinalNormLast the entry of the target's last layer is replaced by the
// target's final-norm output of it (Gemma RMSNorm with the target's final norm weight and eps),
// as NeMo's trainer feeds it; every other entry is the same under both conventions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "loader/model_config.h"
#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::minimax_m3::dspark {

// `captured` is [n_ids, T, Hd] in dspark_target_layer_ids order (the layout of
// ModelOutput::hidden for capture_layers = target_layer_ids). `final_norm` is the target's final
// norm weight [Hd] in host memory (read only under kFinalNormLast). Returns [T, n_ids·Hd].
Result<std::vector<float>> build_context_features(std::span<const float> captured,
                                                  int64_t num_tokens, const DSparkConfig& draft,
                                                  const MiniMaxM3Config& target,
                                                  CaptureConvention convention,
                                                  std::span<const float> final_norm);

// The capture_layers list to pass to Model::forward for this draft.
std::vector<int32_t> capture_layers_for(const DSparkConfig& draft);

}  // namespace m3::minimax_m3::dspark

#include "model/minimax_m3/dspark/target_features.h"

#include <cmath>
#include <string>

namespace m3::minimax_m3::dspark {

std::vector<int32_t> capture_layers_for(const DSparkConfig& draft) {
  std::vector<int32_t> layers;
  for (int64_t id : draft.target_layer_ids) layers.push_back(static_cast<int32_t>(id));
  return layers;
}

Result<std::vector<float>> build_context_features(std::span<const float> captured,
                                                  int64_t num_tokens, const DSparkConfig& draft,
                                                  const MiniMaxM3Config& target,
                                                  CaptureConvention convention,
                                                  std::span<const float> final_norm) {
  const int64_t hd = target.hidden_size,
                n_ids = static_cast<int64_t>(draft.target_layer_ids.size());
  const std::string who = "[model.minimax_m3.dspark.features] ";
  if (num_tokens < 0) return invalid_argument(who + "negative token count");
  if (static_cast<int64_t>(captured.size()) != n_ids * num_tokens * hd)
    return invalid_argument(who + "captured hidden states hold " + std::to_string(captured.size()) +
                            " values; " + std::to_string(n_ids) + " layers x " +
                            std::to_string(num_tokens) + " tokens x hidden " + std::to_string(hd) +
                            " expected");
  const bool norm_last = convention == CaptureConvention::kFinalNormLast;
  if (norm_last && static_cast<int64_t>(final_norm.size()) != hd)
    return invalid_argument(who + "final norm weight has " + std::to_string(final_norm.size()) +
                            " values, hidden size is " + std::to_string(hd));
  std::vector<float> out(static_cast<size_t>(num_tokens * n_ids * hd));
  const float eps = static_cast<float>(target.rms_norm_eps);
  for (int64_t l = 0; l < n_ids; ++l) {
    const bool normed =
        norm_last && draft.target_layer_ids[static_cast<size_t>(l)] == target.num_hidden_layers - 1;
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* x = captured.data() + (l * num_tokens + t) * hd;
      float* y = out.data() + (t * n_ids + l) * hd;
      if (!normed) {
        std::copy(x, x + hd, y);
        continue;
      }
      // The target's final norm exactly as the CPU backend's rms_norm computes it (Gemma form,
      // mean of squares in double), so the features equal the target's post-norm rows bitwise.
      double ss = 0.0;
      for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(x[i]) * x[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hd) + eps));
      for (int64_t i = 0; i < hd; ++i)
        y[i] = (x[i] * inv) * (1.0f + final_norm[static_cast<size_t>(i)]);
    }
  }
  return out;
}

}  // namespace m3::minimax_m3::dspark

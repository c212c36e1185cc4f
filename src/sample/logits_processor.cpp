#include "sample/logits_processor.h"

#include <limits>

namespace m3 {

void PenaltyState::set_prompt(std::span<const int32_t> prompt) {
  for (int32_t t : prompt) ++seen_[t];
}

void PenaltyState::add_output(int32_t token) {
  ++output_counts_[token];
  ++seen_[token];
  ++num_output_;
}

void mask_tokens(std::span<float> logits, std::span<const int32_t> tokens) {
  const int64_t v = static_cast<int64_t>(logits.size());
  for (int32_t t : tokens) {
    if (t >= 0 && t < v) logits[t] = -std::numeric_limits<float>::infinity();
  }
}

void apply_logit_bias(std::span<float> logits,
                      std::span<const std::pair<int32_t, float>> logit_bias) {
  const int64_t v = static_cast<int64_t>(logits.size());
  for (const auto& [t, b] : logit_bias) {
    if (t >= 0 && t < v) logits[t] += b;
  }
}

void apply_penalties(std::span<float> logits, const SamplingParams& p, const PenaltyState& s) {
  const int64_t v = static_cast<int64_t>(logits.size());
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [t, c] : s.seen()) {
      if (t < 0 || t >= v) continue;
      float& x = logits[t];
      x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, c] : s.output_counts()) {
      if (t < 0 || t >= v) continue;
      logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
    }
  }
}

}  // namespace m3

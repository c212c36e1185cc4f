// Logits processors on the CPU, float32, applied in this order (vLLM's order for the first four):
//   min_tokens mask -> logit_bias -> repetition/presence/frequency penalties -> temperature
//   -> top_k -> top_p -> min_p   (top_k/top_p/min_p are masks on the softmax; see sampler.h)
// Each function is a direct, documented transformation so tests can compare against a hand
// computation.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "sample/sampling_params.h"

namespace m3 {

// Token statistics a sequence's penalties need, updated incrementally (O(1) per token) so long
// contexts do not rescan their history every step.
class PenaltyState {
 public:
  // Records the prompt; only needed when repetition_penalty != 1 (it covers prompt tokens).
  void set_prompt(std::span<const int32_t> prompt);
  void add_output(int32_t token);
  const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }
  // Tokens seen in prompt or output (repetition penalty set).
  const std::unordered_map<int32_t, int32_t>& seen() const { return seen_; }
  int32_t num_output() const { return num_output_; }

 private:
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::unordered_map<int32_t, int32_t> seen_;
  int32_t num_output_ = 0;
};

// Sets the logits of `tokens` to -inf (min_tokens: EOS and stop tokens before the minimum).
void mask_tokens(std::span<float> logits, std::span<const int32_t> tokens);
// logits[t] += bias.
void apply_logit_bias(std::span<float> logits,
                      std::span<const std::pair<int32_t, float>> logit_bias);
// Repetition (HF/vLLM: for every token in prompt or output, divide a positive logit by the
// penalty, multiply a negative one), then OpenAI presence/frequency over output tokens:
//   logit -= presence * (count > 0) + frequency * count.
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     const PenaltyState& state);

}  // namespace m3

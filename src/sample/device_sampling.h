// Sampling a runner may do itself, next to its logits (on the GPU), instead of returning them:
// the knobs of the CPU sampler (sampler.h) that need nothing but the row's logits and the
// request's random key. Penalties (which need the sequence's token history), logit_bias, the
// min_tokens mask and logprobs stay on the CPU sampler, which then gets the row's logits.
// A runner that samples must return the token sample_token() would pick from the same logits,
// up to float rounding at a cut (backend/cuda/sampling/sample.h says exactly where).
#pragma once

#include <cstdint>

#include "sample/rng.h"
#include "sample/sampling_params.h"

namespace m3 {

struct DeviceSampling {
  float temperature = 1.0f;  // < kGreedyTemperature: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  RngKey rng;
};

// Whether a row with these parameters can be sampled from its logits alone; `min_tokens_active`:
// the sequence is still below min_tokens and has tokens to mask (EOS / stop ids).
inline bool device_samplable(const SamplingParams& p, bool min_tokens_active) {
  return !min_tokens_active && !p.logprobs && p.top_logprobs == 0 && p.logit_bias.empty() &&
         p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

inline DeviceSampling device_sampling(const SamplingParams& p, const RngKey& rng) {
  DeviceSampling d;
  d.temperature = p.temperature;
  d.top_k = p.top_k;
  d.top_p = p.top_p;
  d.min_p = p.min_p;
  d.rng = rng;
  return d;
}

}  // namespace m3

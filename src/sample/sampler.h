// Token sampler on the CPU (float32 logits in, double-precision softmax statistics inside).
//
//   processed = penalties(bias(mask(logits)))                  (logits_processor.h)
//   temperature < 1e-5: token = argmax(processed), ties -> lowest id
//   else: z = processed / T; keep the top_k largest z (ties -> lower id); p = softmax over kept;
//         top_p keeps the smallest prefix of tokens by descending p (ties -> lower id) whose mass
//         reaches top_p (always >= 1 token); min_p keeps p >= min_p * max p; then one uniform
//         u = uniform01(key) picks the first kept token, in ascending id order, whose cumulative
//         kept mass exceeds u * total kept mass.
//
// Logprobs are RAW model logprobs: log_softmax of the unprocessed logits, as vLLM returns by
// default (logprobs-mode raw_logprobs). So the sampled token's logprob does not move with
// temperature or penalties, and greedy and sampled requests report comparable numbers.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "sample/logits_processor.h"
#include "sample/rng.h"
#include "sample/sampling_params.h"

namespace m3 {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                    // raw logprob of `token` (when params.logprobs)
  std::vector<TokenLogprob> top_logprobs;  // top params.top_logprobs raw, descending, ties id asc
};

struct SampleInput {
  std::span<const float> logits;          // [V] raw model logits of one sequence
  const SamplingParams* params = nullptr;
  const PenaltyState* penalties = nullptr;  // may be null: no history
  std::span<const int32_t> min_tokens_mask;  // tokens masked while output < min_tokens (EOS, stop)
  RngKey rng;
};

// Reusable buffers, one per sampling thread, so a step does not allocate V-sized vectors.
struct SamplerScratch {
  std::vector<float> work;
  std::vector<int32_t> order;
  std::vector<double> probs;
};

SampleResult sample_token(const SampleInput& in, SamplerScratch* scratch);

// The distribution sample_token draws from, normalised: probs[V] is the kept mass of every id
// after the logits processors, temperature, top_k, top_p and min_p (0 outside the kept set);
// greedy (temperature < kGreedyTemperature): 1 at the argmax. Speculative verification compares
// a draft against exactly this distribution.
void sampling_distribution(const SampleInput& in, SamplerScratch* scratch,
                           std::vector<double>* probs);
// sample_token's draw: the first id, in ascending order, whose cumulative mass exceeds
// u * total (u in [0, 1)); -1 if every mass is 0.
int32_t draw_from_mass(std::span<const double> mass, double total, double u);

// Raw log-softmax helpers (exposed for tests and the server's echo/prompt logprobs later).
// Returns log_softmax(logits)[token] computed in double.
double raw_logprob(std::span<const float> logits, int32_t token);
// Top n (token, logprob) by descending logprob, ties -> lower id.
std::vector<TokenLogprob> raw_top_logprobs(std::span<const float> logits, int32_t n);

}  // namespace m3

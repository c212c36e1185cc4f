// Per-request sampling parameters (OpenAI / vLLM semantics) and the model's defaults from
// generation_config.json. The server starts from Engine::default_sampling_params() and overrides
// what the client set; validate_sampling_params() is the engine's authoritative check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace m3 {

// Temperatures below this are greedy (argmax), as in vLLM (_SAMPLING_EPS = 1e-5).
inline constexpr float kGreedyTemperature = 1e-5f;
// OpenAI's limit for top_logprobs; vLLM accepts more but the API documents 20.
inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;          // 0 (< kGreedyTemperature) = greedy
  float top_p = 1.0f;                // (0, 1]
  int32_t top_k = 0;                 // 0 or -1 = off
  float min_p = 0.0f;                // [0, 1]; keep p >= min_p * p_max
  float repetition_penalty = 1.0f;   // > 0; HF/vLLM: divide positive logits, multiply negative,
                                     // over prompt and generated tokens
  float presence_penalty = 0.0f;     // [-2, 2]; OpenAI: minus once if generated at least once
  float frequency_penalty = 0.0f;    // [-2, 2]; OpenAI: minus count * penalty
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added bias ([-100, 100])
  std::optional<uint64_t> seed;      // same seed (and prompt, params) -> same output
  int32_t n = 1;                     // sequences per request, sharing the prompt pages
  std::vector<std::string> stop;     // stop strings (need a detokenizer); not in the output
  std::vector<int32_t> stop_token_ids;  // stop tokens (in token ids, not in the text)
  int32_t max_tokens = -1;           // -1: up to the context length
  int32_t min_tokens = 0;            // EOS and stop tokens are masked before this many tokens
  bool ignore_eos = false;           // keep generating after EOS (EOS is not masked, as vLLM)
  bool logprobs = false;             // return the sampled token's logprob
  int32_t top_logprobs = 0;          // and the top-N alternatives (needs logprobs)
};

// Model defaults (generation_config.json). Fields the file lacks keep the neutral value. Like vLLM,
// only the sampling knobs are taken; do_sample is ignored (temperature decides).
struct GenerationDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t max_new_tokens = -1;
  std::vector<int32_t> eos_token_ids;  // eos_token_id: int or list
};

// Parses the JSON text of generation_config.json; `source` names the file in errors.
Result<GenerationDefaults> parse_generation_config(std::string_view json_text,
                                                   std::string_view source);
// Reads and parses a generation_config.json file.
Result<GenerationDefaults> load_generation_config(const std::string& path);

SamplingParams default_sampling_params(const GenerationDefaults& defaults);

// Range checks with messages naming the parameter and value (the server maps them to 400s).
Status validate_sampling_params(const SamplingParams& params, int32_t vocab_size);

}  // namespace m3

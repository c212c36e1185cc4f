// What the server hands the engine and what comes back, per request. Plain data.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "sample/sampler.h"
#include "sample/sampling_params.h"
#include "sched/step_plan.h"

namespace m3 {

using Clock = std::chrono::steady_clock;

// Vectors that replace the token embeddings of a run of prompt positions (an image's features at
// its placeholder tokens), passed to the model through ModelSlice::embeddings.
struct PromptEmbeddings {
  int32_t token_offset = 0;  // first prompt position
  int32_t num_tokens = 0;
  std::shared_ptr<const std::vector<float>> values;  // [num_tokens, hidden_size]
  // Identifies the values (the image's content hash): part of the prefix-cache key of those
  // positions, so the same image reuses cached KV and another image never does.
  uint64_t content_hash = 0;
};

struct GenerateRequest {
  std::vector<int32_t> prompt_tokens;  // rendered and tokenized by the server; non-empty
  SamplingParams params;               // start from Engine::default_sampling_params()
  bool skip_special_tokens = true;     // for the detokenizer factory
  std::string tag;                     // free-form id for logs (e.g. the OpenAI request id)
  // Return the logits of every prompt position (RequestEvent::prompt_logits), for scoring. The
  // prompt is then computed in full, never served from the prefix cache; n must be 1.
  bool prompt_logits = false;
  // Non-overlapping, in prompt order; needs ModelFeatures::input_embeddings.
  std::vector<PromptEmbeddings> prompt_embeddings;
};

enum class FinishReason : uint8_t {
  kStop,       // EOS, a stop token id or a stop string
  kLength,     // max_tokens, or the context length
  kCancelled,  // cancel() or the RequestHandle was dropped (client gone); OpenAI: "abort"
  kError,      // the model step failed; the event's error says why
};
// OpenAI spelling: "stop", "length", "abort", "error".
const char* finish_reason_name(FinishReason reason);

// One generated token with its logprobs (when requested).
struct GeneratedToken {
  int32_t token = -1;
  float logprob = 0.0f;                    // raw model logprob (sampler.h); 0 unless requested
  std::vector<TokenLogprob> top_logprobs;  // empty unless top_logprobs > 0
};

// One sequence's progress in one step.
struct SeqDelta {
  int32_t seq_index = 0;                // 0 .. n-1
  std::vector<GeneratedToken> tokens;   // new tokens, including a final EOS / stop token id
  std::string text;                     // new text: whole UTF-8 characters, never part of a stop
                                        // string; empty when the engine has no detokenizer
  std::optional<FinishReason> finish_reason;
  std::string stop_string;              // the stop string that matched (finish kStop)
  int32_t stop_token = -1;              // the EOS / stop token that matched (finish kStop)
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // over all n sequences (OpenAI)
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache (first admission)
  // Speculative decoding, over all n sequences (0 without): verify steps, drafts verified, drafts
  // accepted. Tokens per verify step = (spec_accepted_tokens + spec_verify_steps) /
  // spec_verify_steps.
  int32_t spec_verify_steps = 0;
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;
};

// Steady-clock times for TTFT / inter-token latency / queue time metrics.
struct RequestTimes {
  Clock::time_point arrival;            // submit()
  Clock::time_point scheduled;          // first slice planned (queue time = scheduled - arrival)
  Clock::time_point first_token;        // first token emitted (TTFT = first_token - arrival)
  Clock::time_point finished;
};

// Everything that happened to one request in one engine step. Inter-token latency: the gaps
// between successive events' `time`.
struct RequestEvent {
  RequestId request_id = 0;
  std::vector<SeqDelta> seqs;  // sequences with news this step
  bool done = false;           // the last event of the request: every sequence has finished
  Usage usage;                 // running totals; final on `done`
  RequestTimes times;          // filled as far as known
  Clock::time_point time;      // when the engine emitted the event
  Status error;                // non-ok on a failed request (then done, finish kError)
  // With GenerateRequest::prompt_logits, on the event of the first generated token (or the
  // last event if none is generated): [prompt_tokens, vocab] row-major, the logits after each
  // prompt position.
  std::vector<float> prompt_logits;
};

}  // namespace m3

// The interface between the HTTP server and whatever generates tokens. The real Engine
// (src/engine) is adapted to it by a thin wrapper (EngineBackend, src/serving); FakeBackend
// (fake/fake_backend.h) plays scripted outputs for tests. Plain data, no engine headers, so the
// server builds and is tested on its own.
//
// Division of work, matching src/engine: the server renders the chat template and tokenizes;
// the backend generates, detokenizes (UTF-8 complete text per step) and applies stop strings and
// stop token ids (so generation stops within the step that completes a stop string); the server
// runs the reasoning and tool-call parsers on the text.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "server/media/image_preprocess.h"

namespace m3::server {

using Clock = std::chrono::steady_clock;

// Unset fields take the backend's defaults (generation_config.json).
struct SamplingOptions {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int32_t> top_k;
  std::optional<double> min_p;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;
  std::optional<double> repetition_penalty;
  std::optional<uint64_t> seed;
  int32_t max_tokens = 0;  // always set by the server (defaults to what the context leaves)
  int32_t min_tokens = 0;
  bool ignore_eos = false;
  std::vector<std::string> stop;        // stop strings: text cut before the match
  std::vector<int32_t> stop_token_ids;  // in addition to EOS
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit
  // Per-token logprobs in the events: the sampled token's, and the top `top_logprobs`
  // alternatives. Raw logprobs of the model's distribution (log_softmax of the logits before
  // temperature, penalties, top-k/p), as vLLM returns by default.
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// One generated token's logprobs (BackendEvent::logprobs, when SamplingOptions::logprobs).
struct TokenLogprobs {
  float logprob = 0.0f;                          // of the sampled token
  std::vector<std::pair<int32_t, float>> top;    // (token, logprob), descending, ties id asc
};

// One image of a request, pre-processed for the vision tower (server/media/image_preprocess.h):
// its placeholder tokens are prompt_tokens[token_offset, token_offset + num_tokens).
struct BackendImage {
  int32_t token_offset = 0;
  int32_t num_tokens = 0;
  int32_t grid_t = 0, grid_h = 0, grid_w = 0;  // patches along time, height, width
  int32_t patch_values = 0;                     // values per patch
  std::vector<float> pixel_values;              // [grid_t * grid_h * grid_w, patch_values]
  uint64_t content_hash = 0;                    // equal for equal pixel_values and grid
};

struct BackendRequest {
  std::string request_id;  // the OpenAI id ("chatcmpl-..."), for logs
  std::vector<int32_t> prompt_tokens;
  // Images in prompt order (shared: the n choices of a request are separate BackendRequests).
  std::vector<std::shared_ptr<const BackendImage>> images;
  SamplingOptions sampling;
  bool skip_special_tokens = true;  // false when the output parsers need the markers in the text
};

// One step's worth of progress of one request (several tokens with speculative decoding).
struct BackendEvent {
  std::vector<int32_t> tokens;  // new tokens (a final EOS / stop token included)
  std::vector<TokenLogprobs> logprobs;  // one per token when logprobs were asked for, else empty
  std::string text;             // their text: whole UTF-8 characters, stop strings removed
  bool done = false;            // last event of the request
  std::string finish_reason;    // on done: "stop", "length", "abort" or "error"
  std::string error;            // on "error": why
  // On "error": the backend cannot serve at all now (a rank of the model died): HTTP 503, not a
  // 500.
  bool unavailable = false;
  int32_t cached_tokens = 0;    // prompt tokens served from the prefix cache
  // Speculative decoding, running totals of the request (SGLang's meta_info names): verify steps,
  // drafts verified, drafts accepted. 0 without a draft.
  int32_t spec_verify_ct = 0;
  int32_t spec_draft_token_num = 0;
  int32_t spec_accept_token_num = 0;
  Clock::time_point time = Clock::now();
};

// One attention data-parallel rank's KV pool and prefix cache (BackendStats::dp_ranks).
struct DpRankKvStats {
  int32_t kv_pages_used = 0;
  int32_t kv_pages_cached = 0;
  int32_t kv_pages_total = 0;
  uint64_t prefix_cache_hit_tokens_total = 0;
  uint64_t num_preemptions_total = 0;
};

struct BackendStats {
  int32_t num_requests_running = 0;
  int32_t num_requests_waiting = 0;
  int32_t kv_pages_used = 0;
  int32_t kv_pages_cached = 0;
  int32_t kv_pages_total = 0;
  uint64_t prefix_cache_hit_tokens_total = 0;
  uint64_t num_preemptions_total = 0;
  // With attention data parallelism (--enable-dp-attention --dp D > 1): the same KV and prefix
  // cache numbers per DP rank, in rank order (/metrics labels them dp_rank="g" instead of the
  // totals above). Empty otherwise.
  std::vector<DpRankKvStats> dp_ranks;
  // Speculative decoding (empty / 0 without a draft): spec_accept_length_counts[n] = verify steps
  // that committed n tokens; drafts verified and accepted.
  std::vector<uint64_t> spec_accept_length_counts;
  uint64_t spec_draft_tokens_total = 0;
  uint64_t spec_accepted_tokens_total = 0;
  // HiCache (--enable-hierarchical-cache); rendered only when enabled. Load-back durations:
  // bucket upper bounds in seconds, per-bucket counts (not cumulative, one more for +Inf).
  bool hicache_enabled = false;
  int32_t hicache_host_pages_used = 0;
  uint64_t hicache_host_hit_tokens_total = 0;
  uint64_t hicache_disk_hit_tokens_total = 0;
  std::vector<double> hicache_load_seconds_bounds;
  std::vector<uint64_t> hicache_load_seconds_counts;
  double hicache_load_seconds_sum = 0;
};

// Called on the backend's thread for every event of a request, in order; must be cheap and must
// not block (the server only queues the event and wakes the connection's executor).
using EventCallback = std::function<void(BackendEvent)>;

class InferenceBackend {
 public:
  virtual ~InferenceBackend() = default;

  // True once weights are loaded and the backend accepts requests (/health).
  virtual bool ready() const = 0;
  // Not ok once the backend can serve nothing more (a rank of the model died): /health and new
  // requests answer 503 with this message.
  virtual Status failure() const { return Status::ok(); }
  // Maximum prompt + completion tokens per request.
  virtual int32_t context_length() const = 0;
  // The most requests submit() holds waiting at once (--max-queued-requests), 0 when unbounded.
  // A job of more choices than this can never be admitted, however idle the backend is.
  virtual int32_t max_queued_requests() const { return 0; }
  // Set when the model takes images: how the server pre-processes them (BackendRequest::images).
  // Unset: requests with images get 400 vision_not_available.
  virtual std::optional<VisionPreprocessConfig> vision() const { return std::nullopt; }

  // Queues a request. Errors: kInvalidArgument (HTTP 400), kResourceExhausted (the waiting queue
  // is full: HTTP 429). On success returns the id for cancel(); `on_event` is then called until an
  // event with done=true.
  virtual Result<uint64_t> submit(BackendRequest request, EventCallback on_event) = 0;
  // Thread-safe and idempotent: the request stops at the backend's next step and its last event
  // has finish_reason "abort" (unless it finished first).
  virtual void cancel(uint64_t id) = 0;

  virtual BackendStats stats() const = 0;
};

}  // namespace m3::server

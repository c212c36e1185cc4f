// One generation request being served: n choices per prompt (a /v1/completions batch has several
// prompts; choice index = prompt·n + i), each its own backend request, the n choices of a prompt
// sharing it (the engine's prefix cache makes the shared prompt cheap). Receives the backend's
// events (on the backend thread), and on the connection's strand runs each choice's output
// parsers and writes the SSE chunks or the final JSON response, with usage (prompt tokens once,
// completion tokens summed over the choices), logprobs and metrics. A client that disconnects
// has every choice cancelled at once (backend->cancel), streaming or not.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/parsers/output_parser.h"
#include "server/handlers/context.h"
#include "server/handlers/logprobs_json.h"
#include "server/http/http_server.h"

namespace m3::server {

struct GenerationConfig {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // every chunk carries the usage so far (vLLM's option)
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;
  int32_t n = 1;          // choices per prompt
  int32_t prompts = 1;    // prompts (a /v1/completions batch)
  bool logprobs = false;  // choices carry logprobs objects
  bool run_parsers = false;
  chat::OutputParserOptions parser;
  bool reasoning_field = false;  // message.reasoning_content is reported (reasoning parser on)
  bool parallel_tool_calls = true;  // false: only the first tool call is reported (OpenAI's field)
  std::string prefill;           // assistant text already in the prompt, parsed as output first
  std::vector<std::string> echo;  // /v1/completions echo: each prompt's text (empty: no echo)
  int32_t prompt_tokens = 0;      // summed over the prompts
  std::optional<int32_t> think_open_id, think_close_id;  // for counting reasoning tokens
  bool starts_in_reasoning = false;
  std::chrono::steady_clock::time_point arrival;
  bool health = false;  // /health_generate: answer {"status":"ok"} or 503, no completion body
};

// The seed of choice `index` when the request has `seed`: choice 0 keeps it (n = 1 behaves as
// before), the others get a SplitMix64 mix of (seed, index), so choices differ and the whole
// response is reproducible.
uint64_t choice_seed(uint64_t seed, int32_t index);

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(ServerContext& ctx, GenerationConfig config,
                std::shared_ptr<http::Responder> responder);
  ~GenerationJob();

  // The callback to give the backend for choice `index` (holds the job alive until its last
  // event).
  EventCallback callback(int32_t index);
  // After each successful submit: remembers the backend id (for cancel()).
  void started(int32_t index, uint64_t backend_id);
  // After the last successful submit: watches for a disconnect and lets events through (they
  // are held until then, so a failed submit of a later choice can still answer with an error).
  void all_started();
  // A later choice's submit failed: cancels the started ones and drops their events; the caller
  // answers with the error.
  void abandon();
  // Cancels every choice's backend request (client gone, timeout, shutdown).
  void cancel();

 private:
  // Per-choice state (strand-only, but for the atomics).
  struct Choice {
    int32_t index = 0;
    int32_t prompt = 0;  // index / n
    int32_t cached_tokens = 0;
    std::atomic<uint64_t> backend_id{0};
    std::atomic<bool> has_id{false};
    std::optional<chat::OutputParser> parser;
    std::optional<LogprobsBuilder> logprobs;
    bool started = false;  // prefill parsed (and, streaming, the role chunk sent)
    bool finished = false;
    std::string finish_reason;
    int32_t completion_tokens = 0;
    // Speculative decoding: the latest running totals of the choice's request (BackendEvent).
    int32_t spec_verify_ct = 0, spec_draft_token_num = 0, spec_accept_token_num = 0;
    int32_t reasoning_tokens = 0;
    bool in_reasoning = false;
    std::optional<std::chrono::steady_clock::time_point> last_token_time;
    chat::ParsedDelta message;  // non-streaming: the whole message
    std::vector<std::string> tool_call_ids;
  };

  void on_event(int32_t index, BackendEvent ev);  // backend thread
  void drain();                                   // connection strand
  void handle(Choice& c, BackendEvent& ev);
  void finish_choice(Choice& c, const BackendEvent& ev);
  void finish_all(std::chrono::steady_clock::time_point now);
  void fail(const std::string& error, bool unavailable = false);
  void emit_delta(Choice& c, chat::ParsedDelta&& d);
  // SSE chunk with one choice; `logprobs` is taken from the choice's builder when it has any.
  std::string chunk(Choice& c, nlohmann::ordered_json choice);
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json final_choice(Choice& c);
  const std::string& echo_of(const Choice& c) const;
  int32_t cached_tokens() const;  // usage's prompt_tokens_details.cached_tokens

  ServerContext& ctx_;
  GenerationConfig cfg_;
  std::shared_ptr<http::Responder> responder_;
  std::vector<std::unique_ptr<Choice>> choices_;

  std::mutex mu_;
  std::deque<std::pair<int32_t, BackendEvent>> pending_;
  bool drain_posted_ = false;
  bool released_ = false;   // all_started(): events flow
  bool abandoned_ = false;  // abandon(): events are dropped

  std::atomic<bool> cancel_requested_{false};
  // Strand-only.
  bool stream_started_ = false;
  bool done_ = false;  // the response is complete (or failed)
  bool first_token_seen_ = false;
};

std::string random_id(const char* prefix, size_t n = 24);

}  // namespace m3::server

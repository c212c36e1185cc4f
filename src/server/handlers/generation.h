// One generation request being served: receives the backend's events (on the backend thread),
// and on the connection's strand runs the output parsers and writes the SSE chunks or the final
// JSON response, with usage and metrics. A client that disconnects has its request cancelled at
// once (backend->cancel), streaming or not.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chat/parsers/output_parser.h"
#include "server/handlers/context.h"
#include "server/http/http_server.h"

namespace m3::server {

struct GenerationConfig {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;
  bool run_parsers = false;
  chat::OutputParserOptions parser;
  bool reasoning_field = false;  // message.reasoning_content is reported (reasoning parser on)
  std::string prefill;           // assistant text already in the prompt, parsed as output first
  std::string echo;              // /v1/completions echo: the prompt text
  int32_t prompt_tokens = 0;
  std::optional<int32_t> think_open_id, think_close_id;  // for counting reasoning tokens
  bool starts_in_reasoning = false;
  std::chrono::steady_clock::time_point arrival;
  bool health = false;  // /health_generate: answer {"status":"ok"} or 503, no completion body
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(ServerContext& ctx, GenerationConfig config,
                std::shared_ptr<http::Responder> responder);
  ~GenerationJob();

  // The callback to give the backend (holds the job alive until the last event).
  EventCallback callback();
  // After a successful submit: remembers the backend id and watches for a disconnect.
  void started(uint64_t backend_id);
  // Cancels the backend request (client gone, timeout, shutdown).
  void cancel();

 private:
  void on_event(BackendEvent ev);  // backend thread
  void drain();                    // connection strand
  void handle(BackendEvent& ev);
  void finish(const BackendEvent& ev);
  void emit_delta(chat::ParsedDelta&& d);
  std::string chunk(nlohmann::ordered_json choice) const;
  nlohmann::ordered_json usage_json() const;

  ServerContext& ctx_;
  GenerationConfig cfg_;
  std::shared_ptr<http::Responder> responder_;
  std::optional<chat::OutputParser> parser_;

  std::mutex mu_;
  std::deque<BackendEvent> pending_;
  bool drain_posted_ = false;

  // Strand-only state.
  std::atomic<uint64_t> backend_id_{0};
  std::atomic<bool> has_id_{false};
  std::atomic<bool> cancel_requested_{false};
  bool stream_started_ = false;
  bool finished_ = false;
  int32_t completion_tokens_ = 0;
  int32_t reasoning_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  bool in_reasoning_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_token_time_;
  chat::ParsedDelta message_;  // non-streaming: the whole message
  std::vector<std::string> tool_call_ids_;
};

std::string random_id(const char* prefix, size_t n = 24);

}  // namespace m3::server

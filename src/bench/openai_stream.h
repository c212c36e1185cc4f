// The OpenAI streaming protocol as the benchmark uses it: the request body for
// /v1/completions or /v1/chat/completions, and the per-request reading of its SSE stream into
// timings and token counts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "bench/sse_parser.h"
#include "bench/stats.h"
#include "bench/workload.h"

namespace m3::bench {

enum class Backend { kOpenAiCompletions, kOpenAiChat };

// "/v1/completions" or "/v1/chat/completions".
const char* backend_path(Backend backend);
const char* backend_name(Backend backend);

struct GenerationParams {
  std::string model;
  bool ignore_eos = true;  // fixed output lengths (max_tokens each), like sglang's random set
  double temperature = 0.0;
  std::string extra_body;  // a JSON object merged over the body (--extra-request-body); may be ""
};

// The JSON body: stream with usage, max_tokens = the request's output length, prompt as token
// ids (completions with ids) or text (completions with text, or one user message for chat).
// params.extra_body must already be a valid JSON object (the flag parser checks it).
// `history`: a multi-turn conversation's earlier messages, user and assistant alternating,
// before request.prompt_text (chat: as messages; completions: joined by '\n' into the prompt).
std::string request_body(Backend backend, const GenerationParams& params,
                         const BenchRequest& request,
                         const std::vector<std::string>& history = {});

// Follows one response stream. Feed it the body bytes with the time they arrived (seconds since
// the request was sent); finish() fills the result.
class StreamReader {
 public:
  // keep_text: collect the generated text into the result (multi-turn needs it for the next
  // turn; other runs skip the copy).
  explicit StreamReader(Backend backend, bool keep_text = false)
      : backend_(backend), keep_text_(keep_text) {}

  void on_bytes(std::string_view bytes, double now_s);
  // Completes `result` (already holding http_status, start_s and the planned prompt length) from
  // what was read: success needs HTTP 200, no error event and at least one text chunk.
  void finish(RequestResult& result, double end_s, const std::string& transport_error) const;

 private:
  void on_event(const std::string& data, double now_s);
  void append_text(const std::string& piece);

  Backend backend_;
  bool keep_text_ = false;
  SseParser parser_;
  std::string raw_;  // the body of a non-200 response (its error message), capped
  bool saw_done_ = false;
  int text_chunks_ = 0;
  double first_s_ = -1;
  double last_s_ = -1;
  std::vector<double> itl_s_;
  int usage_prompt_ = -1;
  int usage_completion_ = -1;
  int usage_cached_ = -1;
  std::string text_;  // generated text, capped
  std::string error_;  // an error event or an unparsable chunk
};

// The message of an OpenAI error body ({"error": {"message": ...}} or {"message": ...}), else
// the body itself, cut to a readable length.
std::string error_message_of(std::string_view body);

}  // namespace m3::bench

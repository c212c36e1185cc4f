// OpenAI request parsing and validation into typed structs. Every rejection is a 400 naming the
// offending field (param) and saying what is allowed; unknown fields are ignored (clients send
// many), fields we cannot honour yet are refused rather than silently ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "server/backend.h"
#include "server/protocol/errors.h"

namespace m3::server {

// A value or the error to send.
template <typename T>
using Parsed = std::variant<T, ApiError>;

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ImageRef {
  std::string url;
  std::string param;  // "messages[0].content[1].image_url.url"
};

// Upper bound on `n`: each choice is its own engine request (sharing the prompt's KV pages
// through the prefix cache), so n multiplies the decode work of one HTTP request.
inline constexpr int32_t kMaxChoices = 16;
// OpenAI's bounds: chat top_logprobs 0..20, completions logprobs 0..5.
inline constexpr int32_t kMaxChatTopLogprobs = 20;
inline constexpr int32_t kMaxCompletionLogprobs = 5;

struct CommonGeneration {
  std::string model;  // empty when the client sent none
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool continuous_usage = false;      // stream_options.continuous_usage_stats (vLLM's)
  std::optional<int32_t> max_tokens;  // max_tokens / max_completion_tokens
  SamplingOptions sampling;           // max_tokens filled in later from the context length
                                      // (logprobs / top_logprobs are set here too)
  int32_t n = 1;                      // independent choices, 1..kMaxChoices
  std::string user;
  // vLLM's truncate_prompt_tokens: keep only the prompt's last k tokens (-1: the context length).
  std::optional<int32_t> truncate_prompt_tokens;
  bool skip_special_tokens = true;  // vLLM's
};

struct ChatRequest {
  CommonGeneration gen;
  nlohmann::ordered_json messages;  // the chat template's input form (messages.h)
  std::vector<ImageRef> images;
  nlohmann::ordered_json tools;  // validated OpenAI tools array, or null
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;
  // Template variables: the request's chat_template_kwargs, with thinking_mode and
  // reasoning_effort resolved from the top-level fields.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::string thinking_mode;  // "enabled", "disabled" or "adaptive" (what the template gets)
  // mm_processor_kwargs (vLLM's field): the image processor's pixel bounds for this request.
  std::optional<int64_t> mm_min_pixels;
  std::optional<int64_t> mm_max_pixels;
  // vLLM's chat template options: open a new assistant turn (default), or continue the final
  // (assistant) message where it ends.
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// One prompt of /v1/completions: text, or token ids.
struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;  // when the prompt was given as token ids
};

// Upper bound on the prompts of one /v1/completions request (a batch: `prompt` as a list of
// strings or of token-id lists). Each prompt x n choices is its own engine request.
inline constexpr int32_t kMaxBatchedPrompts = 1024;

struct CompletionRequest {
  CommonGeneration gen;
  std::vector<CompletionPrompt> prompts;  // one, or a batch (choice index = prompt·n + i)
  bool echo = false;
};

Parsed<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body);
Parsed<CompletionRequest> parse_completion_request(const nlohmann::ordered_json& body);

// Body text -> JSON object, or a 400 for malformed JSON / a non-object.
Parsed<nlohmann::ordered_json> parse_json_body(const std::string& body);

}  // namespace m3::server

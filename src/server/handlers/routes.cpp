#include "server/handlers/routes.h"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>

#include "chat/parsers/markers_minimax_m3.h"
#include "server/handlers/generation.h"
#include "server/handlers/image_inputs.h"
#include "server/protocol/requests.h"

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {

void send_json(http::Responder& r, int status, const json& body) {
  r.send(status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

void send_error(ServerContext& ctx, http::Responder& r, const ApiError& e) {
  ctx.metrics->count_rejected(e.status);
  // A full queue clears as requests finish: tell the client when to retry (RFC 9110 10.2.3).
  http::Headers headers;
  if (e.status == 429) headers.emplace_back("Retry-After", "1");
  r.send(e.status, "application/json", e.body(), std::move(headers));
}

// An unexpected exception is the server's fault: a 500 that says so without echoing the
// exception's text (which can name internals), and the text on stderr for the operator.
void send_internal_error(ServerContext& ctx, http::Responder& r, const http::Request& req,
                         const char* what) {
  std::fprintf(stderr, "m3serve: internal error on %s %s: %s\n", req.method.c_str(),
               req.path.c_str(), what);
  send_error(ctx, r,
             internal_error("The server failed to process the request; the error is logged."));
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string rtrim(std::string s) {
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
    s.pop_back();
  return s;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A template that cannot render the request is the request's fault (400), unless the model is
// not loaded yet (503).
ApiError render_error(const Status& status) {
  if (status.code() == StatusCode::kUnavailable) return from_status(status);
  return bad_request("Cannot render the chat template: " + status.message(), "messages");
}

// Unavailable states refuse new generation with 503.
std::optional<ApiError> check_available(ServerContext& ctx) {
  if (ctx.draining.load()) {
    return unavailable("The server is shutting down and accepts no new requests.", "draining");
  }
  if (!ctx.backend->ready()) return unavailable("The model is still loading.", "loading");
  if (Status failed = ctx.backend->failure(); !failed.is_ok()) {
    return unavailable(failed.message(), "model_failed");
  }
  return std::nullopt;
}

std::optional<ApiError> check_model(ServerContext& ctx, const std::string& model) {
  if (model.empty()) return std::nullopt;  // lenient: the only model
  for (const auto& n : ctx.options.served_model_names)
    if (n == model) return std::nullopt;
  if (model == ctx.options.model_path && !model.empty()) return std::nullopt;
  return model_not_found(model);
}

// Prompt length vs the context: a 400 with both numbers, or the max_tokens to use.
std::variant<int32_t, ApiError> resolve_max_tokens(ServerContext& ctx, int32_t prompt_tokens,
                                                   std::optional<int32_t> requested,
                                                   const char* prompt_name) {
  int32_t limit = ctx.context_length();
  if (limit <= 0) return requested.value_or(4096);
  if (prompt_tokens >= limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) +
                           " tokens. However, your " + prompt_name + " resulted in " +
                           std::to_string(prompt_tokens) +
                           " tokens, leaving no room for the completion. Please shorten it.",
                       prompt_name, "context_length_exceeded");
  }
  if (requested && int64_t(prompt_tokens) + *requested > limit) {
    return bad_request("This model's maximum context length is " + std::to_string(limit) +
                           " tokens. However, you requested " +
                           std::to_string(int64_t(prompt_tokens) + *requested) + " tokens (" +
                           std::to_string(prompt_tokens) + " in the " + prompt_name + ", " +
                           std::to_string(*requested) +
                           " in the completion). Please reduce the length of the " + prompt_name +
                           " or the completion.",
                       "max_tokens", "context_length_exceeded");
  }
  return requested.value_or(limit - prompt_tokens);
}

bool parsers_enabled(const std::string& name) {
  return !name.empty() && name != "none";
}

// continue_final_message: the rendered prompt ends where the final message's text ends (the
// template's end-of-turn markup after it is dropped), as vLLM does it.
std::optional<ApiError> cut_after_final_message(std::string& prompt, const json& message) {
  std::string text;
  if (auto c = message.find("content"); c != message.end()) {
    if (c->is_string()) {
      text = c->get<std::string>();
    } else if (c->is_array()) {
      for (const auto& part : *c)
        if (part.value("type", "") == "text") text = part.value("text", "");
    }
  }
  const size_t at = text.empty() ? std::string::npos : prompt.rfind(text);
  if (at == std::string::npos) {
    return bad_request("'continue_final_message' needs the final message to have text that the "
                       "chat template writes out; it has none.",
                       "continue_final_message");
  }
  prompt.resize(at + text.size());
  return std::nullopt;
}

// vLLM's truncate_prompt_tokens: the prompt's last `keep` tokens (-1: the context length).
// Refused for prompts with images, whose placeholder runs must stay whole.
std::optional<ApiError> truncate_prompt(ServerContext& ctx, std::vector<int32_t>& tokens,
                                        std::optional<int32_t> keep, bool has_images) {
  if (!keep) return std::nullopt;
  const int64_t k = *keep < 0 ? ctx.context_length() : *keep;
  if (k <= 0 || static_cast<int64_t>(tokens.size()) <= k) return std::nullopt;
  if (has_images) {
    return bad_request("'truncate_prompt_tokens' cannot cut a prompt with images.",
                       "truncate_prompt_tokens", "unsupported_parameter");
  }
  tokens.erase(tokens.begin(), tokens.end() - k);
  return std::nullopt;
}

// Submits one backend request per choice (each with its derived seed) and starts the job:
// `prompts` holds one backend request per prompt (a /v1/completions batch has several), each
// submitted cfg.n times; choice index = prompt·n + i. Choice i of every prompt gets the same seed
// as choice i of that prompt sent alone, so a batch answers as its prompts would one by one.
void submit_job(ServerContext& ctx, std::shared_ptr<http::Responder> responder,
                GenerationConfig cfg, std::vector<BackendRequest> prompts) {
  if (auto e = check_available(ctx)) return send_error(ctx, *responder, *e);
  const int32_t n = std::max(1, cfg.n);
  const auto p = static_cast<int32_t>(prompts.size());
  cfg.n = n;
  cfg.prompts = p;
  // Every choice waits in the backend's queue at once: more than it holds can never be admitted,
  // so that is the request's fault (400), not a retryable 429.
  if (const int32_t cap = ctx.backend->max_queued_requests(); cap > 0 && int64_t{n} * p > cap) {
    const std::string what = p > 1 ? std::to_string(p) + " prompts x 'n' = " + std::to_string(n)
                                    : "'n' = " + std::to_string(n);
    return send_error(ctx, *responder,
                      bad_request(what + " choices can never be admitted: "
                                  "this server queues at most " + std::to_string(cap) +
                                  " requests at once (--max-queued-requests).",
                                  p > 1 ? "prompt" : "n", "n_exceeds_queue"));
  }
  const std::string id = cfg.id;
  auto job = std::make_shared<GenerationJob>(ctx, std::move(cfg), responder);
  for (int32_t k = 0; k < p; ++k) {
    for (int32_t i = 0; i < n; ++i) {
      const int32_t index = k * n + i;
      BackendRequest b = i + 1 < n ? prompts[k] : std::move(prompts[k]);
      if (n * p > 1) b.request_id = id + "-" + std::to_string(index);
      if (b.sampling.seed) b.sampling.seed = choice_seed(*b.sampling.seed, i);
      auto backend_id = ctx.backend->submit(std::move(b), job->callback(index));
      if (!backend_id.is_ok()) {
        job->abandon();
        return send_error(ctx, *responder, submit_error(backend_id.status()));
      }
      job->started(index, *backend_id);
    }
  }
  job->all_started();
}

void handle_chat(ServerContext& ctx, const http::Request& req,
                 std::shared_ptr<http::Responder> responder) {
  auto body = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(ctx, *responder, *e);
  auto parsed = parse_chat_request(std::get<json>(body));
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ctx, *responder, *e);
  ChatRequest& r = std::get<ChatRequest>(parsed);
  if (auto e = check_model(ctx, r.gen.model)) return send_error(ctx, *responder, *e);

  std::vector<std::shared_ptr<BackendImage>> images;
  if (!r.images.empty()) {
    const std::optional<VisionPreprocessConfig> vision = ctx.backend->vision();
    if (!vision) {
      for (const auto& img : r.images) {
        auto checked = check_image_url(img.url, img.param, ctx.options.media);
        if (auto* e = std::get_if<ApiError>(&checked)) return send_error(ctx, *responder, *e);
      }
      return send_error(ctx, *responder,
                        bad_request("Image input is not available: this model has no vision "
                                    "tower (no vision_config and vision weights in its "
                                    "checkpoint). Send text only.",
                                    r.images.front().param, "vision_not_available"));
    }
    auto prepared = prepare_images(r.images, ctx.options.media, *vision,
                                   PreprocessOverrides{r.mm_min_pixels, r.mm_max_pixels});
    if (auto* e = std::get_if<ApiError>(&prepared)) return send_error(ctx, *responder, *e);
    images = std::move(std::get<std::vector<std::shared_ptr<BackendImage>>>(prepared));
  }

  bool reasoning_on = parsers_enabled(ctx.options.reasoning_parser);
  bool tools_on = parsers_enabled(ctx.options.tool_call_parser) && r.tools.is_array() &&
                  r.tool_choice != ToolChoice::kNone;
  json tools_for_template = r.tool_choice == ToolChoice::kNone ? json() : r.tools;
  auto rendered = ctx.renderer->render(r.messages, tools_for_template, r.template_kwargs,
                                       r.add_generation_prompt);
  if (!rendered.is_ok()) {
    return send_error(ctx, *responder, render_error(rendered.status()));
  }
  std::string prompt = std::move(rendered).value();
  if (r.continue_final_message) {
    if (auto e = cut_after_final_message(prompt, r.messages.back()))
      return send_error(ctx, *responder, *e);
  }
  if (!images.empty()) {
    auto expanded = expand_image_placeholders(prompt, images, "messages");
    if (auto* e = std::get_if<ApiError>(&expanded)) return send_error(ctx, *responder, *e);
    prompt = std::move(std::get<std::string>(expanded));
  }

  GenerationConfig cfg;
  cfg.chat = true;
  cfg.stream = r.gen.stream;
  cfg.include_usage = r.gen.include_usage;
  cfg.continuous_usage = r.gen.continuous_usage;
  cfg.id = random_id("chatcmpl-");
  cfg.model = ctx.model_name();
  cfg.created = unix_now();
  cfg.arrival = req.received;
  cfg.n = r.gen.n;
  cfg.logprobs = r.gen.sampling.logprobs;
  cfg.run_parsers = reasoning_on || tools_on;
  cfg.reasoning_field = reasoning_on;
  cfg.parallel_tool_calls = r.parallel_tool_calls;
  cfg.parser.reasoning = reasoning_on;
  cfg.parser.reasoning_start = chat::MiniMaxM3ReasoningParser::start_for_prompt(prompt);
  cfg.parser.tools = tools_on;
  cfg.parser.continues_content = r.continue_final_message;
  if (tools_on) cfg.parser.tools_json = r.tools;
  cfg.starts_in_reasoning =
      cfg.parser.reasoning_start == chat::MiniMaxM3ReasoningParser::Start::kReasoning;

  // tool_choice required / named: without a grammar engine, force the call by starting the
  // assistant turn with the tool-call markup (closing any reasoning first). The parser reads
  // that prefill as output, so the call (and its name) is reported as generated.
  if (tools_on && (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed)) {
    using namespace chat::minimax_m3;
    std::string prefill;
    if (!ends_with(rtrim(prompt), kThinkClose)) prefill += std::string(kThinkClose) + "\n";
    prefill += std::string(kToolCallOpen) + "\n";
    if (r.tool_choice == ToolChoice::kNamed) {
      prefill += std::string(kNs) + "<invoke name=\"" + r.tool_choice_name + "\">";
    }
    cfg.prefill = prefill;
    cfg.starts_in_reasoning = false;
  }

  auto tokens = ctx.codec->encode(prompt + cfg.prefill);
  if (!tokens.is_ok()) return send_error(ctx, *responder, from_status(tokens.status()));
  if (!images.empty()) {
    const auto image_id = ctx.codec->token_id(kImageToken);
    if (!image_id) {
      return send_error(ctx, *responder,
                        internal_error("The tokenizer has no image token " +
                                                std::string(kImageToken) + "."));
    }
    if (auto e = place_image_tokens(*tokens, *image_id, images, "messages")) {
      return send_error(ctx, *responder, *e);
    }
  }
  if (auto e = truncate_prompt(ctx, *tokens, r.gen.truncate_prompt_tokens, !images.empty()))
    return send_error(ctx, *responder, *e);
  cfg.prompt_tokens = static_cast<int32_t>(tokens->size());
  auto mt = resolve_max_tokens(ctx, cfg.prompt_tokens, r.gen.max_tokens, "messages");
  if (auto* e = std::get_if<ApiError>(&mt)) return send_error(ctx, *responder, *e);

  if (reasoning_on) {
    cfg.think_open_id = ctx.codec->token_id(chat::minimax_m3::kThinkOpen);
    cfg.think_close_id = ctx.codec->token_id(chat::minimax_m3::kThinkClose);
  } else {
    cfg.starts_in_reasoning = false;
  }
  BackendRequest breq;
  breq.request_id = cfg.id;
  breq.prompt_tokens = std::move(tokens).value();
  breq.images.assign(images.begin(), images.end());
  breq.sampling = r.gen.sampling;
  breq.sampling.max_tokens = std::get<int32_t>(mt);
  // The parsers need the think and namespace markers, which are special tokens (they take the
  // ones they own out of the output).
  breq.skip_special_tokens = !cfg.run_parsers && r.gen.skip_special_tokens;
  std::vector<BackendRequest> prompts;
  prompts.push_back(std::move(breq));
  submit_job(ctx, responder, std::move(cfg), std::move(prompts));
}

void handle_completion(ServerContext& ctx, const http::Request& req,
                       std::shared_ptr<http::Responder> responder) {
  auto body = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(ctx, *responder, *e);
  auto parsed = parse_completion_request(std::get<json>(body));
  if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ctx, *responder, *e);
  CompletionRequest& r = std::get<CompletionRequest>(parsed);
  if (auto e = check_model(ctx, r.gen.model)) return send_error(ctx, *responder, *e);

  GenerationConfig cfg;
  cfg.chat = false;
  cfg.stream = r.gen.stream;
  cfg.include_usage = r.gen.include_usage;
  cfg.continuous_usage = r.gen.continuous_usage;
  cfg.id = random_id("cmpl-");
  cfg.model = ctx.model_name();
  cfg.created = unix_now();
  cfg.arrival = req.received;
  cfg.n = r.gen.n;
  cfg.logprobs = r.gen.sampling.logprobs;
  const bool batch = r.prompts.size() > 1;
  std::vector<BackendRequest> prompts;
  for (size_t k = 0; k < r.prompts.size(); ++k) {
    const CompletionPrompt& prompt = r.prompts[k];
    const std::string param = batch ? "prompt[" + std::to_string(k) + "]" : "prompt";
    std::vector<int32_t> tokens = prompt.tokens;
    std::string text;
    if (prompt.text) {
      auto t = ctx.codec->encode(*prompt.text);
      if (!t.is_ok()) return send_error(ctx, *responder, from_status(t.status()));
      tokens = std::move(t).value();
      text = *prompt.text;
    } else {
      for (int32_t t : tokens) {
        if (t < 0 || t >= ctx.codec->vocab_size()) {
          return send_error(ctx, *responder,
                            bad_request("Token id " + std::to_string(t) + " in '" + param +
                                            "' is out of range [0, " +
                                            std::to_string(ctx.codec->vocab_size()) + ").",
                                        param));
        }
      }
      if (r.echo) text = ctx.codec->decode(tokens, false).value();
    }
    const size_t untruncated = tokens.size();
    if (auto e = truncate_prompt(ctx, tokens, r.gen.truncate_prompt_tokens, false))
      return send_error(ctx, *responder, *e);
    if (r.echo && tokens.size() != untruncated) text = ctx.codec->decode(tokens, false).value();
    if (r.echo) cfg.echo.push_back(text);
    auto mt = resolve_max_tokens(ctx, static_cast<int32_t>(tokens.size()), r.gen.max_tokens,
                                 param.c_str());
    if (auto* e = std::get_if<ApiError>(&mt)) return send_error(ctx, *responder, *e);
    cfg.prompt_tokens += static_cast<int32_t>(tokens.size());
    BackendRequest breq;
    breq.request_id = cfg.id;
    breq.prompt_tokens = std::move(tokens);
    breq.sampling = r.gen.sampling;
    breq.sampling.max_tokens = std::get<int32_t>(mt);
    breq.skip_special_tokens = r.gen.skip_special_tokens;
    prompts.push_back(std::move(breq));
  }
  submit_job(ctx, responder, std::move(cfg), std::move(prompts));
}

void handle_tokenize(ServerContext& ctx, const http::Request& req, http::Responder& responder) {
  auto body = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(ctx, responder, *e);
  const json& b = std::get<json>(body);
  std::string text;
  if (b.contains("messages")) {
    auto parsed = parse_chat_request(b);
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(ctx, responder, *e);
    ChatRequest& r = std::get<ChatRequest>(parsed);
    // As for chat: tool_choice none leaves the tools out of the prompt (counts match usage), and
    // add_generation_prompt / continue_final_message shape the end of the prompt.
    json tools = r.tool_choice == ToolChoice::kNone ? json() : r.tools;
    auto rendered =
        ctx.renderer->render(r.messages, tools, r.template_kwargs, r.add_generation_prompt);
    if (!rendered.is_ok()) {
      return send_error(ctx, responder, render_error(rendered.status()));
    }
    if (r.continue_final_message) {
      if (auto e = cut_after_final_message(*rendered, r.messages.back()))
        return send_error(ctx, responder, *e);
    }
    text = std::move(rendered).value();
  } else if (b.contains("prompt") && b["prompt"].is_string()) {
    text = b["prompt"].get<std::string>();
  } else {
    return send_error(ctx, responder,
                      bad_request("Send 'prompt' (a string) or 'messages'.", "prompt"));
  }
  auto tokens = ctx.codec->encode(text);
  if (!tokens.is_ok()) return send_error(ctx, responder, from_status(tokens.status()));
  send_json(
      responder, 200,
      {{"tokens", *tokens}, {"count", tokens->size()}, {"max_model_len", ctx.context_length()}});
}

void handle_detokenize(ServerContext& ctx, const http::Request& req, http::Responder& responder) {
  auto body = parse_json_body(req.body);
  if (auto* e = std::get_if<ApiError>(&body)) return send_error(ctx, responder, *e);
  const json& b = std::get<json>(body);
  if (!b.contains("tokens") || !b["tokens"].is_array()) {
    return send_error(ctx, responder,
                      bad_request("'tokens' must be a list of integers.", "tokens"));
  }
  // Ids outside the vocabulary are refused (the tokenizer would drop them silently), as in the
  // completions prompt; a huge integer is not truncated into a valid-looking id.
  const int64_t vocab = ctx.codec->vocab_size();
  std::vector<int32_t> ids;
  for (const auto& t : b["tokens"]) {
    if (!t.is_number_integer()) {
      return send_error(ctx, responder,
                        bad_request("'tokens' must be a list of integers.", "tokens"));
    }
    const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(vocab)
                                                 : t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
    if (!in_range) {
      return send_error(ctx, responder,
                        bad_request("Token id " + t.dump() + " in 'tokens' is out of range [0, " +
                                        std::to_string(vocab) + ").",
                                    "tokens"));
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  bool skip_special = false;
  if (auto it = b.find("skip_special_tokens"); it != b.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return send_error(ctx, responder,
                        bad_request("'skip_special_tokens' must be a boolean.",
                                    "skip_special_tokens"));
    }
    skip_special = it->get<bool>();
  }
  auto text = ctx.codec->decode(ids, skip_special);
  if (!text.is_ok()) {
    return send_error(ctx, responder, bad_request(text.status().message(), "tokens"));
  }
  send_json(responder, 200, {{"prompt", *text}});
}

json model_card(ServerContext& ctx, const std::string& name) {
  return {{"id", name},
          {"object", "model"},
          {"created", unix_now()},
          {"owned_by", "m3serve"},
          {"root", ctx.options.model_path.empty() ? name : ctx.options.model_path},
          {"parent", nullptr},
          {"max_model_len", ctx.context_length()}};
}

// /health_generate: one token of generation through the whole stack, with a time limit.
void handle_health_generate(ServerContext& ctx, std::shared_ptr<http::Responder> responder) {
  if (auto e = check_available(ctx)) return send_error(ctx, *responder, *e);
  GenerationConfig cfg;
  cfg.health = true;
  cfg.id = random_id("health-");
  cfg.model = ctx.model_name();
  cfg.arrival = std::chrono::steady_clock::now();
  BackendRequest breq;
  breq.request_id = cfg.id;
  auto tokens = ctx.codec->encode("Hi");
  breq.prompt_tokens = tokens.is_ok() && !tokens->empty() ? *tokens : std::vector<int32_t>{0};
  breq.sampling.max_tokens = 1;
  auto job = std::make_shared<GenerationJob>(ctx, std::move(cfg), responder);
  auto id = ctx.backend->submit(std::move(breq), job->callback(0));
  if (!id.is_ok()) {
    job->abandon();
    return responder->send(503, "application/json",
                           unavailable(id.status().message(), "health_generate_failed").body());
  }
  job->started(0, *id);
  job->all_started();
  // The watchdog holds the job weakly: it ends as soon as the job does.
  std::weak_ptr<GenerationJob> weak = job;
  auto deadline = std::chrono::steady_clock::now() + ctx.options.health_generate_timeout;
  std::thread([weak, deadline] {
    while (std::chrono::steady_clock::now() < deadline) {
      if (weak.expired()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (auto j = weak.lock()) j->cancel();
  }).detach();
}

}  // namespace

bool authorized(const std::string& api_key, const std::string& header) {
  // "Bearer" SP+ token (RFC 9110 11.1: the scheme is case-insensitive; RFC 6750 2.1).
  static constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return false;
  }
  size_t start = kScheme.size();
  if (header[start] != ' ') return false;
  while (start < header.size() && header[start] == ' ') ++start;
  const std::string_view token(header.data() + start, header.size() - start);
  // Constant time in the length of the expected key.
  unsigned char diff = token.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < api_key.size(); ++i) {
    unsigned char h = i < token.size() ? static_cast<unsigned char>(token[i]) : 0;
    diff |= h ^ static_cast<unsigned char>(api_key[i]);
  }
  return diff == 0;
}

void handle_request(ServerContext& ctx, http::Request&& request,
                    std::shared_ptr<http::Responder> responder) {
  ctx.metrics->http_requests_total.fetch_add(1);
  const std::string& path = request.path;
  const std::string& method = request.method;

  if (path == "/health") {
    if (method != "GET" && method != "HEAD")
      return send_error(ctx, *responder, method_not_allowed(method, path));
    if (!ctx.backend->ready()) {
      return responder->send(503, "application/json",
                             unavailable("The model is still loading.", "loading").body());
    }
    if (Status failed = ctx.backend->failure(); !failed.is_ok()) {
      return responder->send(503, "application/json",
                             unavailable(failed.message(), "model_failed").body());
    }
    if (ctx.draining.load()) {
      return responder->send(503, "application/json",
                             unavailable("The server is shutting down.", "draining").body());
    }
    return responder->send(200, "application/json", "{\"status\":\"ok\"}");
  }
  if (!ctx.options.api_key.empty() &&
      !authorized(ctx.options.api_key, request.header("authorization"))) {
    return send_error(ctx, *responder, unauthorized());
  }

  struct Route {
    const char* path;
    const char* method;
    bool heavy;  // runs on the worker pool (parse, render, tokenize)
  };
  static const Route kRoutes[] = {
      {"/v1/chat/completions", "POST", true},
      {"/v1/completions", "POST", true},
      {"/tokenize", "POST", true},
      {"/detokenize", "POST", true},
      {"/v1/models", "GET", false},
      {"/metrics", "GET", false},
      {"/health_generate", "GET", false},
      {"/version", "GET", false},
  };
  const Route* route = nullptr;
  for (const auto& r : kRoutes)
    if (path == r.path) route = &r;
  if (!route && path.rfind("/v1/models/", 0) == 0) {
    if (method != "GET") return send_error(ctx, *responder, method_not_allowed(method, path));
    std::string id = path.substr(std::string("/v1/models/").size());
    for (const auto& n : ctx.options.served_model_names) {
      if (n == id) return send_json(*responder, 200, model_card(ctx, n));
    }
    return send_error(ctx, *responder, model_not_found(id));
  }
  if (!route) {
    return send_error(ctx, *responder,
                      not_found("Unknown route " + method + " " + path + ".", "unknown_route"));
  }
  if (method != route->method) return send_error(ctx, *responder, method_not_allowed(method, path));

  if (path == "/v1/models") {
    json data = json::array();
    for (const auto& n : ctx.options.served_model_names) data.push_back(model_card(ctx, n));
    return send_json(*responder, 200, {{"object", "list"}, {"data", data}});
  }
  if (path == "/metrics") {
    if (ctx.open_connections) ctx.metrics->http_connections_open.store(ctx.open_connections());
    if (ctx.refused_connections) {
      ctx.metrics->http_connections_refused_total.store(ctx.refused_connections());
    }
    return responder->send(
        200, "text/plain; version=0.0.4; charset=utf-8",
        ctx.metrics->render(ctx.backend->stats(), ctx.backend->ready(), ctx.draining.load()));
  }
  if (path == "/health_generate") return handle_health_generate(ctx, responder);
  if (path == "/version") {  // vLLM's route
    return send_json(*responder, 200,
                     {{"version", ctx.options.version.empty() ? "unknown" : ctx.options.version}});
  }

  // Heavy routes: off the I/O thread.
  boost::asio::post(*ctx.workers, [&ctx, req = std::move(request), responder]() mutable {
    try {
      if (req.path == "/v1/chat/completions")
        handle_chat(ctx, req, responder);
      else if (req.path == "/v1/completions")
        handle_completion(ctx, req, responder);
      else if (req.path == "/tokenize")
        handle_tokenize(ctx, req, *responder);
      else if (req.path == "/detokenize")
        handle_detokenize(ctx, req, *responder);
    } catch (const std::exception& e) {
      send_internal_error(ctx, *responder, req, e.what());
    }
  });
}

}  // namespace m3::server

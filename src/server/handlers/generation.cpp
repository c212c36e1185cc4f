#include "server/handlers/generation.h"

#include <random>

#include "server/protocol/errors.h"

namespace m3::server {

using json = nlohmann::ordered_json;

std::string random_id(const char* prefix, size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s = prefix;
  for (size_t i = 0; i < n; ++i) s += kChars[rng() % 62];
  return s;
}

namespace {

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

GenerationJob::GenerationJob(ServerContext& ctx, GenerationConfig config,
                             std::shared_ptr<http::Responder> responder)
    : ctx_(ctx), cfg_(std::move(config)), responder_(std::move(responder)) {
  ctx_.in_flight.fetch_add(1);
  ctx_.metrics->requests_in_flight.fetch_add(1);
  if (cfg_.run_parsers) parser_.emplace(cfg_.parser);
  in_reasoning_ = cfg_.starts_in_reasoning;
}

GenerationJob::~GenerationJob() {
  if (has_id_.load()) {
    std::lock_guard lock(ctx_.live_mu);
    ctx_.live_ids.erase(backend_id_.load());
  }
  ctx_.metrics->requests_in_flight.fetch_sub(1);
  ctx_.in_flight.fetch_sub(1);
}

EventCallback GenerationJob::callback() {
  return [self = shared_from_this()](BackendEvent ev) { self->on_event(std::move(ev)); };
}

void GenerationJob::started(uint64_t backend_id) {
  backend_id_.store(backend_id);
  {
    std::lock_guard lock(ctx_.live_mu);
    ctx_.live_ids.insert(backend_id);
  }
  has_id_.store(true);
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  responder_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->cancel();
  });
  if (cancel_requested_.load()) cancel();
}

void GenerationJob::cancel() {
  cancel_requested_.store(true);
  if (has_id_.load()) ctx_.backend->cancel(backend_id_.load());
}

void GenerationJob::on_event(BackendEvent ev) {
  std::lock_guard lock(mu_);
  pending_.push_back(std::move(ev));
  if (drain_posted_) return;
  drain_posted_ = true;
  responder_->post([self = shared_from_this()] { self->drain(); });
}

void GenerationJob::drain() {
  std::deque<BackendEvent> events;
  {
    std::lock_guard lock(mu_);
    events.swap(pending_);
    drain_posted_ = false;
  }
  for (auto& ev : events) {
    if (finished_) break;
    handle(ev);
  }
}

std::string GenerationJob::chunk(json choice) const {
  json j = {{"id", cfg_.id},
            {"object", cfg_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", cfg_.created},
            {"model", cfg_.model},
            {"choices", json::array({std::move(choice)})}};
  return sse(j);
}

json GenerationJob::usage_json() const {
  return {{"prompt_tokens", cfg_.prompt_tokens},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", cfg_.prompt_tokens + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}}};
}

void GenerationJob::emit_delta(chat::ParsedDelta&& d) {
  if (d.empty()) return;
  // Every call gets an id when it begins (the same id in the streamed and whole forms).
  for (const auto& c : d.tool_calls) {
    if (c.begins) tool_call_ids_.push_back(random_id("call_"));
  }
  if (!cfg_.stream) {
    message_.append(std::move(d));
    return;
  }
  auto base = [&](json delta) {
    return json{{"index", 0},
                {"delta", std::move(delta)},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
  };
  std::string out;
  if (!cfg_.chat) {
    out += chunk(
        {{"index", 0}, {"text", d.content}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
  } else {
    if (!d.reasoning.empty()) out += chunk(base({{"reasoning_content", d.reasoning}}));
    if (!d.content.empty()) out += chunk(base({{"content", d.content}}));
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& c : d.tool_calls) {
        json fn = {{"arguments", c.arguments}};
        json call = {{"index", c.index}};
        if (c.begins) {
          fn["name"] = c.name;
          call["id"] = tool_call_ids_.at(c.index);
          call["type"] = "function";
        }
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      out += chunk(base({{"tool_calls", std::move(calls)}}));
    }
  }
  if (!out.empty()) responder_->send_event(std::move(out));
}

void GenerationJob::handle(BackendEvent& ev) {
  auto now = ev.time;
  if (cfg_.stream && !stream_started_) {
    stream_started_ = true;
    responder_->start_stream();
    if (cfg_.chat) {
      responder_->send_event(chunk({{"index", 0},
                                    {"delta", {{"role", "assistant"}, {"content", ""}}},
                                    {"logprobs", nullptr},
                                    {"finish_reason", nullptr}}));
    }
    if (!cfg_.echo.empty()) {
      responder_->send_event(chunk(
          {{"index", 0}, {"text", cfg_.echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
    }
    if (parser_ && !cfg_.prefill.empty()) emit_delta(parser_->feed(cfg_.prefill));
  } else if (!cfg_.stream && !stream_started_) {
    stream_started_ = true;
    if (parser_ && !cfg_.prefill.empty()) emit_delta(parser_->feed(cfg_.prefill));
  }
  cached_tokens_ = std::max(cached_tokens_, ev.cached_tokens);
  if (!ev.tokens.empty()) {
    auto& m = *ctx_.metrics;
    if (!last_token_time_) {
      m.time_to_first_token.observe(seconds(now - cfg_.arrival));
    } else {
      // A step's gap is shared by the tokens it produced (speculative decoding: several).
      double gap = seconds(now - *last_token_time_) / double(ev.tokens.size());
      for (size_t i = 0; i < ev.tokens.size(); ++i) m.inter_token_latency.observe(gap);
    }
    last_token_time_ = now;
    completion_tokens_ += static_cast<int32_t>(ev.tokens.size());
    for (int32_t t : ev.tokens) {
      if (cfg_.think_open_id && t == *cfg_.think_open_id) in_reasoning_ = true;
      if (in_reasoning_) ++reasoning_tokens_;
      if (cfg_.think_close_id && t == *cfg_.think_close_id) in_reasoning_ = false;
    }
  }
  if (!ev.text.empty()) {
    if (parser_) {
      emit_delta(parser_->feed(ev.text));
    } else {
      chat::ParsedDelta d;
      d.content = ev.text;
      emit_delta(std::move(d));
    }
  }
  if (ev.done) finish(ev);
}

void GenerationJob::finish(const BackendEvent& ev) {
  finished_ = true;
  if (parser_) emit_delta(parser_->finish());
  std::string reason = ev.finish_reason.empty() ? "stop" : ev.finish_reason;
  if (cfg_.health) {
    if (reason == "error" || reason == "abort") {
      ApiError e = unavailable(reason == "abort" ? "Generation did not finish in time."
                                                 : "Generation failed: " + ev.error,
                               "health_generate_failed");
      responder_->send(e.status, "application/json", e.body());
    } else {
      responder_->send(200, "application/json", "{\"status\":\"ok\"}");
    }
    return;
  }
  bool has_calls = !tool_call_ids_.empty();
  if (reason == "stop" && has_calls) reason = "tool_calls";

  auto& m = *ctx_.metrics;
  m.count_finished(reason);
  m.prompt_tokens_total.fetch_add(cfg_.prompt_tokens);
  m.generation_tokens_total.fetch_add(completion_tokens_);
  m.reasoning_tokens_total.fetch_add(reasoning_tokens_);
  m.e2e_request_latency.observe(seconds(ev.time - cfg_.arrival));
  m.request_prompt_tokens.observe(cfg_.prompt_tokens);
  m.request_generation_tokens.observe(completion_tokens_);

  if (reason == "abort" && responder_->disconnected()) return;  // nobody to tell

  if (cfg_.stream) {
    if (reason == "error") {
      ApiError e = internal_error("Generation failed: " + ev.error);
      responder_->send_event(sse(e.to_json()));
    } else {
      std::string out;
      if (cfg_.chat) {
        out += chunk({{"index", 0},
                      {"delta", json::object()},
                      {"logprobs", nullptr},
                      {"finish_reason", reason}});
      } else {
        out +=
            chunk({{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}});
      }
      if (cfg_.include_usage) {
        json u = {{"id", cfg_.id},
                  {"object", cfg_.chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", cfg_.created},
                  {"model", cfg_.model},
                  {"choices", json::array()},
                  {"usage", usage_json()}};
        out += sse(u);
      }
      responder_->send_event(std::move(out));
    }
    responder_->send_event("data: [DONE]\n\n");
    responder_->end_stream();
    return;
  }

  if (reason == "error") {
    ApiError e = internal_error("Generation failed: " + ev.error);
    responder_->send(e.status, "application/json", e.body());
    return;
  }
  json choice;
  if (cfg_.chat) {
    json msg = {{"role", "assistant"}};
    msg["content"] =
        (message_.content.empty() && has_calls) ? json(nullptr) : json(message_.content);
    if (cfg_.reasoning_field) {
      msg["reasoning_content"] =
          message_.reasoning.empty() ? json(nullptr) : json(message_.reasoning);
    }
    if (has_calls) {
      json calls = json::array();
      for (const auto& c : message_.tool_calls) {
        calls.push_back({{"id", tool_call_ids_.at(c.index)},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    choice = {{"index", 0},
              {"message", std::move(msg)},
              {"logprobs", nullptr},
              {"finish_reason", reason}};
  } else {
    choice = {{"index", 0},
              {"text", cfg_.echo + message_.content},
              {"logprobs", nullptr},
              {"finish_reason", reason}};
  }
  json body = {{"id", cfg_.id},
               {"object", cfg_.chat ? "chat.completion" : "text_completion"},
               {"created", cfg_.created},
               {"model", cfg_.model},
               {"choices", json::array({std::move(choice)})},
               {"usage", usage_json()}};
  responder_->send(200, "application/json",
                   body.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace m3::server

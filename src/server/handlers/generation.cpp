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

uint64_t choice_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // SplitMix64 finalizer of seed + index * golden ratio: well-spread, deterministic.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
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
  if (cfg_.n < 1) cfg_.n = 1;
  if (cfg_.prompts < 1) cfg_.prompts = 1;
  for (int32_t i = 0; i < cfg_.n * cfg_.prompts; ++i) {
    auto c = std::make_unique<Choice>();
    c->index = i;
    c->prompt = i / cfg_.n;
    if (cfg_.run_parsers) c->parser.emplace(cfg_.parser);
    if (cfg_.logprobs) c->logprobs.emplace(ctx_.codec, cfg_.chat, utf8_length(echo_of(*c)));
    c->in_reasoning = cfg_.starts_in_reasoning;
    choices_.push_back(std::move(c));
  }
}

GenerationJob::~GenerationJob() {
  {
    std::lock_guard lock(ctx_.live_mu);
    for (const auto& c : choices_) {
      if (c->has_id.load()) ctx_.live_ids.erase(c->backend_id.load());
    }
  }
  ctx_.metrics->requests_in_flight.fetch_sub(1);
  ctx_.in_flight.fetch_sub(1);
}

EventCallback GenerationJob::callback(int32_t index) {
  return
      [self = shared_from_this(), index](BackendEvent ev) { self->on_event(index, std::move(ev)); };
}

void GenerationJob::started(int32_t index, uint64_t backend_id) {
  Choice& c = *choices_.at(index);
  c.backend_id.store(backend_id);
  {
    std::lock_guard lock(ctx_.live_mu);
    ctx_.live_ids.insert(backend_id);
  }
  c.has_id.store(true);
}

void GenerationJob::all_started() {
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  responder_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->cancel();
  });
  {
    std::lock_guard lock(mu_);
    released_ = true;
    if (!pending_.empty() && !drain_posted_) {
      drain_posted_ = true;
      responder_->post([self = shared_from_this()] { self->drain(); });
    }
  }
  if (cancel_requested_.load()) cancel();
}

void GenerationJob::abandon() {
  {
    std::lock_guard lock(mu_);
    abandoned_ = true;
    pending_.clear();
  }
  cancel();
}

void GenerationJob::cancel() {
  cancel_requested_.store(true);
  for (const auto& c : choices_) {
    if (c->has_id.load()) ctx_.backend->cancel(c->backend_id.load());
  }
}

void GenerationJob::on_event(int32_t index, BackendEvent ev) {
  std::lock_guard lock(mu_);
  if (abandoned_) return;
  pending_.emplace_back(index, std::move(ev));
  if (drain_posted_ || !released_) return;
  drain_posted_ = true;
  responder_->post([self = shared_from_this()] { self->drain(); });
}

void GenerationJob::drain() {
  std::deque<std::pair<int32_t, BackendEvent>> events;
  {
    std::lock_guard lock(mu_);
    events.swap(pending_);
    drain_posted_ = false;
  }
  for (auto& [index, ev] : events) {
    if (done_) break;
    Choice& c = *choices_.at(index);
    if (!c.finished) handle(c, ev);
  }
}

std::string GenerationJob::chunk(Choice& c, json choice) {
  if (c.logprobs && c.logprobs->has_pending()) choice["logprobs"] = c.logprobs->take();
  json j = {{"id", cfg_.id},
            {"object", cfg_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", cfg_.created},
            {"model", cfg_.model},
            {"choices", json::array({std::move(choice)})}};
  if (cfg_.continuous_usage) j["usage"] = usage_json();
  return sse(j);
}

json GenerationJob::usage_json() const {
  // The prompt is counted once; completion (and reasoning) tokens are summed over the choices.
  int32_t completion = 0, reasoning = 0, verify = 0, drafted = 0, accepted = 0;
  for (const auto& c : choices_) {
    completion += c->completion_tokens;
    reasoning += c->reasoning_tokens;
    verify += c->spec_verify_ct;
    drafted += c->spec_draft_token_num;
    accepted += c->spec_accept_token_num;
  }
  json usage = {{"prompt_tokens", cfg_.prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", cfg_.prompt_tokens + completion},
                {"prompt_tokens_details", {{"cached_tokens", cached_tokens()}}},
                {"completion_tokens_details", {{"reasoning_tokens", reasoning}}}};
  if (verify > 0) {
    // m3serve's extension (docs/dspark.md), with SGLang's meta_info names; accept length is the
    // tokens committed per verify step (accepted drafts + the target's own token).
    usage["m3serve_spec"] = {{"spec_verify_ct", verify},
                             {"spec_draft_token_num", drafted},
                             {"spec_accept_token_num", accepted},
                             {"spec_accept_length", double(accepted + verify) / verify}};
  }
  return usage;
}

void GenerationJob::emit_delta(Choice& c, chat::ParsedDelta&& d) {
  if (!cfg_.parallel_tool_calls) {  // the model may still write several: report the first
    std::erase_if(d.tool_calls, [](const auto& call) { return call.index > 0; });
  }
  if (d.empty()) return;
  // Every call gets an id when it begins (the same id in the streamed and whole forms).
  for (const auto& call : d.tool_calls) {
    if (call.begins) c.tool_call_ids.push_back(random_id("call_"));
  }
  if (!cfg_.stream) {
    c.message.append(std::move(d));
    return;
  }
  auto base = [&](json delta) {
    return json{{"index", c.index},
                {"delta", std::move(delta)},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}};
  };
  std::string out;
  if (!cfg_.chat) {
    out += chunk(c, {{"index", c.index},
                     {"text", d.content},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}});
  } else {
    if (!d.reasoning.empty()) out += chunk(c, base({{"reasoning_content", d.reasoning}}));
    if (!d.content.empty()) out += chunk(c, base({{"content", d.content}}));
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& call : d.tool_calls) {
        json fn = {{"arguments", call.arguments}};
        json j = {{"index", call.index}};
        if (call.begins) {
          fn["name"] = call.name;
          j["id"] = c.tool_call_ids.at(call.index);
          j["type"] = "function";
        }
        j["function"] = std::move(fn);
        calls.push_back(std::move(j));
      }
      out += chunk(c, base({{"tool_calls", std::move(calls)}}));
    }
  }
  if (!out.empty()) responder_->send_event(std::move(out));
}

void GenerationJob::handle(Choice& c, BackendEvent& ev) {
  auto now = ev.time;
  if (cfg_.stream && !stream_started_) {
    stream_started_ = true;
    responder_->start_stream();
  }
  if (!c.started) {
    c.started = true;
    if (cfg_.stream) {
      if (cfg_.chat) {
        responder_->send_event(chunk(c, {{"index", c.index},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}));
      }
      if (!echo_of(c).empty()) {
        responder_->send_event(chunk(c, {{"index", c.index},
                                         {"text", echo_of(c)},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}));
      }
    }
    if (c.parser && !cfg_.prefill.empty()) emit_delta(c, c.parser->feed(cfg_.prefill));
  }
  c.cached_tokens = std::max(c.cached_tokens, ev.cached_tokens);
  if (!ev.tokens.empty()) {
    auto& m = *ctx_.metrics;
    if (!first_token_seen_) {
      first_token_seen_ = true;
      m.time_to_first_token.observe(seconds(now - cfg_.arrival));
    } else if (c.last_token_time) {
      // A step's gap is shared by the tokens it produced (speculative decoding: several).
      double gap = seconds(now - *c.last_token_time) / double(ev.tokens.size());
      for (size_t i = 0; i < ev.tokens.size(); ++i) m.inter_token_latency.observe(gap);
    }
    c.last_token_time = now;
    c.completion_tokens += static_cast<int32_t>(ev.tokens.size());
    c.spec_verify_ct = std::max(c.spec_verify_ct, ev.spec_verify_ct);
    c.spec_draft_token_num = std::max(c.spec_draft_token_num, ev.spec_draft_token_num);
    c.spec_accept_token_num = std::max(c.spec_accept_token_num, ev.spec_accept_token_num);
    for (int32_t t : ev.tokens) {
      if (cfg_.think_open_id && t == *cfg_.think_open_id) c.in_reasoning = true;
      if (c.in_reasoning) ++c.reasoning_tokens;
      if (cfg_.think_close_id && t == *cfg_.think_close_id) c.in_reasoning = false;
    }
    // Before the text: the chunk that carries this event's text carries its logprobs. Tokens
    // whose text is held back (an incomplete character, a parser marker) ride on a later chunk.
    if (c.logprobs) c.logprobs->add(ev.tokens, ev.logprobs);
  }
  if (!ev.text.empty()) {
    if (c.parser) {
      emit_delta(c, c.parser->feed(ev.text));
    } else {
      chat::ParsedDelta d;
      d.content = ev.text;
      emit_delta(c, std::move(d));
    }
  }
  if (ev.done) finish_choice(c, ev);
}

void GenerationJob::fail(const std::string& error, bool unavailable) {
  done_ = true;
  cancel();  // the other choices
  ctx_.metrics->count_finished("error");
  ApiError e = unavailable ? server::unavailable("Generation failed: " + error, "model_failed")
                           : internal_error("Generation failed: " + error);
  if (cfg_.stream) {
    responder_->send_event(sse(e.to_json()));
    responder_->send_event("data: [DONE]\n\n");
    responder_->end_stream();
  } else {
    responder_->send(e.status, "application/json", e.body());
  }
}

void GenerationJob::finish_choice(Choice& c, const BackendEvent& ev) {
  c.finished = true;
  if (c.parser) emit_delta(c, c.parser->finish());
  std::string reason = ev.finish_reason.empty() ? "stop" : ev.finish_reason;
  if (cfg_.health) {
    done_ = true;
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
  if (reason == "error") return fail(ev.error, ev.unavailable);
  if (reason == "stop" && !c.tool_call_ids.empty()) reason = "tool_calls";
  c.finish_reason = reason;

  const bool gone = responder_->disconnected();
  if (cfg_.stream && !gone) {
    if (cfg_.chat) {
      responder_->send_event(chunk(c, {{"index", c.index},
                                       {"delta", json::object()},
                                       {"logprobs", nullptr},
                                       {"finish_reason", reason}}));
    } else {
      responder_->send_event(chunk(
          c, {{"index", c.index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", reason}}));
    }
  }
  for (const auto& other : choices_) {
    if (!other->finished) return;
  }
  finish_all(ev.time);
}

const std::string& GenerationJob::echo_of(const Choice& c) const {
  static const std::string kNone;
  return c.prompt < static_cast<int32_t>(cfg_.echo.size()) ? cfg_.echo[c.prompt] : kNone;
}

// A prompt's cached tokens are the most any of its choices found (they share it); a batch's are
// summed over its prompts, as prompt_tokens is. A prompt's choices are n consecutive ones.
int32_t GenerationJob::cached_tokens() const {
  int32_t sum = 0;
  for (size_t first = 0; first < choices_.size(); first += cfg_.n) {
    int32_t most = 0;
    for (size_t i = first; i < first + cfg_.n; ++i)
      most = std::max(most, choices_[i]->cached_tokens);
    sum += most;
  }
  return sum;
}

json GenerationJob::final_choice(Choice& c) {
  json logprobs = c.logprobs ? c.logprobs->take(/*even_if_empty=*/true) : json(nullptr);
  if (!cfg_.chat) {
    return {{"index", c.index},
            {"text", echo_of(c) + c.message.content},
            {"logprobs", std::move(logprobs)},
            {"finish_reason", c.finish_reason}};
  }
  const bool has_calls = !c.tool_call_ids.empty();
  json msg = {{"role", "assistant"}};
  msg["content"] =
      (c.message.content.empty() && has_calls) ? json(nullptr) : json(c.message.content);
  if (cfg_.reasoning_field) {
    msg["reasoning_content"] =
        c.message.reasoning.empty() ? json(nullptr) : json(c.message.reasoning);
  }
  if (has_calls) {
    json calls = json::array();
    for (const auto& call : c.message.tool_calls) {
      calls.push_back({{"id", c.tool_call_ids.at(call.index)},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    }
    msg["tool_calls"] = std::move(calls);
  }
  return {{"index", c.index},
          {"message", std::move(msg)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", c.finish_reason}};
}

void GenerationJob::finish_all(std::chrono::steady_clock::time_point now) {
  done_ = true;
  int32_t completion = 0, reasoning = 0;
  for (const auto& c : choices_) {
    completion += c->completion_tokens;
    reasoning += c->reasoning_tokens;
  }
  // One request, one finish: counted with the first choice's reason.
  auto& m = *ctx_.metrics;
  const std::string& reason = choices_.front()->finish_reason;
  m.count_finished(reason);
  m.prompt_tokens_total.fetch_add(cfg_.prompt_tokens);
  m.generation_tokens_total.fetch_add(completion);
  m.reasoning_tokens_total.fetch_add(reasoning);
  m.e2e_request_latency.observe(seconds(now - cfg_.arrival));
  m.request_prompt_tokens.observe(cfg_.prompt_tokens);
  m.request_generation_tokens.observe(completion);

  if (responder_->disconnected()) return;  // nobody to tell

  if (cfg_.stream) {
    if (cfg_.include_usage) {
      json u = {{"id", cfg_.id},
                {"object", cfg_.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", cfg_.created},
                {"model", cfg_.model},
                {"choices", json::array()},
                {"usage", usage_json()}};
      responder_->send_event(sse(u));
    }
    responder_->send_event("data: [DONE]\n\n");
    responder_->end_stream();
    return;
  }
  json choices = json::array();
  for (auto& c : choices_) choices.push_back(final_choice(*c));
  json body = {{"id", cfg_.id},
               {"object", cfg_.chat ? "chat.completion" : "text_completion"},
               {"created", cfg_.created},
               {"model", cfg_.model},
               {"choices", std::move(choices)},
               {"usage", usage_json()}};
  responder_->send(200, "application/json",
                   body.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace m3::server

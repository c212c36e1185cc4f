#include "bench/openai_stream.h"

#include <nlohmann/json.hpp>

namespace m3::bench {

using json = nlohmann::json;

namespace {
constexpr size_t kMaxErrorBody = 4096;
constexpr size_t kMaxText = 1u << 20;  // generated text kept per request (multi-turn history)
}  // namespace

void StreamReader::append_text(const std::string& piece) {
  if (keep_text_ && text_.size() < kMaxText) text_.append(piece.substr(0, kMaxText - text_.size()));
}

const char* backend_path(Backend backend) {
  return backend == Backend::kOpenAiChat ? "/v1/chat/completions" : "/v1/completions";
}

const char* backend_name(Backend backend) {
  return backend == Backend::kOpenAiChat ? "openai-chat" : "openai-completions";
}

std::string request_body(Backend backend, const GenerationParams& params,
                         const BenchRequest& request, const std::vector<std::string>& history) {
  json body;
  body["model"] = params.model;
  if (backend == Backend::kOpenAiChat) {
    json messages = json::array();
    for (size_t i = 0; i < history.size(); ++i) {
      messages.push_back({{"role", i % 2 == 0 ? "user" : "assistant"}, {"content", history[i]}});
    }
    messages.push_back({{"role", "user"}, {"content", request.prompt_text}});
    body["messages"] = std::move(messages);
  } else if (!history.empty()) {
    std::string prompt;
    for (const std::string& h : history) prompt += h + "\n";
    body["prompt"] = prompt + request.prompt_text;
  } else if (!request.prompt_ids.empty()) {
    body["prompt"] = request.prompt_ids;
  } else {
    body["prompt"] = request.prompt_text;
  }
  body["max_tokens"] = request.output_len;
  body["temperature"] = params.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (params.ignore_eos) body["ignore_eos"] = true;
  if (!params.extra_body.empty()) {
    body.update(json::parse(params.extra_body, nullptr, /*allow_exceptions=*/false));
  }
  return body.dump();
}

void StreamReader::on_bytes(std::string_view bytes, double now_s) {
  if (raw_.size() < kMaxErrorBody) raw_.append(bytes.substr(0, kMaxErrorBody - raw_.size()));
  for (const std::string& data : parser_.feed(bytes)) on_event(data, now_s);
}

void StreamReader::on_event(const std::string& data, double now_s) {
  if (data == "[DONE]") {
    saw_done_ = true;
    return;
  }
  json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object()) {
    if (error_.empty()) error_ = "unparsable stream chunk: " + data.substr(0, 200);
    return;
  }
  if (auto e = chunk.find("error"); e != chunk.end() && !e->is_null()) {
    if (error_.empty()) error_ = "error in stream: " + error_message_of(data);
    return;
  }
  if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) {
    if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) {
      usage_prompt_ = p->get<int>();
    }
    if (auto c = u->find("completion_tokens"); c != u->end() && c->is_number_integer()) {
      usage_completion_ = c->get<int>();
    }
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
        usage_cached_ = c->get<int>();
      }
    }
  }
  bool has_text = false;
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array()) {
    for (const json& choice : *choices) {
      if (backend_ == Backend::kOpenAiChat) {
        auto d = choice.find("delta");
        if (d == choice.end() || !d->is_object()) continue;
        // Reasoning and tool-call deltas are generated tokens too.
        for (const char* key : {"content", "reasoning_content", "reasoning"}) {
          auto t = d->find(key);
          if (t != d->end() && t->is_string() && !t->get_ref<const std::string&>().empty()) {
            has_text = true;
            // The answer as the next turn sends it back: content only (reasoning is not
            // replayed to a model, as chat templates drop it).
            if (std::string_view(key) == "content") append_text(t->get_ref<const std::string&>());
          }
        }
        if (auto t = d->find("tool_calls"); t != d->end() && t->is_array() && !t->empty()) {
          has_text = true;
        }
      } else {
        auto t = choice.find("text");
        if (t != choice.end() && t->is_string() && !t->get_ref<const std::string&>().empty()) {
          has_text = true;
          append_text(t->get_ref<const std::string&>());
        }
      }
    }
  }
  if (!has_text) return;
  ++text_chunks_;
  if (first_s_ < 0) {
    first_s_ = now_s;
  } else {
    itl_s_.push_back(now_s - last_s_);
  }
  last_s_ = now_s;
}

void StreamReader::finish(RequestResult& r, double end_s, const std::string& transport) const {
  r.latency_s = end_s;
  if (usage_prompt_ >= 0) r.prompt_tokens = usage_prompt_;
  r.output_tokens = usage_completion_ >= 0 ? usage_completion_ : text_chunks_;
  r.ttft_s = first_s_ >= 0 ? first_s_ : 0;
  r.itl_s = itl_s_;
  r.cached_tokens = usage_cached_;
  r.output_text = text_;
  r.success = false;
  if (r.http_status != 200 && r.http_status != 0) {
    r.error = "HTTP " + std::to_string(r.http_status) + ": " + error_message_of(raw_);
  } else if (!transport.empty()) {
    r.error = transport;
  } else if (!error_.empty()) {
    r.error = error_;
  } else if (first_s_ < 0) {
    r.error = "the stream ended without generated text";
  } else {
    r.success = true;
  }
}

std::string error_message_of(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    const json* e = &j;
    if (auto it = j.find("error"); it != j.end() && it->is_object()) e = &*it;
    if (auto m = e->find("message"); m != e->end() && m->is_string()) return m->get<std::string>();
    if (auto it = j.find("error"); it != j.end() && it->is_string()) return it->get<std::string>();
  }
  std::string s(body.substr(0, 300));
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace m3::bench

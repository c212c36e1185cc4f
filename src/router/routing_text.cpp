#include "router/routing_text.h"

#include <nlohmann/json.hpp>

namespace m3::router {

using json = nlohmann::json;

namespace {

void append_content(const json& content, std::string& out) {
  if (content.is_string()) {
    out += content.get_ref<const std::string&>();
  } else if (content.is_array()) {
    for (const json& part : content) {
      if (!part.is_object()) continue;
      auto t = part.find("text");
      if (t != part.end() && t->is_string()) out += t->get_ref<const std::string&>();
    }
  }
}

std::string chat_text(const json& body) {
  std::string out;
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) return out;
  for (const json& m : *messages) {
    if (!m.is_object()) continue;
    auto role = m.find("role");
    if (role != m.end() && role->is_string()) out += role->get_ref<const std::string&>();
    out += ": ";
    if (auto r = m.find("reasoning_content"); r != m.end()) append_content(*r, out);
    if (auto c = m.find("content"); c != m.end()) append_content(*c, out);
    if (auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
      for (const json& call : *calls) {
        auto fn = call.is_object() ? call.find("function") : call.end();
        if (call.is_object() && fn != call.end() && fn->is_object()) {
          if (auto n = fn->find("name"); n != fn->end() && n->is_string()) {
            out += n->get_ref<const std::string&>();
          }
          if (auto a = fn->find("arguments"); a != fn->end() && a->is_string()) {
            out += a->get_ref<const std::string&>();
          }
        }
      }
    }
    out += '\n';
  }
  return out;
}

std::string completion_text(const json& body) {
  std::string out;
  auto prompt = body.find("prompt");
  if (prompt == body.end()) return out;
  if (prompt->is_string()) return prompt->get<std::string>();
  if (prompt->is_array()) {
    // One prompt of token ids, or a batch: route by the first prompt.
    const json* ids = &*prompt;
    if (!prompt->empty() && ((*prompt)[0].is_array() || (*prompt)[0].is_string())) {
      if ((*prompt)[0].is_string()) return (*prompt)[0].get<std::string>();
      ids = &(*prompt)[0];
    }
    for (const json& id : *ids) {
      if (id.is_number_integer()) out += std::to_string(id.get<int64_t>()) + " ";
    }
  }
  return out;
}

}  // namespace

std::string routing_text(std::string_view path, std::string_view body) {
  const bool chat = path == "/v1/chat/completions";
  const bool completion = path == "/v1/completions";
  if (!chat && !completion) return std::string(body);
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::string(body);
  return chat ? chat_text(j) : completion_text(j);
}

}  // namespace m3::router

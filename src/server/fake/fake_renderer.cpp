#include "server/fake/fake_renderer.h"

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {
const std::string kNs = "]<]minimax[>[";

std::string text_of(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array()) {
    for (const auto& p : content) {
      if (p.value("type", "") == "text") out += p.value("text", "");
      if (p.value("type", "") == "image") out += "]<]image[>[";
    }
  }
  return out;
}
}  // namespace

std::string minimax_m3_to_xml(const json& v) {
  if (v.is_object()) {
    std::string out;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it->is_null()) continue;  // None fields are omitted
      out += kNs + "<" + it.key() + ">" + minimax_m3_to_xml(*it) + kNs + "</" + it.key() + ">";
    }
    return out;
  }
  if (v.is_array()) {
    std::string out;
    for (const auto& x : v) out += kNs + "<item>" + minimax_m3_to_xml(x) + kNs + "</item>";
    return out;
  }
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

Result<std::string> FakeRenderer::render(const json& messages, const json& tools,
                                         const json& kwargs, bool add_generation_prompt) const {
  std::string mode = kwargs.value("thinking_mode", "adaptive");
  std::string out = "]~!b[]~b]system\nYou are MiniMax-M3 (test template).\n";
  out += "<thinking_instructions>Current thinking mode: " + mode + "</thinking_instructions>";
  if (kwargs.contains("reasoning_effort")) {
    out += "\n<effort>" + kwargs["reasoning_effort"].get<std::string>() + "</effort>";
  }
  out += "[e~[\n]~b]developer\n";
  size_t start = 0;
  if (!messages.empty() &&
      (messages[0]["role"] == "system" || messages[0]["role"] == "developer")) {
    out += text_of(messages[0]["content"]);
    start = 1;
  } else {
    out += "You are a helpful assistant.";
  }
  if (tools.is_array() && !tools.empty()) {
    out += "\n\n# Tools\n";
    for (const auto& t : tools) out += "<tool>" + t["function"].dump() + "</tool>\n";
  }
  out += "[e~[\n";
  size_t last_user = 0;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i]["role"] == "user") last_user = i;
  for (size_t i = start; i < messages.size(); ++i) {
    const json& m = messages[i];
    std::string role = m["role"];
    if (role == "assistant") {
      out += "]~b]ai\n";
      std::string reasoning = m.value("reasoning_content", "");
      if (i > last_user && !reasoning.empty()) {
        out += "<mm:think>\n" + reasoning + "\n</mm:think>\n\n";
      } else {
        out += "</mm:think>";
      }
      out += text_of(m["content"]);
      if (m.contains("tool_calls")) {
        out += kNs + "<tool_call>\n";
        for (const auto& c : m["tool_calls"]) {
          out += kNs + "<invoke name=\"" + c["function"]["name"].get<std::string>() + "\">" +
                 minimax_m3_to_xml(c["function"]["arguments"]) + kNs + "</invoke>\n";
        }
        out += kNs + "</tool_call>";
      }
      out += "[e~[\n";
    } else if (role == "tool") {
      out += "]~b]tool\n<response>" + text_of(m["content"]) + "</response>[e~[\n";
    } else {
      out += "]~b]" + std::string(role == "user" ? "user" : "developer") + "\n" +
             text_of(m["content"]) + "[e~[\n";
    }
  }
  if (add_generation_prompt) {
    out += "]~b]ai\n";
    if (mode == "enabled") out += "<mm:think>";
    if (mode == "disabled") out += "</mm:think>";
  }
  return out;
}

}  // namespace m3::server

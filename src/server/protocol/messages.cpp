#include "server/protocol/messages.h"

#include "core/json_depth.h"

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {

std::string at(size_t i) {
  return "messages[" + std::to_string(i) + "]";
}

// Content (string, null or list of parts) -> template content; images are collected.
// `assistant`: an assistant message's content, which may be null and may hold OpenAI's "refusal"
// parts (the refusal's text, written as text).
Parsed<json> convert_content(const json& content, const std::string& param, bool assistant,
                             std::vector<ImageRef>& images) {
  const bool allow_null = assistant;
  if (content.is_null()) {
    if (allow_null) return json("");
    return bad_request(param + " must be a string or a list of content parts.", param);
  }
  if (content.is_string()) return content;
  if (!content.is_array()) {
    return bad_request(param + " must be a string or a list of content parts.", param);
  }
  std::string text;
  json parts = json::array();
  bool has_image = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    std::string pp = param + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return bad_request(pp + " must be an object with a string 'type'.", pp + ".type");
    }
    std::string type = part["type"].get<std::string>();
    if (type == "text" || (assistant && type == "refusal")) {
      const char* key = type == "text" ? "text" : "refusal";
      if (!part.contains(key) || !part[key].is_string()) {
        return bad_request(pp + "." + key + " must be a string.", pp + "." + key);
      }
      text += part[key].get<std::string>();
      parts.push_back({{"type", "text"}, {"text", part[key]}});
    } else if (type == "image_url") {
      const json* url = nullptr;
      if (part.contains("image_url")) {
        const json& iu = part["image_url"];
        if (iu.is_string())
          url = &iu;
        else if (iu.is_object() && iu.contains("url") && iu["url"].is_string())
          url = &iu["url"];
      }
      if (!url) {
        return bad_request(pp + ".image_url.url must be a string (a data: URI or an https URL).",
                           pp + ".image_url.url");
      }
      images.push_back(ImageRef{url->get<std::string>(), pp + ".image_url.url"});
      parts.push_back({{"type", "image"}});
      has_image = true;
    } else if (type == "input_audio" || type == "video_url" || type == "file" ||
               type == "audio_url") {
      return bad_request("Content parts of type '" + type + "' are not supported by this model.",
                         pp + ".type", "unsupported_content_type");
    } else {
      return bad_request("Unknown content part type '" + type + "'; allowed: text, image_url.",
                         pp + ".type");
    }
  }
  if (has_image) return parts;
  return json(text);
}

}  // namespace

Parsed<json> convert_messages(const json& messages, std::vector<ImageRef>& images) {
  if (!messages.is_array() || messages.empty()) {
    return bad_request("'messages' must be a non-empty array.", "messages");
  }
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    if (!m.is_object()) return bad_request(at(i) + " must be an object.", at(i));
    if (!m.contains("role") || !m["role"].is_string()) {
      return bad_request(at(i) + ".role must be a string.", at(i) + ".role");
    }
    std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
        role != "tool") {
      return bad_request(
          "Unknown role '" + role + "'; allowed: system, developer, user, assistant, tool.",
          at(i) + ".role");
    }
    json t = {{"role", role}};
    bool is_assistant = role == "assistant";
    const json& content = m.contains("content") ? m["content"] : json();
    if (!m.contains("content") && !is_assistant) {
      return bad_request(at(i) + ".content is required for role '" + role + "'.",
                         at(i) + ".content");
    }
    auto c = convert_content(content, at(i) + ".content", is_assistant, images);
    if (auto* e = std::get_if<ApiError>(&c)) return *e;
    t["content"] = std::get<json>(c);
    if (m.contains("name") && m["name"].is_string()) t["name"] = m["name"];

    if (is_assistant) {
      for (const char* key : {"reasoning_content", "reasoning"}) {
        if (m.contains(key) && !m[key].is_null()) {
          if (!m[key].is_string()) {
            return bad_request(at(i) + "." + key + " must be a string.", at(i) + "." + key);
          }
          t["reasoning_content"] = m[key];
          break;
        }
      }
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        const json& calls = m["tool_calls"];
        std::string cp = at(i) + ".tool_calls";
        if (!calls.is_array()) return bad_request(cp + " must be an array.", cp);
        json tc = json::array();
        for (size_t j = 0; j < calls.size(); ++j) {
          std::string p = cp + "[" + std::to_string(j) + "]";
          const json& call = calls[j];
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
            return bad_request(p + ".function must be an object.", p + ".function");
          }
          const json& fn = call["function"];
          if (!fn.contains("name") || !fn["name"].is_string()) {
            return bad_request(p + ".function.name must be a string.", p + ".function.name");
          }
          json args = json::object();
          if (fn.contains("arguments") && !fn["arguments"].is_null()) {
            if (fn["arguments"].is_object()) {
              args = fn["arguments"];
            } else if (fn["arguments"].is_string()) {
              const std::string& s = fn["arguments"].get_ref<const std::string&>();
              if (json_too_deep(s)) {
                return bad_request(p + ".function.arguments nests more than " +
                                       std::to_string(kMaxJsonDepth) + " levels deep, the limit.",
                                   p + ".function.arguments", "json_too_deep");
              }
              args = s.empty() ? json::object() : json::parse(s, nullptr, false);
              if (args.is_discarded() || !args.is_object()) {
                return bad_request(p + ".function.arguments must be a JSON object encoded as a "
                                       "string.",
                                   p + ".function.arguments");
              }
            } else {
              return bad_request(p + ".function.arguments must be a string.",
                                 p + ".function.arguments");
            }
          }
          json entry = {{"type", "function"},
                        {"function", {{"name", fn["name"]}, {"arguments", args}}}};
          if (call.contains("id") && call["id"].is_string()) entry["id"] = call["id"];
          tc.push_back(std::move(entry));
        }
        t["tool_calls"] = std::move(tc);
      }
    }
    if (role == "tool") {
      if (m.contains("tool_call_id")) {
        if (!m["tool_call_id"].is_string()) {
          return bad_request(at(i) + ".tool_call_id must be a string.", at(i) + ".tool_call_id");
        }
        t["tool_call_id"] = m["tool_call_id"];
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace m3::server

#include "chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/jinja/builtins.h"
#include "core/json_depth.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order.
const char* const kSpecialTokens[] = {"bos_token", "eos_token",  "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token"};

// Names apply_chat_template/render take themselves; a template kwarg with one of these names would
// be a Python TypeError (or silently change the call), so it is refused.
const char* const kReservedKwargs[] = {
    "conversation", "messages",   "tools",      "documents",     "chat_template",
    "add_generation_prompt",      "continue_final_message",      "tokenize",
    "padding",      "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"};

// transformers' continue_final_message sentinel (chat_template_utils.render_jinja_template).
constexpr const char* kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

Result<std::string> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return not_found("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return data_loss("error reading " + p.string());
  return ss.str();
}

bool json_truthy(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return false;
    case json::value_t::boolean: return j.get<bool>();
    case json::value_t::number_integer: return j.get<int64_t>() != 0;
    case json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case json::value_t::number_float: return j.get<double>() != 0.0;
    case json::value_t::string: return !j.get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object: return !j.empty();
    default: return false;
  }
}

// vLLM's _postprocess_messages: assistant tool-call arguments given as a JSON string become an
// object (empty or missing arguments become {}), as tool-use templates expect.
Status parse_tool_call_arguments(json& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    json& m = messages[i];
    if (!m.is_object()) continue;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || *role != "assistant") continue;
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (size_t k = 0; k < calls->size(); ++k) {
      std::string where =
          "messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(k) + "]";
      json& call = (*calls)[k];
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        return invalid_argument(where + ": expected an object with a 'function' object");
      json& fn = call["function"];
      auto args = fn.find("arguments");
      if (args != fn.end() && json_truthy(*args)) {
        if (args->is_object() || args->is_array()) continue;
        if (!args->is_string())
          return invalid_argument(where + ".function.arguments: expected a JSON string or object");
        if (json_too_deep(args->get_ref<const std::string&>())) {
          return invalid_argument(where + ".function.arguments nests more than " +
                                  std::to_string(kMaxJsonDepth) + " levels deep");
        }
        json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded())
          return invalid_argument(where + ".function.arguments is not valid JSON");
        *args = std::move(parsed);
      } else {
        fn["arguments"] = json::object();
      }
    }
  }
  return Status::ok();
}

std::string py_strip_ws(const std::string& s) {
  return jinja::py_strip(s, jinja::Value::none(), true, true);
}
std::string py_rstrip_ws(const std::string& s) {
  return jinja::py_strip(s, jinja::Value::none(), false, true);
}

}  // namespace

Result<ChatTemplate> make_chat_template(const std::string& source, const std::string& origin,
                                        const json& tokenizer_config) {
  ChatTemplate t;
  t.origin = origin;
  if (tokenizer_config.is_object()) {
    for (const char* name : kSpecialTokens) {
      auto it = tokenizer_config.find(name);
      if (it == tokenizer_config.end()) continue;
      std::string value;
      if (it->is_string()) {
        value = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        value = (*it)["content"].get<std::string>();
      } else if (!it->is_null()) {
        return invalid_argument(origin + ": " + name + " must be a string or {\"content\": ...}");
      }
      if (!value.empty()) t.special_tokens.emplace_back(name, value);
    }
  }
  // A template list from tokenizer_config.json arrives as `source` empty plus the list here.
  json named;
  if (source.empty() && tokenizer_config.is_object() && tokenizer_config.contains("chat_template") &&
      tokenizer_config["chat_template"].is_array()) {
    named = tokenizer_config["chat_template"];
  }
  if (!named.is_null()) {
    for (const json& e : named) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") ||
          !e["name"].is_string() || !e["template"].is_string())
        return invalid_argument(origin + ": chat_template list entries must be {name, template}");
      const std::string& name = e["name"].get_ref<const std::string&>();
      const std::string& src = e["template"].get_ref<const std::string&>();
      if (name != "default" && name != "tool_use") continue;
      M3_ASSIGN_OR_RETURN(jinja::Template parsed,
                          jinja::Template::parse(src, origin + " (chat_template '" + name + "')"));
      auto p = std::make_shared<const jinja::Template>(std::move(parsed));
      if (name == "default") {
        t.default_template = p;
        t.default_source = src;
      } else {
        t.tool_use_template = p;
        t.tool_use_source = src;
      }
    }
    if (!t.default_template && !t.tool_use_template)
      return invalid_argument(origin + ": chat_template list has neither 'default' nor 'tool_use'");
    return t;
  }
  M3_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::parse(source, origin));
  t.default_template = std::make_shared<const jinja::Template>(std::move(parsed));
  t.default_source = source;
  return t;
}

Result<ChatTemplate> load_chat_template(const std::string& model_dir) {
  fs::path dir(model_dir);
  fs::path cfg_path = dir / "tokenizer_config.json";
  fs::path jinja_path = dir / "chat_template.jinja";
  json cfg = json::object();
  std::error_code ec;
  if (fs::exists(cfg_path, ec)) {
    M3_ASSIGN_OR_RETURN(std::string text, read_file(cfg_path));
    cfg = json::parse(text, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object())
      return invalid_argument(cfg_path.string() + ": not a JSON object");
  }
  if (fs::exists(jinja_path, ec)) {
    M3_ASSIGN_OR_RETURN(std::string src, read_file(jinja_path));
    return make_chat_template(src, jinja_path.string(), cfg);
  }
  auto it = cfg.find("chat_template");
  // Positions in messages are within the template string, not the JSON file.
  std::string origin = cfg_path.string() + " chat_template";
  if (it != cfg.end() && it->is_string()) return make_chat_template(it->get<std::string>(), origin, cfg);
  if (it != cfg.end() && it->is_array()) return make_chat_template("", origin, cfg);
  return not_found("no chat template in " + model_dir +
                   ": neither chat_template.jinja nor a chat_template in tokenizer_config.json");
}

Result<std::string> render_chat(const ChatTemplate& tmpl, const json& request,
                                const ChatTemplateOptions& options) {
  if (!request.is_object()) return invalid_argument("chat request must be a JSON object");
  auto mit = request.find("messages");
  if (mit == request.end() || !mit->is_array())
    return invalid_argument("chat request: 'messages' must be an array");
  json messages = *mit;
  // transformers refuses to render an empty conversation (ValueError), before the template runs.
  if (messages.empty())
    return invalid_argument(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].is_object())
      return invalid_argument("chat request: messages[" + std::to_string(i) + "] must be an object");
  M3_RETURN_IF_ERROR(parse_tool_call_arguments(messages));

  auto optional_array = [&](const char* key, json& out) -> Status {
    auto it = request.find(key);
    if (it == request.end() || it->is_null()) return Status::ok();
    if (!it->is_array()) return invalid_argument(std::string("chat request: '") + key + "' must be an array");
    out = *it;
    return Status::ok();
  };
  json tools, documents;
  M3_RETURN_IF_ERROR(optional_array("tools", tools));
  M3_RETURN_IF_ERROR(optional_array("documents", documents));
  if (documents.is_array())
    for (const json& d : documents)
      if (!d.is_object())
        return invalid_argument("chat request: documents must be objects with 'title' and 'text'");

  auto flag = [&](const char* key, bool dflt, bool& out) -> Status {
    auto it = request.find(key);
    if (it == request.end() || it->is_null()) {
      out = dflt;
      return Status::ok();
    }
    if (!it->is_boolean()) return invalid_argument(std::string("chat request: '") + key + "' must be a boolean");
    out = it->get<bool>();
    return Status::ok();
  };
  bool add_generation_prompt = true, continue_final = false;
  M3_RETURN_IF_ERROR(flag("add_generation_prompt", true, add_generation_prompt));
  M3_RETURN_IF_ERROR(flag("continue_final_message", false, continue_final));
  if (continue_final && add_generation_prompt)
    return invalid_argument(
        "chat request: continue_final_message and add_generation_prompt cannot both be true");

  // Variables: special tokens, overridden by chat_template_kwargs, then the named arguments.
  std::vector<std::pair<std::string, jinja::Value>> vars;
  auto set_var = [&](const std::string& k, jinja::Value v) {
    for (auto& kv : vars)
      if (kv.first == k) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(k, std::move(v));
  };
  for (const auto& [k, v] : tmpl.special_tokens) set_var(k, jinja::Value(v));
  auto kit = request.find("chat_template_kwargs");
  if (kit != request.end() && !kit->is_null()) {
    if (!kit->is_object()) return invalid_argument("chat request: 'chat_template_kwargs' must be an object");
    for (auto it = kit->begin(); it != kit->end(); ++it) {
      for (const char* r : kReservedKwargs)
        if (it.key() == r)
          return invalid_argument("chat request: chat_template_kwargs may not set '" + it.key() + "'");
      try {
        set_var(it.key(), jinja::from_json(it.value()));
      } catch (const jinja::TemplateError& e) {
        return invalid_argument("chat request: chat_template_kwargs." + it.key() + ": " + e.what());
      }
    }
  }

  // transformers' get_chat_template: "tool_use" when tools are given and it exists, else default.
  const jinja::Template* t = tmpl.default_template.get();
  const std::string* source = &tmpl.default_source;
  if (!tools.is_null() && tmpl.tool_use_template) {
    t = tmpl.tool_use_template.get();
    source = &tmpl.tool_use_source;
  }
  if (!t)
    return invalid_argument(tmpl.origin + ": this model has several chat templates and none is 'default'");

  std::string final_message;
  if (continue_final) {
    if (messages.empty()) return invalid_argument("continue_final_message: there is no final message");
    json& last = messages.back();
    auto c = last.find("content");
    if (c == last.end() || c->is_null())
      return invalid_argument("continue_final_message is set but the final message has no \"content\" to continue!");
    if (source->find("content") == std::string::npos)
      return invalid_argument("continue_final_message is set to \"content\" but this is not an accepted field in the chat_template");
    if (c->is_array()) {
      bool found = false;
      for (auto it = c->rbegin(); it != c->rend(); ++it) {
        if (it->is_object() && it->contains("text")) {
          json& text = (*it)["text"];
          if (!text.is_string())
            return invalid_argument("continue_final_message: the final text block is not a string");
          final_message = text.get<std::string>();
          text = final_message + kContinueTag;
          found = true;
          break;
        }
        if (it->is_string() && it->get_ref<const std::string&>().find("text") != std::string::npos)
          return invalid_argument("continue_final_message: string indices must be integers");
      }
      if (!found)
        return invalid_argument("continue_final_message is set but we could not find any text to continue in the final message!");
    } else if (c->is_string()) {
      final_message = c->get<std::string>();
      *c = final_message + kContinueTag;
    } else {
      return invalid_argument("continue_final_message: the final message's content must be a string or a list of parts");
    }
  }

  try {
    set_var("messages", jinja::from_json(messages));
    set_var("tools", tools.is_null() ? jinja::Value::none() : jinja::from_json(tools));
    set_var("documents", documents.is_null() ? jinja::Value::none() : jinja::from_json(documents));
  } catch (const jinja::TemplateError& e) {
    return invalid_argument(std::string("chat request: ") + e.what());
  }
  set_var("add_generation_prompt", jinja::Value(add_generation_prompt));

  M3_ASSIGN_OR_RETURN(std::string rendered, t->render(vars, options.render));
  if (continue_final) {
    std::string fm = py_strip_ws(final_message);
    const std::string tag = kContinueTag;
    const std::string tag_stripped = tag.substr(0, tag.size() - 1);
    if (rendered.find(fm) == std::string::npos || rendered.find(tag_stripped) == std::string::npos)
      return invalid_argument(
          "continue_final_message is set but the final message does not appear in the chat after "
          "applying the chat template");
    size_t loc = rendered.rfind(tag_stripped);
    if (rendered.compare(loc, tag.size(), tag) == 0)
      rendered.resize(loc);
    else
      rendered = py_rstrip_ws(rendered.substr(0, loc));
  }
  return rendered;
}

}  // namespace m3

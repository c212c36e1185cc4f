#include "server/protocol/requests.h"

#include <cmath>

#include "core/json_depth.h"

#include "server/protocol/messages.h"
#include "server/protocol/unsupported_fields.h"

namespace m3::server {

using json = nlohmann::ordered_json;

namespace {

// Optional number field within [lo, hi]; a wrong type or range is a 400 naming the field.
std::optional<ApiError> get_number(const json& body, const char* key, double lo, double hi,
                                   std::optional<double>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return bad_request(std::string("'") + key + "' must be a number.", key);
  double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    return bad_request(std::string("'") + key + "' must be between " + json(lo).dump() + " and " +
                           json(hi).dump() + "; got " + it->dump() + ".",
                       key);
  }
  out = v;
  return std::nullopt;
}

// An integral JSON number as int64, or nullopt when it is not integral or does not fit: a double
// such as 1e300 or 4294967296.5, an unsigned value past INT64_MAX. Never wraps.
std::optional<int64_t> as_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // [-2^63, 2^63): exactly the doubles that convert to int64 without overflow.
    if (!std::isfinite(d) || std::floor(d) != d || d < -9223372036854775808.0 ||
        d >= 9223372036854775808.0) {
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& body, const char* key, int64_t lo, int64_t hi,
                                std::optional<int64_t>& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  const bool integral = it->is_number_integer() ||
                        (it->is_number_float() && std::isfinite(it->get<double>()) &&
                         std::floor(it->get<double>()) == it->get<double>());
  if (!integral) return bad_request(std::string("'") + key + "' must be an integer.", key);
  const std::optional<int64_t> v = as_int64(*it);
  if (!v || *v < lo || *v > hi) {
    return bad_request(std::string("'") + key + "' must be between " + std::to_string(lo) +
                           " and " + std::to_string(hi) + "; got " + it->dump() + ".",
                       key);
  }
  out = *v;
  return std::nullopt;
}

// A token id field: an integer in [0, INT32_MAX]. The vocabulary bound is checked where the
// vocabulary is known (the handlers, the engine); here nothing may wrap into a valid-looking id.
std::optional<int32_t> as_token_id(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  const std::optional<int64_t> id = as_int64(v);
  if (!id || *id < 0 || *id > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(*id);
}

// A logit_bias key: the decimal form of a token id as OpenAI writes it ("0", "1234"), nothing
// else: no sign, no spaces, no leading zeros, no exponent.
std::optional<int32_t> canonical_token_key(const std::string& key) {
  if (key.empty() || key.size() > 10) return std::nullopt;
  if (key.size() > 1 && key[0] == '0') return std::nullopt;
  int64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + (c - '0');
  }
  if (id > INT32_MAX) return std::nullopt;
  return static_cast<int32_t>(id);
}

std::optional<ApiError> get_bool(const json& body, const char* key, bool& out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request(std::string("'") + key + "' must be a boolean.", key);
  out = it->get<bool>();
  return std::nullopt;
}

#define M3_TRY(expr)                            \
  do {                                          \
    if (auto m3_err_ = (expr)) return *m3_err_; \
  } while (0)

std::optional<ApiError> parse_common(const json& body, CommonGeneration& g, bool chat) {
  M3_TRY(refuse_unsupported_fields(body, chat));
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("'model' must be a string.", "model");
    g.model = it->get<std::string>();
  }
  M3_TRY(get_bool(body, "stream", g.stream));
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      return bad_request("'stream_options' must be an object.", "stream_options");
    if (!g.stream) {
      return bad_request("'stream_options' is only allowed when 'stream' is true.",
                         "stream_options");
    }
    bool usage = false;
    if (auto e = get_bool(*it, "include_usage", usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
    g.include_usage = usage;
    bool continuous = false;
    if (auto e = get_bool(*it, "continuous_usage_stats", continuous)) {
      e->param = "stream_options.continuous_usage_stats";
      return e;
    }
    g.continuous_usage = continuous;
  }
  std::optional<int64_t> max_tokens;
  M3_TRY(get_int(body, "max_tokens", 1, INT32_MAX, max_tokens));
  if (chat) {
    std::optional<int64_t> mct;
    M3_TRY(get_int(body, "max_completion_tokens", 1, INT32_MAX, mct));
    if (mct) max_tokens = mct;
  }
  if (max_tokens) g.max_tokens = static_cast<int32_t>(*max_tokens);

  SamplingOptions& s = g.sampling;
  M3_TRY(get_number(body, "temperature", 0.0, 100.0, s.temperature));
  M3_TRY(get_number(body, "top_p", 0.0, 1.0, s.top_p));
  if (s.top_p && *s.top_p <= 0.0) return bad_request("'top_p' must be in (0, 1]; got 0.", "top_p");
  M3_TRY(get_number(body, "min_p", 0.0, 1.0, s.min_p));
  M3_TRY(get_number(body, "presence_penalty", -2.0, 2.0, s.presence_penalty));
  M3_TRY(get_number(body, "frequency_penalty", -2.0, 2.0, s.frequency_penalty));
  M3_TRY(get_number(body, "repetition_penalty", 0.0, 100.0, s.repetition_penalty));
  if (s.repetition_penalty && *s.repetition_penalty <= 0.0) {
    return bad_request("'repetition_penalty' must be > 0.", "repetition_penalty");
  }
  std::optional<int64_t> i;
  M3_TRY(get_int(body, "top_k", -1, INT32_MAX, i));
  if (i) s.top_k = static_cast<int32_t>(*i);
  i.reset();
  M3_TRY(get_int(body, "seed", INT64_MIN, INT64_MAX, i));
  if (i) s.seed = static_cast<uint64_t>(*i);
  i.reset();
  M3_TRY(get_int(body, "min_tokens", 0, INT32_MAX, i));
  if (i) s.min_tokens = static_cast<int32_t>(*i);
  M3_TRY(get_bool(body, "ignore_eos", s.ignore_eos));
  i.reset();
  M3_TRY(get_int(body, "truncate_prompt_tokens", -1, INT32_MAX, i));
  if (i && *i == 0) {
    return bad_request("'truncate_prompt_tokens' must be -1 (the context length) or at least 1.",
                       "truncate_prompt_tokens");
  }
  if (i) g.truncate_prompt_tokens = static_cast<int32_t>(*i);
  M3_TRY(get_bool(body, "skip_special_tokens", g.skip_special_tokens));
  i.reset();
  // n: a wrong type or a value outside 1..kMaxChoices is a 400 naming 'n' and the limit.
  if (auto e = get_int(body, "n", 1, kMaxChoices, i)) {
    e->message += " At most " + std::to_string(kMaxChoices) + " choices per request.";
    return e;
  }
  if (i) g.n = static_cast<int32_t>(*i);
  i.reset();
  M3_TRY(get_int(body, "best_of", 1, 128, i));
  if (i && *i != 1) return bad_request("'best_of' is not supported.", "best_of");

  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& x : *it) {
        if (!x.is_string())
          return bad_request("'stop' must be a string or a list of strings.", "stop");
        s.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad_request("'stop' must be a string or a list of strings.", "stop");
    }
    if (s.stop.size() > 16) return bad_request("At most 16 stop strings are allowed.", "stop");
    for (const auto& x : s.stop) {
      if (x.empty()) return bad_request("Stop strings must not be empty.", "stop");
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array())
      return bad_request("'stop_token_ids' must be a list of integers.", "stop_token_ids");
    for (const auto& x : *it) {
      const std::optional<int32_t> id = as_token_id(x);
      if (!id) {
        return bad_request("'stop_token_ids' must be a list of token ids (integers from 0 to " +
                               std::to_string(INT32_MAX) + "); got " + x.dump() + ".",
                           "stop_token_ids");
      }
      s.stop_token_ids.push_back(*id);
    }
  }
  if (auto it = body.find("logit_bias"); it != body.end() && !it->is_null()) {
    // OpenAI: {"<token id>": bias in [-100, 100]}; ids are checked against the vocabulary by the
    // backend (a 400 naming logit_bias).
    if (!it->is_object()) {
      return bad_request("'logit_bias' must be an object mapping token ids to numbers.",
                         "logit_bias");
    }
    if (it->size() > 300) {
      return bad_request("'logit_bias' may bias at most 300 tokens.", "logit_bias");
    }
    for (const auto& [key, value] : it->items()) {
      const std::optional<int32_t> id = canonical_token_key(key);
      if (!id) {
        return bad_request("'logit_bias' keys must be token ids written as plain decimal "
                               "integers (\"1234\"); got '" + key + "'.",
                           "logit_bias");
      }
      if (!value.is_number() || !std::isfinite(value.get<double>()) ||
          value.get<double>() < -100.0 || value.get<double>() > 100.0) {
        return bad_request("'logit_bias' values must be numbers between -100 and 100; got " +
                               value.dump() + " for token " + key + ".",
                           "logit_bias");
      }
      s.logit_bias.emplace_back(*id, value.get<float>());
    }
  }
  if (chat) {
    // Chat: logprobs is a boolean; top_logprobs 0..20 needs logprobs true (OpenAI).
    M3_TRY(get_bool(body, "logprobs", s.logprobs));
    i.reset();
    M3_TRY(get_int(body, "top_logprobs", 0, kMaxChatTopLogprobs, i));
    if (i) {
      if (!s.logprobs) {
        return bad_request("'top_logprobs' needs 'logprobs' to be true.", "top_logprobs");
      }
      s.top_logprobs = static_cast<int32_t>(*i);
    }
  } else {
    // Completions: logprobs is the number of alternatives, 0..5 (0: the sampled token only).
    i.reset();
    M3_TRY(get_int(body, "logprobs", 0, kMaxCompletionLogprobs, i));
    if (i) {
      s.logprobs = true;
      s.top_logprobs = static_cast<int32_t>(*i);
    }
  }
  if (auto it = body.find("user"); it != body.end() && it->is_string())
    g.user = it->get<std::string>();
  return std::nullopt;
}

const char* kThinkingTypes = "'enabled', 'disabled' or 'adaptive'";
const char* kEfforts = "'low', 'medium', 'high', 'xhigh', 'max', 'minimal' or 'none'";

std::optional<ApiError> parse_tools(const json& body, ChatRequest& r) {
  auto it = body.find("tools");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_array()) return bad_request("'tools' must be an array.", "tools");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || t["type"] != "function") {
        return bad_request(p + ".type must be 'function'.", p + ".type");
      }
      if (!t.contains("function") || !t["function"].is_object()) {
        return bad_request(p + ".function must be an object.", p + ".function");
      }
      const json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() ||
          fn["name"].get_ref<const std::string&>().empty()) {
        return bad_request(p + ".function.name must be a non-empty string.", p + ".function.name");
      }
      if (fn.contains("parameters") && !fn["parameters"].is_null() &&
          !fn["parameters"].is_object()) {
        return bad_request(p + ".function.parameters must be a JSON schema object.",
                           p + ".function.parameters");
      }
    }
    if (!it->empty()) r.tools = *it;
  }
  auto has_tool = [&](const std::string& name) {
    if (!r.tools.is_array()) return false;
    for (const auto& t : r.tools)
      if (t["function"]["name"] == name) return true;
    return false;
  };
  auto tc = body.find("tool_choice");
  if (tc == body.end() || tc->is_null()) {
    r.tool_choice = ToolChoice::kAuto;
  } else if (tc->is_string()) {
    std::string v = tc->get<std::string>();
    if (v == "auto")
      r.tool_choice = ToolChoice::kAuto;
    else if (v == "none")
      r.tool_choice = ToolChoice::kNone;
    else if (v == "required")
      r.tool_choice = ToolChoice::kRequired;
    else {
      return bad_request(
          "'tool_choice' must be 'auto', 'none', 'required' or "
          "{\"type\": \"function\", \"function\": {\"name\": ...}}; got '" +
              v + "'.",
          "tool_choice");
    }
  } else if (tc->is_object() && tc->contains("function") && (*tc)["function"].is_object() &&
             (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string()) {
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = (*tc)["function"]["name"].get<std::string>();
    if (!has_tool(r.tool_choice_name)) {
      return bad_request(
          "tool_choice names the function '" + r.tool_choice_name + "', which is not in 'tools'.",
          "tool_choice.function.name");
    }
  } else {
    return bad_request(
        "'tool_choice' must be 'auto', 'none', 'required' or "
        "{\"type\": \"function\", \"function\": {\"name\": ...}}.",
        "tool_choice");
  }
  if (r.tool_choice == ToolChoice::kRequired && !r.tools.is_array()) {
    return bad_request("tool_choice 'required' needs a non-empty 'tools' list.", "tool_choice");
  }
  M3_TRY(get_bool(body, "parallel_tool_calls", r.parallel_tool_calls));
  return std::nullopt;
}

std::optional<ApiError> parse_thinking(const json& body, ChatRequest& r) {
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      return bad_request("'chat_template_kwargs' must be an object.", "chat_template_kwargs");
    }
    r.template_kwargs = *it;
  }
  // Where the mode comes from, lowest precedence first: the template default (adaptive),
  // chat_template_kwargs (thinking_mode, or enable_thinking as Qwen-style clients send),
  // reasoning_effort none/minimal, the top-level thinking field.
  std::string mode = "adaptive";
  if (auto it = r.template_kwargs.find("thinking_mode"); it != r.template_kwargs.end()) {
    if (!it->is_string() || (*it != "enabled" && *it != "disabled" && *it != "adaptive")) {
      return bad_request(
          std::string("chat_template_kwargs.thinking_mode must be ") + kThinkingTypes + ".",
          "chat_template_kwargs.thinking_mode");
    }
    mode = it->get<std::string>();
  } else if (auto e = r.template_kwargs.find("enable_thinking");
             e != r.template_kwargs.end() && e->is_boolean()) {
    mode = e->get<bool>() ? "enabled" : "disabled";
  }
  std::optional<std::string> effort;
  if (auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    static const char* kAllowed[] = {"low", "medium", "high", "xhigh", "max", "minimal", "none"};
    bool ok = false;
    if (it->is_string())
      for (const char* a : kAllowed) ok |= *it == a;
    if (!ok) {
      return bad_request(
          std::string("'reasoning_effort' must be ") + kEfforts + "; got " + it->dump() + ".",
          "reasoning_effort");
    }
    effort = it->get<std::string>();
    if (*effort == "none" || *effort == "minimal") {
      mode = "disabled";
    } else {
      r.template_kwargs["reasoning_effort"] = *effort;
    }
  }
  if (auto it = body.find("thinking"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type")) {
      return bad_request(std::string("'thinking' must be an object {\"type\": ...} with type ") +
                             kThinkingTypes + ".",
                         "thinking");
    }
    const json& type = (*it)["type"];
    if (!type.is_string() || (type != "enabled" && type != "disabled" && type != "adaptive")) {
      return bad_request(
          std::string("'thinking.type' must be ") + kThinkingTypes + "; got " + type.dump() + ".",
          "thinking.type");
    }
    if (type == "enabled" && effort && mode == "disabled") {
      return bad_request("'thinking.type' is 'enabled' but 'reasoning_effort' is '" + *effort +
                             "', which disables thinking.",
                         "reasoning_effort");
    }
    mode = type.get<std::string>();
  }
  r.thinking_mode = mode;
  r.template_kwargs["thinking_mode"] = mode;
  return std::nullopt;
}

// vLLM's mm_processor_kwargs: the image processor's min_pixels / max_pixels for this request.
// Other keys are refused rather than ignored.
std::optional<ApiError> parse_mm_processor_kwargs(const json& body, ChatRequest& r) {
  auto it = body.find("mm_processor_kwargs");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return bad_request("'mm_processor_kwargs' must be an object.", "mm_processor_kwargs");
  }
  for (const auto& [key, value] : it->items()) {
    const std::string param = "mm_processor_kwargs." + key;
    if (key != "min_pixels" && key != "max_pixels") {
      return bad_request("'" + param + "' is not supported; the image processor takes "
                         "min_pixels and max_pixels.",
                         param, "unsupported_parameter");
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 1) {
      return bad_request("'" + param + "' must be a positive integer.", param);
    }
    (key == "min_pixels" ? r.mm_min_pixels : r.mm_max_pixels) = value.get<int64_t>();
  }
  if (r.mm_min_pixels && r.mm_max_pixels && *r.mm_min_pixels > *r.mm_max_pixels) {
    return bad_request("mm_processor_kwargs.min_pixels (" + std::to_string(*r.mm_min_pixels) +
                           ") is above max_pixels (" + std::to_string(*r.mm_max_pixels) + ").",
                       "mm_processor_kwargs.min_pixels");
  }
  return std::nullopt;
}

}  // namespace

Parsed<json> parse_json_body(const std::string& body) {
  if (body.empty()) return bad_request("The request body is empty; expected a JSON object.");
  // Refused before anything is built: every later walker of the document recurses per level.
  if (json_too_deep(body)) {
    return bad_request("The request body nests arrays and objects more than " +
                           std::to_string(kMaxJsonDepth) + " levels deep, the limit.",
                       "", "json_too_deep");
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Find where it broke, for a useful message. Any of the library's exceptions here is the
    // body's fault (a syntax error, or a number that overflows a double: 1e999).
    try {
      json reparsed = json::parse(body);
      (void)reparsed;
    } catch (const json::exception& e) {
      return bad_request(std::string("Malformed JSON in the request body: ") + e.what(), "",
                         "invalid_json");
    }
    return bad_request("Malformed JSON in the request body.", "", "invalid_json");
  }
  if (!j.is_object())
    return bad_request("The request body must be a JSON object.", "", "invalid_json");
  return j;
}

Parsed<ChatRequest> parse_chat_request(const json& body) {
  ChatRequest r;
  M3_TRY(parse_common(body, r.gen, /*chat=*/true));
  if (!body.contains("messages")) return bad_request("'messages' is required.", "messages");
  auto msgs = convert_messages(body["messages"], r.images);
  if (auto* e = std::get_if<ApiError>(&msgs)) return *e;
  r.messages = std::move(std::get<json>(msgs));
  M3_TRY(parse_tools(body, r));
  M3_TRY(parse_thinking(body, r));
  M3_TRY(parse_mm_processor_kwargs(body, r));
  M3_TRY(get_bool(body, "add_generation_prompt", r.add_generation_prompt));
  M3_TRY(get_bool(body, "continue_final_message", r.continue_final_message));
  if (r.continue_final_message) {
    if (auto a = body.find("add_generation_prompt"); a != body.end() && *a == true) {
      return bad_request("'continue_final_message' continues the final message, so it cannot be "
                         "combined with 'add_generation_prompt': true.",
                         "continue_final_message");
    }
    r.add_generation_prompt = false;
    const json& last = r.messages.back();
    if (last.value("role", "") != "assistant") {
      return bad_request("'continue_final_message' needs the final message to be the "
                         "assistant's.",
                         "continue_final_message");
    }
    if (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) {
      return bad_request("'continue_final_message' cannot be combined with a forced tool call "
                         "('tool_choice' required or a named function).",
                         "continue_final_message");
    }
  }
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
      return bad_request("'response_format' must be an object with a 'type'.", "response_format");
    }
    if ((*it)["type"] != "text") {
      return bad_request("response_format type " + (*it)["type"].dump() +
                             " needs constrained decoding, which is not available yet; only "
                             "'text' is supported.",
                         "response_format.type", "unsupported_parameter");
    }
  }
  return r;
}

Parsed<CompletionRequest> parse_completion_request(const json& body) {
  CompletionRequest r;
  M3_TRY(parse_common(body, r.gen, /*chat=*/false));
  if (!r.gen.max_tokens) r.gen.max_tokens = 16;  // OpenAI's default for /v1/completions
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad_request("'prompt' is required.", "prompt");
  const json& p = *it;
  // Token ids: each an integer in [0, INT32_MAX] (the handler checks the vocabulary).
  auto token_ids = [&](const json& a, const std::string& param) -> Parsed<CompletionPrompt> {
    CompletionPrompt out;
    out.tokens.reserve(a.size());
    for (const auto& x : a) {
      const std::optional<int32_t> id = as_token_id(x);
      if (!id) {
        return bad_request("'prompt' token ids must be integers from 0 to " +
                               std::to_string(INT32_MAX) + "; got " + x.dump() + ".",
                           param);
      }
      out.tokens.push_back(*id);
    }
    if (out.tokens.empty()) return bad_request("'prompt' must not be empty.", param);
    return out;
  };
  auto text = [&](const json& s, const std::string& param) -> Parsed<CompletionPrompt> {
    CompletionPrompt out;
    out.text = s.get<std::string>();
    if (out.text->empty()) return bad_request("'prompt' must not be empty.", param);
    return out;
  };
  auto add = [&](Parsed<CompletionPrompt> one) -> std::optional<ApiError> {
    if (auto* e = std::get_if<ApiError>(&one)) return *e;
    r.prompts.push_back(std::move(std::get<CompletionPrompt>(one)));
    return std::nullopt;
  };
  // OpenAI's four forms: a string, a list of token ids, and batches of either (a list of
  // strings, a list of token-id lists). One batch holds one kind.
  if (p.is_string()) {
    if (auto e = add(text(p, "prompt"))) return *e;
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    if (auto e = add(token_ids(p, "prompt"))) return *e;
  } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    if (p.size() > static_cast<size_t>(kMaxBatchedPrompts)) {
      return bad_request("'prompt' holds " + std::to_string(p.size()) +
                             " prompts; at most " + std::to_string(kMaxBatchedPrompts) +
                             " are allowed in one request.",
                         "prompt");
    }
    const bool strings = p[0].is_string();
    for (size_t i = 0; i < p.size(); ++i) {
      // A batch of one is one prompt (as the handler reports it): errors name plain 'prompt'.
      const std::string param = p.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt";
      if (strings ? !p[i].is_string() : !p[i].is_array()) {
        return bad_request("A batched 'prompt' must be a list of strings or a list of token-id "
                           "lists, not a mix; item " + std::to_string(i) + " is " +
                               std::string(p[i].type_name()) + ".",
                           param);
      }
      if (auto e = add(strings ? text(p[i], param) : token_ids(p[i], param))) return *e;
    }
  } else {
    return bad_request("'prompt' must be a string, a list of token ids, or a batch of either.",
                       "prompt");
  }
  M3_TRY(get_bool(body, "echo", r.echo));
  if (r.echo && r.gen.sampling.logprobs) {
    // vLLM then also returns the prompt's logprobs, which the engine does not compute yet.
    return bad_request("'echo' with 'logprobs' needs prompt logprobs, which are not supported yet.",
                       "logprobs", "unsupported_parameter");
  }
  if (auto s = body.find("suffix"); s != body.end() && !s->is_null()) {
    return bad_request("'suffix' is not supported.", "suffix", "unsupported_parameter");
  }
  return r;
}

}  // namespace m3::server

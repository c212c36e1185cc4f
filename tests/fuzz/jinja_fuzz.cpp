// libFuzzer target for the chat-template engine: any input is a template, parsed and rendered
// with a realistic chat context (messages with tool calls, tools, special tokens) under tight
// limits. Must never crash, hang or leak; errors are fine. An input containing "\n#REQUEST\n" is
// split into a template and a chat request body rendered through render_chat as well.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "chat/jinja/template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Weather in Paris? 你好 😀"},
      {"role": "assistant", "content": "", "reasoning_content": "need a tool",
       "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5],
                      "opts": {"unit": "c", "x": null, "flag": true}}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
      {"role": "user", "content": [{"type": "text", "text": "thanks"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "thinking_mode": "enabled", "nums": [3, -1, 2.5, 0], "d": {"b": 2, "a": 1}
  })");
  return j;
}

m3::jinja::RenderOptions limits() {
  m3::jinja::RenderOptions o;
  o.limits.max_output_bytes = 1 << 20;
  o.limits.max_list_items = 1 << 16;
  o.limits.max_operations = 200000;
  o.now_unix = 1767323045;
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view tmpl = input, request;
  size_t sep = input.find("\n#REQUEST\n");
  if (sep != std::string_view::npos) {
    tmpl = input.substr(0, sep);
    request = input.substr(sep + 10);
  }
  auto parsed = m3::jinja::Template::parse(tmpl);
  if (!parsed.is_ok()) return 0;
  std::vector<std::pair<std::string, m3::jinja::Value>> vars;
  const auto& ctx = context();
  for (auto it = ctx.begin(); it != ctx.end(); ++it)
    vars.emplace_back(it.key(), m3::jinja::from_json(it.value()));
  (void)parsed->render(vars, limits());

  if (!request.empty()) {
    auto req = nlohmann::ordered_json::parse(request, nullptr, false);
    if (req.is_discarded()) return 0;
    auto t = m3::make_chat_template(std::string(tmpl), "fuzz", nlohmann::ordered_json::object());
    if (!t.is_ok()) return 0;
    m3::ChatTemplateOptions opt;
    opt.render = limits();
    (void)m3::render_chat(*t, req, opt);
  }
  return 0;
}

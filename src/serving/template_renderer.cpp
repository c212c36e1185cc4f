#include "serving/template_renderer.h"

namespace m3::serving {

namespace {

// render_chat takes ordered JSON (template iteration order = insertion order). The server's
// nlohmann::json has already sorted object keys, so converting loses nothing further.
nlohmann::ordered_json to_ordered(const nlohmann::json& j) {
  return nlohmann::ordered_json::parse(j.dump());
}

}  // namespace

Result<std::string> TemplateRenderer::render(const nlohmann::json& messages,
                                             const nlohmann::json& tools,
                                             const nlohmann::json& kwargs,
                                             bool add_generation_prompt) const {
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  request["messages"] = to_ordered(messages);
  if (tools.is_array() && !tools.empty()) request["tools"] = to_ordered(tools);
  if (kwargs.is_object() && !kwargs.empty()) request["chat_template_kwargs"] = to_ordered(kwargs);
  request["add_generation_prompt"] = add_generation_prompt;
  return render_chat(tmpl_, request);
}

}  // namespace m3::serving

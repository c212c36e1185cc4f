#include "serving/template_renderer.h"

namespace m3::serving {


Result<std::string> TemplateRenderer::render(const nlohmann::ordered_json& messages,
                                             const nlohmann::ordered_json& tools,
                                             const nlohmann::ordered_json& kwargs,
                                             bool add_generation_prompt) const {
  nlohmann::ordered_json request = nlohmann::ordered_json::object();
  request["messages"] = messages;
  if (tools.is_array() && !tools.empty()) request["tools"] = tools;
  if (kwargs.is_object() && !kwargs.empty()) request["chat_template_kwargs"] = kwargs;
  request["add_generation_prompt"] = add_generation_prompt;
  return render_chat(tmpl_, request);
}

}  // namespace m3::serving

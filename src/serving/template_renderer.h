// ChatRenderer (server/model_frontend.h) over the model's chat template (chat/chat_template.h).
#pragma once

#include <memory>

#include "chat/chat_template.h"
#include "server/model_frontend.h"

namespace m3::serving {

class TemplateRenderer final : public server::ChatRenderer {
 public:
  explicit TemplateRenderer(ChatTemplate tmpl) : tmpl_(std::move(tmpl)) {}

  // `kwargs` (thinking_mode, reasoning_effort, the request's chat_template_kwargs) become template
  // variables, as transformers' apply_chat_template(**kwargs). Errors from the template (malformed
  // messages, raise_exception) are invalid arguments.
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             const nlohmann::ordered_json& kwargs,
                             bool add_generation_prompt) const override;

  const ChatTemplate& chat_template() const { return tmpl_; }

 private:
  ChatTemplate tmpl_;
};

}  // namespace m3::serving

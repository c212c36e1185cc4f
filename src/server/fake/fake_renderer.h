// A C++ stand-in for MiniMax-M3's chat_template.jinja with the same skeleton
// (m3-architecture.md §7.2), for tests and --fake-backend until the Jinja engine (src/chat)
// renders the real template. It shows what the server hands a template: reasoning_content and
// tool calls of assistant turns after the last user message are rendered back (<mm:think> and
// the namespaced XML), earlier turns get a bare </mm:think>; tool results go in <response>.
#pragma once

#include "server/model_frontend.h"

namespace m3::server {

class FakeRenderer : public ChatRenderer {
 public:
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             const nlohmann::ordered_json& kwargs,
                             bool add_generation_prompt) const override;
};

// The namespaced XML for one value (what the template's to_xml macro produces).
std::string minimax_m3_to_xml(const nlohmann::ordered_json& value);

}  // namespace m3::server

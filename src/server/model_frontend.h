// What the server needs from the tokenizer (src/tokenizer) and the chat template (src/chat):
// two small interfaces, implemented by adapters over the real components and by fakes for tests.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace m3::server {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Special-token strings in `text` (the rendered template writes them) become their ids.
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  virtual Result<std::string> decode(const std::vector<int32_t>& ids,
                                     bool skip_special_tokens) const = 0;
  virtual int32_t vocab_size() const = 0;
  // The id of a single-token string such as "</mm:think>", if the vocabulary has it.
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;
};

// Renders a conversation with the model's chat template. `messages` are in the template's input
// form (protocol/messages.h: text content as a string, tool-call arguments as objects,
// reasoning_content kept); `kwargs` are extra template variables (thinking_mode,
// reasoning_effort, and the request's chat_template_kwargs).
class ChatRenderer {
 public:
  virtual ~ChatRenderer() = default;
  virtual Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                     const nlohmann::ordered_json& kwargs,
                                     bool add_generation_prompt) const = 0;
};

}  // namespace m3::server

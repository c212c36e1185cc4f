// apply_chat_template as transformers (5.x) does it, for an OpenAI-style chat request:
//   context = {special tokens of tokenizer_config.json} + chat_template_kwargs, then
//   template.render(messages=..., tools=..., documents=..., add_generation_prompt=..., **context)
// with vLLM's request preprocessing (assistant tool-call arguments given as a JSON string are
// parsed into an object) and transformers' continue_final_message cut.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"
#include "core/status.h"

namespace m3 {

struct ChatTemplate {
  // Where the template came from (for messages): ".../chat_template.jinja" or
  // ".../tokenizer_config.json".
  std::string origin;
  // The template used without tools ("default" of a named list), and the one used when the
  // request has tools (a named "tool_use" template, else the default one).
  std::shared_ptr<const jinja::Template> default_template;
  std::shared_ptr<const jinja::Template> tool_use_template;
  std::string default_source;  // continue_final_message checks the source mentions "content"
  std::string tool_use_source;
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token: those set to a
  // non-empty string in tokenizer_config.json (AddedToken dicts give their "content"), as
  // transformers' special_tokens_map.
  std::vector<std::pair<std::string, std::string>> special_tokens;
};

struct ChatTemplateOptions {
  jinja::RenderOptions render;
};

// Loads `chat_template.jinja` from the model directory, else `tokenizer_config.json`'s
// `chat_template` (a string, or a list of {name, template}); special tokens always come from
// tokenizer_config.json when it exists.
Result<ChatTemplate> load_chat_template(const std::string& model_dir);

// Builds a ChatTemplate from a template source and a tokenizer_config.json object (which may be
// empty). Used by load_chat_template and by tests.
Result<ChatTemplate> make_chat_template(const std::string& source, const std::string& origin,
                                        const nlohmann::ordered_json& tokenizer_config);

// Renders a chat request body: `messages` (required), `tools`, `documents`,
// `chat_template_kwargs`, `add_generation_prompt` (default true), `continue_final_message`
// (default false). Errors: a malformed request or a template error (raise_exception included) is
// kInvalidArgument; a template over its limits is kResourceExhausted.
Result<std::string> render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& request,
                                const ChatTemplateOptions& options = {});

}  // namespace m3

#include "server/protocol/unsupported_fields.h"

#include <string>

namespace m3::server {
namespace {

using json = nlohmann::ordered_json;

// Whether a field's value asks for something: anything but null, false, 0, "" and empty
// containers (the defaults clients send when they mean "off").
bool asks(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

struct Unsupported {
  const char* field;
  const char* why;
  bool chat_only;
  bool any_value = false;  // every non-null value asks (prompt_logprobs: 0 is a request too)
};

constexpr const char* kConstrained =
    "asks for constrained decoding (structured outputs), which m3serve does not have yet.";

constexpr Unsupported kFields[] = {
    // vLLM's and SGLang's structured-output fields.
    {"guided_json", kConstrained, false},
    {"guided_regex", kConstrained, false},
    {"guided_choice", kConstrained, false},
    {"guided_grammar", kConstrained, false},
    {"structured_outputs", kConstrained, false},
    {"structural_tag", kConstrained, false},
    {"json_schema", kConstrained, false},
    {"regex", kConstrained, false},
    {"ebnf", kConstrained, false},
    {"prompt_logprobs", "asks for the prompt's logprobs, which the engine does not compute.", false,
     true},
    {"use_beam_search", "asks for beam search, which m3serve does not implement.", false},
    {"include_stop_str_in_output",
     "is not supported: generation stops before a stop string, which is never part of the output.",
     false},
    {"return_tokens_as_token_ids", "is not supported: logprobs name tokens by their text.", false},
    {"priority", "needs priority scheduling, which m3serve does not have (requests are served "
                 "first come, first served).", false},
    {"lora_path", "asks for a LoRA adapter; m3serve serves the base model only.", false},
    {"lora_request", "asks for a LoRA adapter; m3serve serves the base model only.", false},
    {"return_hidden_states", "is not supported.", false},
    {"chat_template", "is not accepted: the server's chat template is used (set it with "
                      "--chat-template).", true},
    {"echo", "is not supported for chat completions (it is for /v1/completions).", true},
    {"functions", "is OpenAI's legacy function calling; send 'tools' instead.", true},
    {"function_call", "is OpenAI's legacy function calling; send 'tool_choice' instead.", true},
    {"audio", "asks for audio output; this model writes text only.", true},
};

}  // namespace

std::optional<ApiError> refuse_unsupported_fields(const json& body, bool chat) {
  for (const Unsupported& u : kFields) {
    if (u.chat_only && !chat) continue;
    auto it = body.find(u.field);
    if (it == body.end() || it->is_null() || (!u.any_value && !asks(*it))) continue;
    return bad_request(std::string("'") + u.field + "' " + u.why, u.field,
                       "unsupported_parameter");
  }
  if (chat) {
    // modalities: ["text"] is what this model does; anything else (audio) is not.
    if (auto it = body.find("modalities"); it != body.end() && !it->is_null()) {
      if (!it->is_array()) return bad_request("'modalities' must be a list.", "modalities");
      for (const auto& m : *it) {
        if (m != "text") {
          return bad_request("'modalities' may only hold \"text\": this model writes text only; "
                             "got " + m.dump() + ".",
                             "modalities", "unsupported_parameter");
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace m3::server

// Request fields that other OpenAI-compatible servers (vLLM, SGLang) or OpenAI itself accept and
// that m3serve cannot honour yet: constrained decoding, prompt logprobs, beam search, LoRA, audio,
// request-supplied chat templates and the like. A request that asks for one of them gets a 400
// naming the field (code "unsupported_parameter") instead of an answer that silently ignores it.
// A field given with its default ("use_beam_search": false, "priority": 0, null) is accepted.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/protocol/errors.h"

namespace m3::server {

// The first unsupported field that `body` asks for, as the error to send. `chat`: the body is a
// /v1/chat/completions request (chat-only fields are checked too).
std::optional<ApiError> refuse_unsupported_fields(const nlohmann::ordered_json& body, bool chat);

}  // namespace m3::server

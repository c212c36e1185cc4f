// OpenAI error objects: {"error": {"message", "type", "param", "code"}} with the HTTP status.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace m3::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field ("messages[2].content"), empty if none
  std::string code;   // machine-readable code, empty if none

  nlohmann::ordered_json to_json() const;
  // Invalid UTF-8 in the message (a parser's excerpt of a body with ill-formed bytes) becomes
  // U+FFFD instead of an exception: the error still reaches the client with its own status.
  std::string body() const {
    return to_json().dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
};

ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
ApiError unauthorized();
ApiError not_found(std::string message, std::string code = "not_found");
ApiError model_not_found(const std::string& model);
ApiError method_not_allowed(const std::string& method, const std::string& path);
ApiError payload_too_large(size_t limit);
ApiError queue_full(std::string message);
ApiError unavailable(std::string message, std::string code);
ApiError internal_error(std::string message);
// Maps a backend/front-end Status: invalid argument -> 400, resource exhausted -> 429,
// unavailable (loading, draining) -> 503, unimplemented -> 400, anything else -> 500.
ApiError from_status(const Status& status);
// The same for a refused submission: the engine's sampling-parameter check
// (validate_sampling_params: logit_bias ids past the vocabulary, min_tokens > max_tokens,
// stop_token_ids, ...) starts its message with the field's name, which becomes `param`.
ApiError submit_error(const Status& status);

}  // namespace m3::server

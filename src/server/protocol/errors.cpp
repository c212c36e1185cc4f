#include "server/protocol/errors.h"

namespace m3::server {

nlohmann::ordered_json ApiError::to_json() const {
  nlohmann::ordered_json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

ApiError unauthorized() {
  return {401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
          "authentication_error", "", "invalid_api_key"};
}

ApiError not_found(std::string message, std::string code) {
  return {404, std::move(message), "not_found_error", "", std::move(code)};
}

ApiError model_not_found(const std::string& model) {
  return {404, "The model '" + model + "' does not exist (see /v1/models).", "not_found_error",
          "model", "model_not_found"};
}

ApiError method_not_allowed(const std::string& method, const std::string& path) {
  return {405, "Method " + method + " is not allowed on " + path + ".", "invalid_request_error", "",
          "method_not_allowed"};
}

ApiError payload_too_large(size_t limit) {
  return {413, "Request body is larger than the limit of " + std::to_string(limit) + " bytes.",
          "invalid_request_error", "", "request_too_large"};
}

ApiError queue_full(std::string message) {
  return {429, std::move(message), "rate_limit_error", "", "queue_full"};
}

ApiError unavailable(std::string message, std::string code) {
  return {503, std::move(message), "service_unavailable", "", std::move(code)};
}

ApiError internal_error(std::string message) {
  return {500, std::move(message), "server_error", "", "internal_error"};
}

ApiError from_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
      return bad_request(status.message());
    case StatusCode::kResourceExhausted:
      return queue_full(status.message());
    case StatusCode::kUnavailable:
      return unavailable(status.message(), "unavailable");
    default:
      return internal_error(status.message());
  }
}

ApiError submit_error(const Status& status) {
  ApiError e = from_status(status);
  if (status.code() != StatusCode::kInvalidArgument) return e;
  // Longer names first where one is a prefix of another (stop_token_ids / stop).
  static constexpr const char* kFields[] = {
      "stop_token_ids", "stop", "logit_bias", "temperature", "top_p", "top_k", "min_p",
      "repetition_penalty", "presence_penalty", "frequency_penalty", "n", "max_tokens",
      "min_tokens", "top_logprobs"};
  const std::string& m = status.message();
  for (const char* field : kFields) {
    const std::string f = field;
    if (m.size() > f.size() && m.compare(0, f.size(), f) == 0 && m[f.size()] == ' ') {
      e.param = f;
      break;
    }
  }
  return e;
}

}  // namespace m3::server

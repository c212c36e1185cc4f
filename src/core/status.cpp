#include "core/status.h"

namespace m3 {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotFound: return "not found";
    case StatusCode::kDataLoss: return "data loss";
    case StatusCode::kUnimplemented: return "unimplemented";
    case StatusCode::kResourceExhausted: return "resource exhausted";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  std::string what = std::string(file) + ":" + std::to_string(line) + ": check failed: " + expr;
  if (!msg.empty()) what += ": " + msg;
  throw InternalError(what);
}

}  // namespace m3

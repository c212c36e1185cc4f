// Status and Result<T>: expected failures (bad input, missing file, wrong shape) are values, not
// exceptions. Internal invariant violations use M3_CHECK (throws m3::InternalError), caught at a
// request or step boundary so the process survives.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace m3 {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad user input (request, flag, config value)
  kNotFound,         // missing file or tensor
  kDataLoss,         // truncated or corrupt file
  kUnimplemented,    // valid input we do not support (yet)
  kResourceExhausted,
  kUnavailable,       // temporarily unable to serve (loading, draining)
  kInternal,
};

const char* status_code_name(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>", or "ok".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a T or a non-ok Status.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(implicit)
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result built from ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Thrown by M3_CHECK on a broken internal invariant (never for user input).
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace m3

#define M3_CHECK(cond, ...)                                                    \
  do {                                                                         \
    if (!(cond)) ::m3::check_failed(__FILE__, __LINE__, #cond, std::string{__VA_ARGS__}); \
  } while (0)

// Propagate a non-ok Status from an expression returning Status.
#define M3_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::m3::Status m3_status_ = (expr);     \
    if (!m3_status_.is_ok()) return m3_status_; \
  } while (0)

#define M3_CONCAT_INNER(a, b) a##b
#define M3_CONCAT(a, b) M3_CONCAT_INNER(a, b)
// M3_ASSIGN_OR_RETURN(auto x, expr): unwrap a Result or return its Status.
#define M3_ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto M3_CONCAT(m3_result_, __LINE__) = (expr);                        \
  if (!M3_CONCAT(m3_result_, __LINE__).is_ok())                         \
    return M3_CONCAT(m3_result_, __LINE__).status();                    \
  lhs = std::move(M3_CONCAT(m3_result_, __LINE__)).value()

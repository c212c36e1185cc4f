#include "server/fake/fake_flags.h"

#include <stdexcept>

namespace m3::server {

namespace {

Result<int32_t> to_int(const char* flag, const std::string& v, int32_t lo, int32_t hi) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size() || x < lo || x > hi) throw std::out_of_range("");
    return static_cast<int32_t>(x);
  } catch (const std::exception&) {
    return invalid_argument(std::string(flag) + " expects an integer in [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]; got '" + v + "'");
  }
}

}  // namespace

const std::vector<FakeFlag>& fake_flags() {
  static const std::vector<FakeFlag> kFlags = {
      {"--fake-backend", false,
       [](FakeServeOptions& o, const std::string&) {
         o.enabled = true;
         return Status::ok();
       }},
      {"--fake-tokens-per-step", true,
       [](FakeServeOptions& o, const std::string& v) {
         M3_ASSIGN_OR_RETURN(o.backend.tokens_per_step, to_int("--fake-tokens-per-step", v, 1, 64));
         return Status::ok();
       }},
      {"--fake-step-ms", true,
       [](FakeServeOptions& o, const std::string& v) {
         M3_ASSIGN_OR_RETURN(o.backend.step_ms, to_int("--fake-step-ms", v, 0, 10000));
         return Status::ok();
       }},
      {"--fake-ready-after-ms", true,
       [](FakeServeOptions& o, const std::string& v) {
         M3_ASSIGN_OR_RETURN(int32_t ms, to_int("--fake-ready-after-ms", v, 0, 600000));
         o.backend.ready_after = std::chrono::milliseconds(ms);
         return Status::ok();
       }},
      {"--fake-max-running", true,
       [](FakeServeOptions& o, const std::string& v) {
         M3_ASSIGN_OR_RETURN(o.backend.max_running, to_int("--fake-max-running", v, 1, 1000000));
         return Status::ok();
       }},
      {"--fake-load-ms", true,
       [](FakeServeOptions& o, const std::string& v) {
         M3_ASSIGN_OR_RETURN(int32_t ms, to_int("--fake-load-ms", v, 0, 600000));
         o.load_time = std::chrono::milliseconds(ms);
         return Status::ok();
       }},
  };
  return kFlags;
}

}  // namespace m3::server

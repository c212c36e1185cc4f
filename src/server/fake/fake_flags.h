// The hidden flags of `m3serve serve --fake-backend`: a scripted backend instead of a model, for
// the end-to-end tests and demos. Kept beside the fake so the production flags know nothing of it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/fake/fake_backend.h"

namespace m3::server {

struct FakeServeOptions {
  bool enabled = false;                  // --fake-backend
  FakeBackendOptions backend;            // --fake-tokens-per-step, --fake-step-ms, ...
  std::chrono::milliseconds load_time{0};  // --fake-load-ms: a pretend checkpoint load
};

struct FakeFlag {
  const char* name;
  bool takes_value;
  Status (*set)(FakeServeOptions& options, const std::string& value);
};

// --fake-backend, --fake-tokens-per-step, --fake-step-ms, --fake-ready-after-ms,
// --fake-max-running, --fake-load-ms.
const std::vector<FakeFlag>& fake_flags();

}  // namespace m3::server

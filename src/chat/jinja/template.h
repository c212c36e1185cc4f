// Public entry point of the Jinja engine: parse once, render many times (thread-safe: a Template
// is immutable after parsing; each render has its own interpreter state).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja/interpreter.h"
#include "chat/jinja/value.h"
#include "core/status.h"

namespace m3::jinja {

class Template {
 public:
  // Parses with transformers' settings (trim_blocks, lstrip_blocks). Errors carry "line L, column
  // C" of the template. `name` prefixes messages (e.g. the file the template came from).
  static Result<Template> parse(std::string_view source, const std::string& name = "template");

  // Renders with the given variables (besides the globals). A template error, raise_exception()
  // included, is a kInvalidArgument status; exceeding a limit is kResourceExhausted.
  Result<std::string> render(const std::vector<std::pair<std::string, Value>>& variables,
                             const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const struct Program> program_;
  std::string name_;
};

}  // namespace m3::jinja

#include "chat/jinja/template.h"

#include <new>

#include "chat/jinja/ast.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/parser.h"

namespace m3::jinja {
namespace {

std::string where(const std::string& name, SourcePos pos) {
  if (pos.line <= 0) return name;
  return name + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.col);
}

}  // namespace

Result<Template> Template::parse(std::string_view source, const std::string& name) {
  try {
    auto program = std::make_shared<Program>(jinja::parse(tokenize(source)));
    Template t;
    t.program_ = std::move(program);
    t.name_ = name;
    return t;
  } catch (const TemplateError& e) {
    return invalid_argument(where(name, e.pos()) + ": template syntax error: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, name + ": out of memory while parsing");
  }
}

Result<std::string> Template::render(const std::vector<std::pair<std::string, Value>>& variables,
                                     const RenderOptions& options) const {
  if (!program_) return internal_error("render of an unparsed template");
  try {
    auto globals = std::make_shared<Frame>();
    install_globals(*globals);
    auto root = std::make_shared<Frame>();
    root->parent = globals;
    for (const auto& [k, v] : variables) root->vars[k] = v;
    Interpreter in(options, root);
    return in.render(*program_);
  } catch (const TemplateError& e) {
    if (e.raised_by_template)
      return invalid_argument(where(name_, e.pos()) + ": raise_exception: " + e.what());
    if (e.limit_exceeded)
      return Status(StatusCode::kResourceExhausted, where(name_, e.pos()) + ": " + e.what());
    return invalid_argument(where(name_, e.pos()) + ": template error: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, name_ + ": out of memory while rendering");
  } catch (const std::exception& e) {
    return internal_error(name_ + ": " + e.what());
  }
}

}  // namespace m3::jinja

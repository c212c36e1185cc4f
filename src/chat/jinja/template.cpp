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

// jinja2 resolves filter and test names when it compiles the template, so an unknown name is an
// error even on a branch that never runs.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::kFilter && !is_known_filter(e->name))
    throw TemplateError("no filter named '" + e->name + "'", e->pos);
  if (e->kind == ExprKind::kTest && !is_known_test(e->name))
    throw TemplateError("no test named '" + e->name + "'", e->pos);
  for (const auto& c : e->children) check_names(c.get());
  for (const auto& kv : e->kwargs) check_names(kv.second.get());
  check_names(e->dyn_args.get());
  check_names(e->dyn_kwargs.get());
}

void check_names(const Body& body) {
  for (const StmtPtr& s : body) {
    check_names(s->expr.get());
    check_names(s->filter_cond.get());
    for (const auto& [cond, b] : s->branches) {
      check_names(cond.get());
      check_names(b);
    }
    check_names(s->body);
    check_names(s->else_body);
    for (const Param& p : s->params) check_names(p.default_value.get());
    for (const ExprPtr& f : s->filters) check_names(f.get());
    for (const auto& a : s->assigns) check_names(a.second.get());
  }
}

}  // namespace

Result<Template> Template::parse(std::string_view source, const std::string& name) {
  try {
    auto program = std::make_shared<Program>(jinja::parse(tokenize(source)));
    check_names(program->body);
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

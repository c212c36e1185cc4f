#include "chat/jinja/interpreter.h"

#include <cmath>
#include <limits>

#include "chat/jinja/builtins.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

[[noreturn]] void fail_limit(const std::string& msg) {
  TemplateError e(msg);
  e.limit_exceeded = true;
  throw e;
}

// Using an Undefined (arithmetic, attribute, call, iteration where forbidden) raises its hint.
[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

std::string obj_desc(const Value& v) {
  return "'" + (v.is_dict() ? std::string("dict") : v.type_name()) + " object'";
}

// The `loop` variable of a for loop.
class LoopObj : public Object {
 public:
  LoopObj(std::shared_ptr<const std::vector<Value>> items, size_t index0,
          std::shared_ptr<Value> last_changed)
      : items_(std::move(items)), i_(index0), last_changed_(std::move(last_changed)) {}
  std::string type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(i_ + 1) + "/" + std::to_string(items_->size()) + ">";
  }
  Value getattr(const std::string& n) const override {
    int64_t len = static_cast<int64_t>(items_->size());
    int64_t i = static_cast<int64_t>(i_);
    if (n == "index") return Value(i + 1);
    if (n == "index0") return Value(i);
    if (n == "revindex") return Value(len - i);
    if (n == "revindex0") return Value(len - i - 1);
    if (n == "first") return Value(i == 0);
    if (n == "last") return Value(i == len - 1);
    if (n == "length") return Value(len);
    if (n == "depth") return Value(1);
    if (n == "depth0") return Value(0);
    if (n == "previtem")
      return i > 0 ? (*items_)[i_ - 1] : Value::undefined("there is no previous item");
    if (n == "nextitem")
      return i + 1 < len ? (*items_)[i_ + 1] : Value::undefined("there is no next item");
    if (n == "cycle") {
      size_t idx = i_;
      return Value::function("cycle", [idx](Interpreter&, CallArgs& a) -> Value {
        if (a.args.empty()) fail("no items for cycling given");
        return a.args[idx % a.args.size()];
      });
    }
    if (n == "changed") {
      auto last = last_changed_;
      return Value::function("changed", [last](Interpreter&, CallArgs& a) -> Value {
        Value cur = Value::list(a.args);
        if (!last->is_undefined() && equals(*last, cur)) return Value(false);
        *last = cur;
        return Value(true);
      });
    }
    return Value::undefined("'LoopContext object' has no attribute '" + n + "'");
  }

 private:
  std::shared_ptr<const std::vector<Value>> items_;
  size_t i_;
  std::shared_ptr<Value> last_changed_;
};

struct DepthGuard {
  DepthGuard(int& d, int max, const char* what) : d_(d) {
    if (++d_ > max) {
      --d_;
      fail_limit(std::string(what));
    }
  }
  ~DepthGuard() { --d_; }
  int& d_;
};

bool checked_add(int64_t a, int64_t b, int64_t& r) { return !__builtin_add_overflow(a, b, &r); }
bool checked_sub(int64_t a, int64_t b, int64_t& r) { return !__builtin_sub_overflow(a, b, &r); }
bool checked_mul(int64_t a, int64_t b, int64_t& r) { return !__builtin_mul_overflow(a, b, &r); }

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t pymod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

double pyfmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// Minimal printf-style `str % args` (%s %r %d %i %f %%).
std::string percent_format(const std::string& fmt, const Value& arg) {
  std::vector<Value> args;
  if (arg.is_list() && arg.list_obj().is_tuple)
    args = arg.items();
  else
    args.push_back(arg);
  std::string out;
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    char c = fmt[i];
    if (c == '%') {
      out += '%';
      continue;
    }
    if (ai >= args.size()) fail("not enough arguments for format string");
    const Value& v = args[ai++];
    switch (c) {
      case 's': out += to_str(v); break;
      case 'r': out += repr(v); break;
      case 'd':
      case 'i':
        if (!v.is_number()) fail("%d format: a real number is required, not " + v.type_name());
        out += std::to_string(v.is_float() ? static_cast<int64_t>(v.as_float()) : v.int_value());
        break;
      case 'f': {
        if (!v.is_number()) fail("must be real number, not " + v.type_name());
        char b[64];
        std::snprintf(b, sizeof b, "%f", v.number_value());
        out += b;
        break;
      }
      default: fail(std::string("unsupported format character '") + c + "'");
    }
    check_size(out.size());
  }
  if (ai < args.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace

Interpreter::Interpreter(const RenderOptions& options, std::shared_ptr<Frame> root)
    : options_(options), root_(std::move(root)) {}

Interpreter::~Interpreter() {
  // Hold every object while emptying it, so releasing one cannot cascade into a deep recursive
  // destruction; then release them one by one.
  for (auto& f : closure_frames_) f->vars.clear();
  for (auto& ns : namespaces_) ns->clear();
  root_->vars.clear();
}

std::string Interpreter::render(const Program& program) {
  ScopedSizeLimit limit(options_.limits.max_output_bytes);
  std::string out;
  exec_body(program.body, out, root_);
  return out;
}

void Interpreter::tick(uint64_t n) {
  operations_ += n;
  if (operations_ > options_.limits.max_operations)
    fail_limit("template exceeded its operation budget (" +
         std::to_string(options_.limits.max_operations) + " loop iterations/statements/calls)");
}

void Interpreter::charge(const Value& v) {
  size_t n = 0;
  if (v.is_string()) n = v.str().size();
  else if (v.is_list()) n = v.items().size();
  else if (v.is_dict()) n = v.dict().size();
  tick(1 + n / 256);
}

void Interpreter::check_string_size(size_t n) const {
  if (n > options_.limits.max_output_bytes)
    fail_limit("template produced a string over the size limit (" +
         std::to_string(options_.limits.max_output_bytes) + " bytes)");
}

void Interpreter::check_list_size(size_t n) const {
  if (n > options_.limits.max_list_items)
    fail_limit("template built a list over the size limit (" +
         std::to_string(options_.limits.max_list_items) + " items)");
}

void Interpreter::append(std::string& out, std::string_view text) const {
  check_string_size(out.size() + text.size());
  out.append(text);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& e : v.dict().entries) keys.push_back(e.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : utf8_decode(v.str())) chars.emplace_back(utf8_encode(std::u32string(1, c)));
      return chars;
    }
    default:
      fail("'" + v.type_name() + "' object is not iterable");
  }
}

Value Interpreter::lookup(const std::string& name, const std::shared_ptr<Frame>& frame) {
  for (const Frame* f = frame.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(obj);
    case Value::Kind::kDict: {
      Value m = get_method(obj, name);
      if (m.is_callable()) charge(obj);
      if (m.is_callable() || !m.undefined_hint().empty()) return m;
      if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Kind::kObject:
      return obj.object().getattr(name);
    case Value::Kind::kString:
    case Value::Kind::kList: {
      Value m = get_method(obj, name);
      if (m.is_callable()) charge(obj);
      if (m.is_callable() || !m.undefined_hint().empty()) return m;
      return Value::undefined(obj_desc(obj) + " has no attribute '" + name + "'");
    }
    default:
      return Value::undefined(obj_desc(obj) + " has no attribute '" + name + "'");
  }
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      fail_undefined(obj);
    case Value::Kind::kDict: {
      if (const Value* v = obj.dict().find(key)) return *v;
      if (!key.is_string() && !key.is_number() && !key.is_none() &&
          !(key.is_list() && key.list_obj().is_tuple))
        fail("unhashable type: '" + key.type_name() + "'");
      if (key.is_string()) {
        Value m = get_method(obj, key.str());
        if (m.is_callable() || !m.undefined_hint().empty()) return m;
        return Value::undefined("'dict object' has no attribute '" + key.str() + "'");
      }
      return Value::undefined("'dict object' has no attribute " + repr(key));
    }
    case Value::Kind::kList: {
      const ListObj& l = obj.list_obj();
      if (l.is_generator) fail("'generator' object is not subscriptable");
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.int_value();
        int64_t n = static_cast<int64_t>(l.items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n)
          return Value::undefined(obj_desc(obj) + " has no element " + std::to_string(key.int_value()));
        return l.items[static_cast<size_t>(i)];
      }
      if (key.is_string()) return getattr(obj, key.str());
      return Value::undefined(obj_desc(obj) + " has no element " + repr(key));
    }
    case Value::Kind::kString: {
      if (key.is_int() || key.is_bool()) {
        const std::string& s = obj.str();
        int64_t i = key.int_value();
        if (is_ascii(s)) {
          int64_t n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i < 0 || i >= n)
            return Value::undefined("'str object' has no element " + std::to_string(key.int_value()));
          return Value(std::string(1, s[static_cast<size_t>(i)]));
        }
        std::u32string u = utf8_decode(s);
        int64_t n = static_cast<int64_t>(u.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n)
          return Value::undefined("'str object' has no element " + std::to_string(key.int_value()));
        return Value(utf8_encode(std::u32string(1, u[static_cast<size_t>(i)])));
      }
      if (key.is_string()) return getattr(obj, key.str());
      return Value::undefined("'str object' has no element " + repr(key));
    }
    case Value::Kind::kObject:
      if (key.is_string()) return obj.object().getattr(key.str());
      return Value::undefined(obj_desc(obj) + " has no element " + repr(key));
    default:
      if (key.is_string()) return getattr(obj, key.str());
      return Value::undefined(obj_desc(obj) + " has no element " + repr(key));
  }
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_callable()) {
    tick();
    DepthGuard g(eval_depth_, options_.limits.max_eval_depth, "template recursion too deep");
    return callee.callable().fn(*this, args);
  }
  if (callee.is_undefined()) fail_undefined(callee);
  fail("'" + callee.type_name() + "' object is not callable");
}

Value Interpreter::apply_filter(const std::string& name, const Value& operand, CallArgs& args) {
  charge(operand);
  Value result;
  if (!call_filter(*this, name, operand, args, result)) {
    if (is_known_filter(name)) fail("the '" + name + "' filter is not supported");
    fail("no filter named '" + name + "'");
  }
  return result;
}

bool Interpreter::apply_test(const std::string& name, const Value& operand, CallArgs& args) {
  bool result = false;
  if (!call_test(*this, name, operand, args, result)) {
    if (is_known_test(name)) fail("the '" + name + "' test is not supported");
    fail("no test named '" + name + "'");
  }
  return result;
}

// ---- statements ----

Flow Interpreter::exec_body(const Body& body, std::string& out,
                            const std::shared_ptr<Frame>& frame) {
  for (const StmtPtr& s : body) {
    Flow f = exec(*s, out, frame);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Flow Interpreter::exec(const Stmt& s, std::string& out, const std::shared_ptr<Frame>& frame) {
  DepthGuard g(eval_depth_, options_.limits.max_eval_depth, "template recursion too deep");
  tick();
  try {
    switch (s.kind) {
      case StmtKind::kText:
        append(out, s.text);
        return Flow::kNormal;
      case StmtKind::kOutput: {
        Value v = eval(*s.expr, frame);
        if (v.is_string())
          append(out, v.str());
        else
          append(out, to_str(v));
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (eval(*cond, frame).truthy()) return exec_body(body, out, frame);
        }
        return exec_body(s.else_body, out, frame);
      case StmtKind::kFor:
        exec_for(s, out, frame);
        return Flow::kNormal;
      case StmtKind::kSet:
        exec_set(s, frame, eval(*s.expr, frame));
        return Flow::kNormal;
      case StmtKind::kSetBlock: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        std::string captured;
        exec_body(s.body, captured, inner);
        Value v(std::move(captured));
        for (const ExprPtr& f : s.filters) {
          CallArgs a;
          eval_args(*f, 1, frame, a);
          v = apply_filter(f->name, v, a);
        }
        exec_set(s, frame, std::move(v));
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        frame->vars[s.text] = make_macro(s, frame, &s.body, &s.params, s.text);
        return Flow::kNormal;
      case StmtKind::kCallBlock: {
        const Expr& call = *s.expr;
        Value callee = eval(*call.children[0], frame);
        CallArgs a;
        eval_args(call, 1, frame, a);
        a.kwargs.emplace_back("caller", make_macro(s, frame, &s.body, &s.params, "caller"));
        Value v = this->call(callee, a);
        append(out, to_str(v));
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        std::string captured;
        exec_body(s.body, captured, inner);
        Value v(std::move(captured));
        for (const ExprPtr& f : s.filters) {
          CallArgs a;
          eval_args(*f, 1, frame, a);
          v = apply_filter(f->name, v, a);
        }
        append(out, to_str(v));
        return Flow::kNormal;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kWith: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        for (const auto& [name, expr] : s.assigns) inner->vars[name] = eval(*expr, frame);
        return exec_body(s.body, out, inner);
      }
      case StmtKind::kScope: {
        auto inner = std::make_shared<Frame>();
        inner->parent = frame;
        return exec_body(s.body, out, inner);
      }
    }
  } catch (TemplateError& e) {
    e.set_pos_if_unknown(s.pos);
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame, Value v) {
  if (!s.attr.empty()) {
    Value ns = lookup(s.targets[0], frame);
    if (!ns.is_object() || !ns.object().setattr(s.attr, std::move(v)))
      fail("can only assign attributes on namespace objects ('" + s.targets[0] + "' is " +
           obj_desc(ns) + ")");
    return;
  }
  if (s.targets.size() == 1) {
    frame->vars[s.targets[0]] = std::move(v);
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() != s.targets.size())
    fail(items.size() < s.targets.size()
             ? "not enough values to unpack (expected " + std::to_string(s.targets.size()) +
                   ", got " + std::to_string(items.size()) + ")"
             : "too many values to unpack (expected " + std::to_string(s.targets.size()) + ")");
  for (size_t i = 0; i < items.size(); ++i) frame->vars[s.targets[i]] = items[i];
}

void Interpreter::exec_for(const Stmt& s, std::string& out, const std::shared_ptr<Frame>& frame) {
  Value iterable = eval(*s.expr, frame);
  std::vector<Value> all = iterate(iterable);
  auto inner = std::make_shared<Frame>();
  inner->parent = frame;
  auto bind = [&](const Value& item) {
    if (s.targets.size() == 1) {
      inner->vars[s.targets[0]] = item;
      return;
    }
    std::vector<Value> parts = iterate(item);
    if (parts.size() != s.targets.size())
      fail(parts.size() < s.targets.size()
               ? "not enough values to unpack (expected " + std::to_string(s.targets.size()) +
                     ", got " + std::to_string(parts.size()) + ")"
               : "too many values to unpack (expected " + std::to_string(s.targets.size()) + ")");
    for (size_t i = 0; i < parts.size(); ++i) inner->vars[s.targets[i]] = parts[i];
  };
  std::shared_ptr<std::vector<Value>> items;
  if (s.filter_cond) {
    items = std::make_shared<std::vector<Value>>();
    for (const Value& item : all) {
      tick();
      bind(item);
      if (eval(*s.filter_cond, inner).truthy()) items->push_back(item);
    }
  } else {
    items = std::make_shared<std::vector<Value>>(std::move(all));
  }
  auto last_changed = std::make_shared<Value>();
  // loop.changed(loop) stores the loop object in state the loop object holds: reset it however the
  // loop ends so the cycle cannot leak.
  struct ResetOnExit {
    std::shared_ptr<Value> v;
    ~ResetOnExit() { *v = Value(); }
  } reset_changed{last_changed};
  std::shared_ptr<const std::vector<Value>> citems = items;
  for (size_t i = 0; i < citems->size(); ++i) {
    tick();
    // jinja2 starts every iteration from the enclosing scope: what the body set in the previous
    // iteration is not visible (only namespace() attributes carry over).
    inner = std::make_shared<Frame>();
    inner->parent = frame;
    bind((*citems)[i]);
    inner->vars["loop"] =
        Value(std::shared_ptr<Object>(std::make_shared<LoopObj>(citems, i, last_changed)));
    Flow f = exec_body(s.body, out, inner);
    if (f == Flow::kBreak) break;
  }
  if (citems->empty()) {
    inner = std::make_shared<Frame>();
    inner->parent = frame;
    exec_body(s.else_body, out, inner);
  }
}

Value Interpreter::make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, const Body* body,
                              const std::vector<Param>* params, const std::string& name) {
  const Stmt* stmt = &s;
  std::shared_ptr<Frame> closure = frame;
  if (closure_frames_.empty() || closure_frames_.back() != frame) closure_frames_.push_back(frame);
  bool is_caller = name == "caller" && s.kind == StmtKind::kCallBlock;
  return Value::function(name, [stmt, closure, body, params, name, is_caller](
                                   Interpreter& in, CallArgs& a) -> Value {
    DepthGuard g(in.call_depth_, in.options_.limits.max_call_depth,
                 "macro calls nested too deeply");
    auto f = std::make_shared<Frame>();
    f->parent = closure;
    const std::vector<Param>& ps = *params;
    bool varargs = is_caller || stmt->uses_varargs;
    bool kwargs_ok = is_caller || stmt->uses_kwargs;
    if (a.args.size() > ps.size() && !varargs)
      fail("macro '" + name + "' takes not more than " + std::to_string(ps.size()) +
           " argument(s)");
    std::vector<bool> set(ps.size(), false);
    for (size_t i = 0; i < a.args.size() && i < ps.size(); ++i) {
      f->vars[ps[i].name] = a.args[i];
      set[i] = true;
    }
    std::vector<std::pair<Value, Value>> extra_kwargs;
    Value caller;
    for (auto& [k, v] : a.kwargs) {
      bool found = false;
      for (size_t i = 0; i < ps.size(); ++i) {
        if (ps[i].name == k) {
          if (set[i]) fail("macro '" + name + "' got multiple values for argument '" + k + "'");
          f->vars[k] = v;
          set[i] = true;
          found = true;
          break;
        }
      }
      if (found) continue;
      if (k == "caller" && !is_caller) {
        caller = v;
        continue;
      }
      if (!kwargs_ok) fail("macro '" + name + "' takes no keyword argument '" + k + "'");
      extra_kwargs.emplace_back(Value(k), v);
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      if (set[i]) continue;
      if (ps[i].default_value)
        f->vars[ps[i].name] = in.eval(*ps[i].default_value, f);
      else
        f->vars[ps[i].name] = Value::undefined("parameter '" + ps[i].name + "' was not provided");
    }
    if (!is_caller) {
      if (stmt->uses_caller || !caller.is_undefined()) f->vars["caller"] = caller;
      if (stmt->uses_varargs) {
        std::vector<Value> rest;
        for (size_t i = ps.size(); i < a.args.size(); ++i) rest.push_back(a.args[i]);
        f->vars["varargs"] = Value::list(std::move(rest), true);
      }
      if (stmt->uses_kwargs) f->vars["kwargs"] = make_dict(std::move(extra_kwargs));
    }
    std::string out;
    in.exec_body(*body, out, f);
    return Value(std::move(out));
  });
}

// ---- expressions ----

void Interpreter::eval_args(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame,
                            CallArgs& out) {
  out.pos = e.pos;
  for (size_t i = first; i < e.children.size(); ++i) out.args.push_back(eval(*e.children[i], frame));
  for (const auto& [k, v] : e.kwargs) out.kwargs.emplace_back(k, eval(*v, frame));
  if (e.dyn_args) {
    for (Value& v : iterate(eval(*e.dyn_args, frame))) out.args.push_back(std::move(v));
  }
  if (e.dyn_kwargs) {
    Value d = eval(*e.dyn_kwargs, frame);
    if (!d.is_dict()) fail("argument after ** must be a mapping, not " + d.type_name());
    for (const auto& [k, v] : d.dict().entries) {
      if (!k.is_string()) fail("keywords must be strings");
      out.kwargs.emplace_back(k.str(), v);
    }
  }
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Frame>& frame) {
  DepthGuard g(eval_depth_, options_.limits.max_eval_depth, "template recursion too deep");
  try {
    return eval_inner(e, frame);
  } catch (TemplateError& err) {
    err.set_pos_if_unknown(e.pos);
    throw;
  }
}

Value Interpreter::eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName:
      return lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c, frame));
      return Value::list(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      std::vector<std::pair<Value, Value>> entries;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2)
        entries.emplace_back(eval(*e.children[i], frame), eval(*e.children[i + 1], frame));
      return make_dict(std::move(entries));
    }
    case ExprKind::kAttr:
      return getattr(eval(*e.children[0], frame), e.name);
    case ExprKind::kItem: {
      Value obj = eval(*e.children[0], frame);
      return getitem(obj, eval(*e.children[1], frame));
    }
    case ExprKind::kSlice: {
      Value obj = eval(*e.children[0], frame);
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        parts[i] = e.children[i + 1] ? eval(*e.children[i + 1], frame) : Value::none();
      return eval_slice(obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall: {
      Value callee = eval(*e.children[0], frame);
      CallArgs a;
      eval_args(e, 1, frame, a);
      return call(callee, a);
    }
    case ExprKind::kFilter: {
      Value operand = eval(*e.children[0], frame);
      CallArgs a;
      eval_args(e, 1, frame, a);
      return apply_filter(e.name, operand, a);
    }
    case ExprKind::kTest: {
      Value operand = eval(*e.children[0], frame);
      CallArgs a;
      eval_args(e, 1, frame, a);
      bool r = apply_test(e.name, operand, a);
      return Value(e.negated ? !r : r);
    }
    case ExprKind::kNot:
      return Value(!eval(*e.children[0], frame).truthy());
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.children[0], frame);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") +
             ": '" + v.type_name() + "'");
      if (e.kind == ExprKind::kPos) return v.is_bool() ? Value(v.int_value()) : v;
      if (v.is_float()) return Value(-v.as_float());
      if (v.int_value() == std::numeric_limits<int64_t>::min()) fail("integer overflow");
      return Value(-v.int_value());
    }
    case ExprKind::kBinary: {
      Value l = eval(*e.children[0], frame);
      Value r = eval(*e.children[1], frame);
      return eval_binary(e, l, r);
    }
    case ExprKind::kAnd: {
      Value l = eval(*e.children[0], frame);
      return l.truthy() ? eval(*e.children[1], frame) : l;
    }
    case ExprKind::kOr: {
      Value l = eval(*e.children[0], frame);
      return l.truthy() ? l : eval(*e.children[1], frame);
    }
    case ExprKind::kCompare: {
      Value l = eval(*e.children[0], frame);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value r = eval(*e.children[i + 1], frame);
        if (!eval_compare(e.ops[i], l, r)) return Value(false);
        l = std::move(r);
      }
      return Value(true);
    }
    case ExprKind::kCondExpr: {
      if (eval(*e.children[1], frame).truthy()) return eval(*e.children[0], frame);
      if (e.children[2]) return eval(*e.children[2], frame);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  fail("internal: unknown expression");
}

bool Interpreter::eval_compare(const std::string& op, const Value& l, const Value& r) {
  charge(r);
  if (op == "==") return equals(l, r);
  if (op == "!=") return !equals(l, r);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (r.is_string()) {
      if (!l.is_string()) {
        if (l.is_undefined()) fail_undefined(l);
        fail("'in <string>' requires string as left operand, not " + l.type_name());
      }
      found = r.str().find(l.str()) != std::string::npos;
    } else if (r.is_list()) {
      for (const Value& x : r.items())
        if (equals(x, l)) {
          found = true;
          break;
        }
    } else if (r.is_dict()) {
      if (l.is_list() && !l.list_obj().is_tuple) fail("unhashable type: 'list'");
      if (l.is_dict()) fail("unhashable type: 'dict'");
      found = r.dict().find(l) != nullptr;
    } else if (r.is_undefined()) {
      found = false;
    } else {
      fail("argument of type '" + r.type_name() + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  if (l.is_undefined()) fail_undefined(l);
  if (r.is_undefined()) fail_undefined(r);
  int c;
  try {
    c = compare(l, r);
  } catch (TemplateError&) {
    fail("'" + op + "' not supported between instances of '" + l.type_name() + "' and '" +
         r.type_name() + "'");
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Value Interpreter::eval_binary(const Expr& e, const Value& l, const Value& r) {
  const std::string& op = e.name;
  charge(l);
  charge(r);
  if (op == "~") {
    std::string s = to_str(l);
    std::string t = to_str(r);
    check_string_size(s.size() + t.size());
    return Value(s + t);
  }
  if (l.is_undefined()) fail_undefined(l);
  if (r.is_undefined()) fail_undefined(r);
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" +
         r.type_name() + "'");
  };
  bool nums = l.is_number() && r.is_number();
  bool ints = nums && !l.is_float() && !r.is_float();
  if (op == "+") {
    if (ints) {
      int64_t v;
      if (!checked_add(l.int_value(), r.int_value(), v)) fail("integer overflow");
      return Value(v);
    }
    if (nums) return Value(l.number_value() + r.number_value());
    if (l.is_string() && r.is_string()) {
      check_string_size(l.str().size() + r.str().size());
      return Value(l.str() + r.str());
    }
    if (l.is_string()) fail("can only concatenate str (not \"" + r.type_name() + "\") to str");
    if (l.is_list() && r.is_list() && !l.list_obj().is_generator && !r.list_obj().is_generator &&
        l.list_obj().is_tuple == r.list_obj().is_tuple) {
      check_list_size(l.items().size() + r.items().size());
      std::vector<Value> items = l.items();
      items.insert(items.end(), r.items().begin(), r.items().end());
      return Value::list(std::move(items), l.list_obj().is_tuple);
    }
    if (l.is_list() && !l.list_obj().is_generator)
      fail("can only concatenate " + l.type_name() + " (not \"" + r.type_name() + "\") to " +
           l.type_name());
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t v;
      if (!checked_sub(l.int_value(), r.int_value(), v)) fail("integer overflow");
      return Value(v);
    }
    if (nums) return Value(l.number_value() - r.number_value());
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t v;
      if (!checked_mul(l.int_value(), r.int_value(), v)) fail("integer overflow");
      return Value(v);
    }
    if (nums) return Value(l.number_value() * r.number_value());
    const Value* seq = nullptr;
    const Value* n = nullptr;
    if ((l.is_string() || l.is_list()) && (r.is_int() || r.is_bool())) {
      seq = &l;
      n = &r;
    } else if ((r.is_string() || r.is_list()) && (l.is_int() || l.is_bool())) {
      seq = &r;
      n = &l;
    }
    if (!seq || (seq->is_list() && seq->list_obj().is_generator)) {
      if (l.is_string() || r.is_string() || l.is_list() || r.is_list())
        fail("can't multiply sequence by non-int of type '" +
             (l.is_string() || l.is_list() ? r.type_name() : l.type_name()) + "'");
      return unsupported();
    }
    int64_t count = std::max<int64_t>(0, n->int_value());
    if (seq->is_string()) {
      if (count > 0 && seq->str().size() > 0)
        check_string_size(seq->str().size() * static_cast<size_t>(std::min<int64_t>(count, INT32_MAX)));
      std::string out;
      for (int64_t i = 0; i < count && !seq->str().empty(); ++i) out += seq->str();
      return Value(std::move(out));
    }
    if (count > 0 && !seq->items().empty())
      check_list_size(seq->items().size() * static_cast<size_t>(std::min<int64_t>(count, INT32_MAX)));
    std::vector<Value> items;
    for (int64_t i = 0; i < count && !seq->items().empty(); ++i)
      items.insert(items.end(), seq->items().begin(), seq->items().end());
    return Value::list(std::move(items), seq->list_obj().is_tuple);
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (r.number_value() == 0) fail(ints ? "division by zero" : "float division by zero");
    return Value(l.number_value() / r.number_value());
  }
  if (op == "//") {
    if (!nums) return unsupported();
    if (r.number_value() == 0)
      fail(ints ? "integer division or modulo by zero" : "float floor division by zero");
    if (ints) {
      if (l.int_value() == std::numeric_limits<int64_t>::min() && r.int_value() == -1)
        fail("integer overflow");
      return Value(floordiv(l.int_value(), r.int_value()));
    }
    return Value(std::floor(l.number_value() / r.number_value()));
  }
  if (op == "%") {
    if (l.is_string()) {
      std::string s = percent_format(l.str(), r);
      check_string_size(s.size());
      return Value(std::move(s));
    }
    if (!nums) return unsupported();
    if (r.number_value() == 0) fail(ints ? "integer division or modulo by zero" : "float modulo");
    if (ints) {
      if (r.int_value() == -1) return Value(static_cast<int64_t>(0));
      return Value(pymod(l.int_value(), r.int_value()));
    }
    return Value(pyfmod(l.number_value(), r.number_value()));
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && r.int_value() >= 0) {
      int64_t base = l.int_value(), exp = r.int_value(), result = 1;
      while (exp > 0) {
        if (exp & 1) {
          if (!checked_mul(result, base, result)) fail("integer overflow");
        }
        exp >>= 1;
        if (exp > 0 && !checked_mul(base, base, base)) fail("integer overflow");
      }
      return Value(result);
    }
    if (l.number_value() == 0 && r.number_value() < 0)
      fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(l.number_value(), r.number_value()));
  }
  fail("unknown operator " + op);
}

Value Interpreter::eval_slice(const Value& obj, const Value& start, const Value& stop,
                              const Value& step) {
  auto idx = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_int() && !v.is_bool())
      fail(std::string("slice indices must be integers or None (") + what + ")");
    return v.int_value();
  };
  std::optional<int64_t> a = idx(start, "start"), b = idx(stop, "stop"), c = idx(step, "step");
  int64_t st = c.value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto compute = [&](int64_t n) {
    std::vector<int64_t> out;
    int64_t lo, hi;
    if (st > 0) {
      lo = a ? (*a < 0 ? std::max<int64_t>(*a + n, 0) : std::min(*a, n)) : 0;
      hi = b ? (*b < 0 ? std::max<int64_t>(*b + n, 0) : std::min(*b, n)) : n;
      for (int64_t i = lo; i < hi; i += st) out.push_back(i);
    } else {
      lo = a ? (*a < 0 ? std::max<int64_t>(*a + n, -1) : std::min(*a, n - 1)) : n - 1;
      hi = b ? (*b < 0 ? std::max<int64_t>(*b + n, -1) : std::min(*b, n - 1)) : -1;
      for (int64_t i = lo; i > hi; i += st) out.push_back(i);
    }
    return out;
  };
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_string()) {
    std::u32string u = utf8_decode(obj.str());
    std::u32string r;
    for (int64_t i : compute(static_cast<int64_t>(u.size()))) r.push_back(u[static_cast<size_t>(i)]);
    return Value(utf8_encode(r));
  }
  if (obj.is_list() && !obj.list_obj().is_generator) {
    const auto& items = obj.items();
    std::vector<Value> r;
    for (int64_t i : compute(static_cast<int64_t>(items.size())))
      r.push_back(items[static_cast<size_t>(i)]);
    return Value::list(std::move(r), obj.list_obj().is_tuple);
  }
  fail("'" + obj.type_name() + "' object is not subscriptable");
}

}  // namespace m3::jinja

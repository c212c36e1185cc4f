// Tree-walking Jinja interpreter with jinja2 (ImmutableSandboxedEnvironment) semantics and hard
// limits, so an untrusted template can neither hang nor exhaust memory or stack.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace m3::jinja {

struct Limits {
  size_t max_output_bytes = 32u << 20;   // rendered text and any single string value
  size_t max_list_items = 1u << 20;      // any list built by the template (range, +, *)
  int max_call_depth = 64;               // nested macro calls
  int max_eval_depth = 1000;             // nested evaluation frames (stack guard)
  // Loop iterations + statements + calls, plus one per 256 bytes/items a builtin walks over.
  uint64_t max_operations = 5'000'000;
};

struct RenderOptions {
  Limits limits;
  // Unix time used by strftime_now (local time zone); unset = the current time.
  std::optional<int64_t> now_unix;
};

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const RenderOptions& options, std::shared_ptr<Frame> root);
  // Breaks the reference cycles a render may create (macros stored in the frame they close over,
  // `set ns.self = ns`) so nothing leaks.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders a program; throws TemplateError.
  std::string render(const Program& program);

  // ---- used by builtins ----
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& operand, CallArgs& args);
  bool apply_test(const std::string& name, const Value& operand, CallArgs& args);
  // jinja2 sandbox getattr (`obj.name`) and getitem (`obj[key]`).
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  const RenderOptions& options() const { return options_; }
  void tick(uint64_t n = 1);  // counts operations; throws when over budget
  // Charges the linear work of a builtin on `v` (its length in bytes or items / 256).
  void charge(const Value& v);
  void check_string_size(size_t n) const;
  void check_list_size(size_t n) const;
  // Namespaces created by this render (cleared when it ends).
  void own(std::shared_ptr<Namespace> ns) { namespaces_.push_back(std::move(ns)); }
  // Items of an iterable (list/tuple/generator, dict keys, string chars, Undefined -> empty).
  std::vector<Value> iterate(const Value& v);

 private:
  struct Macro;

  Flow exec_body(const Body& body, std::string& out, const std::shared_ptr<Frame>& frame);
  Flow exec(const Stmt& s, std::string& out, const std::shared_ptr<Frame>& frame);
  void exec_for(const Stmt& s, std::string& out, const std::shared_ptr<Frame>& frame);
  void exec_set(const Stmt& s, const std::shared_ptr<Frame>& frame, Value v);
  Value eval(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_inner(const Expr& e, const std::shared_ptr<Frame>& frame);
  Value eval_binary(const Expr& e, const Value& l, const Value& r);
  bool eval_compare(const std::string& op, const Value& l, const Value& r);
  Value eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  void eval_args(const Expr& e, size_t first, const std::shared_ptr<Frame>& frame,
                 CallArgs& out);
  Value lookup(const std::string& name, const std::shared_ptr<Frame>& frame);
  Value make_macro(const Stmt& s, const std::shared_ptr<Frame>& frame, const Body* body,
                   const std::vector<Param>* params, const std::string& name);
  void append(std::string& out, std::string_view text) const;

  RenderOptions options_;
  std::shared_ptr<Frame> root_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
  std::vector<std::shared_ptr<Frame>> closure_frames_;  // frames captured by macros/callers
  uint64_t operations_ = 0;
  int eval_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace m3::jinja

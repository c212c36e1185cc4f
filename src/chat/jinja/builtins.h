// Built-in filters, tests, methods (str/dict/list) and globals, split by concern:
// filters.cpp, tests.cpp, methods.cpp, globals.cpp. All throw TemplateError on misuse.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "chat/jinja/interpreter.h"
#include "chat/jinja/value.h"

namespace m3::jinja {

// Binds a builtin's arguments like Python: positional first, then keywords by name.
struct BoundArgs {
  std::vector<Value> values;
  std::vector<bool> given;
  bool has(size_t i) const { return given[i]; }
  const Value& operator[](size_t i) const { return values[i]; }
  const Value& get(size_t i, const Value& fallback) const { return given[i] ? values[i] : fallback; }
};
BoundArgs bind_args(const CallArgs& args, const std::string& fn,
                    std::initializer_list<const char*> names);

// Every filter/test name jinja2 knows: an unknown name is a template error even on a path that
// never runs (jinja2 checks at compile time); a known name we do not implement fails when used.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

// Returns false when the filter/test is not implemented.
bool call_filter(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args,
                 Value& result);
bool call_test(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args,
               bool& result);

// A bound method of a str, dict or list (`"a b".split()`, `d.items()`), or Undefined. Methods that
// would mutate (append, pop, update, ...) return an Undefined that fails with a security error
// when called, as in jinja2's ImmutableSandboxedEnvironment.
Value get_method(const Value& obj, const std::string& name);

// range, namespace, dict, raise_exception, strftime_now, cycler, joiner.
void install_globals(Frame& globals);

// Python str methods shared by filters and methods.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count);
std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool right);
std::string html_escape(const std::string& s);

// Python int(str) parsing (strips whitespace, allows '_' and sign); false if not an integer.
bool parse_py_int(const std::string& s, int64_t base, int64_t& out);
bool parse_py_float(const std::string& s, double& out);

}  // namespace m3::jinja

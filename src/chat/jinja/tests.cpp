// jinja2's built-in tests (`x is defined`, `x is divisibleby 3`, ...).
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "chat/jinja/builtins.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

const Value& arg0(CallArgs& a, const char* test) {
  BoundArgs b = bind_args(a, test, {"other"});
  if (!b.has(0)) fail(std::string("test '") + test + "' needs an argument");
  a.args = {b[0]};
  return a.args[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_callable(Interpreter&, const Value& v, CallArgs&) { return v.is_callable(); }
// test_sequence: len() and __getitem__ work (str, list, tuple, dict).
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_dict() || (v.is_list() && !v.list_obj().is_generator);
}
// test_iterable: iter() works (Undefined is iterable in jinja2).
bool t_iterable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
int64_t int_operand(const Value& v, const char* test) {
  if (v.is_undefined())
    fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
  if (!v.is_int() && !v.is_bool())
    fail(std::string("test '") + test + "' needs an integer, got " + v.type_name());
  return v.int_value();
}
bool t_even(Interpreter&, const Value& v, CallArgs&) { return int_operand(v, "even") % 2 == 0; }
bool t_odd(Interpreter&, const Value& v, CallArgs&) { return int_operand(v, "odd") % 2 != 0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const Value& n = arg0(a, "divisibleby");
  if (v.is_float() || n.is_float()) {
    double d = n.number_value();
    if (d == 0) fail("float modulo");
    return std::fmod(v.number_value(), d) == 0;
  }
  int64_t d = int_operand(n, "divisibleby");
  if (d == 0) fail("integer division or modulo by zero");
  return int_operand(v, "divisibleby") % d == 0;
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, arg0(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, arg0(a, "ne")); }
int cmp(const Value& v, const Value& o) {
  if (v.is_undefined() || o.is_undefined()) {
    const Value& u = v.is_undefined() ? v : o;
    fail(u.undefined_hint().empty() ? std::string("value is undefined") : u.undefined_hint());
  }
  return compare(v, o);
}
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return cmp(v, arg0(a, "lt")) < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return cmp(v, arg0(a, "le")) <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return cmp(v, arg0(a, "gt")) > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return cmp(v, arg0(a, "ge")) >= 0; }
bool t_in(Interpreter& in, const Value& v, CallArgs& a) {
  const Value& seq = arg0(a, "in");
  if (seq.is_string()) {
    if (!v.is_string()) fail("'in <string>' requires string as left operand, not " + v.type_name());
    return seq.str().find(v.str()) != std::string::npos;
  }
  if (seq.is_dict()) return seq.dict().find(v) != nullptr;
  if (seq.is_list()) {
    for (const Value& x : seq.items())
      if (equals(x, v)) return true;
    return false;
  }
  if (seq.is_undefined()) return false;
  (void)in;
  fail("argument of type '" + seq.type_name() + "' is not iterable");
}
// `sameas`: Python identity; for the immutable scalars templates compare this matches ==
// restricted to the same type (None, True, False, small ints, interned strings).
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value& o = arg0(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return v.kind() == o.kind() && v.is_none();
  if (v.is_bool()) return v.as_bool() == o.as_bool();
  if (v.is_int()) return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
  return false;
}
bool t_lower(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.is_string() ? v.str() : to_str(v);
  return s == py_lower(s) && s != py_upper(s);
}
bool t_upper(Interpreter&, const Value& v, CallArgs&) {
  std::string s = v.is_string() ? v.str() : to_str(v);
  return s == py_upper(s) && s != py_lower(s);
}
bool t_escaped(Interpreter&, const Value&, CallArgs&) { return false; }
bool t_filter(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && is_known_filter(v.str());
}
bool t_test(Interpreter&, const Value& v, CallArgs&) {
  return v.is_string() && is_known_test(v.str());
}

const std::unordered_map<std::string, TestFn>& test_table() {
  static const std::unordered_map<std::string, TestFn> t = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},
      {"string", t_string},     {"number", t_number},       {"integer", t_integer},
      {"float", t_float},       {"boolean", t_boolean},     {"true", t_true},
      {"false", t_false},       {"mapping", t_mapping},     {"callable", t_callable},
      {"sequence", t_sequence}, {"iterable", t_iterable},   {"even", t_even},
      {"odd", t_odd},           {"divisibleby", t_divisibleby}, {"eq", t_eq},
      {"equalto", t_eq},        {"==", t_eq},               {"ne", t_ne},
      {"!=", t_ne},             {"lt", t_lt},               {"lessthan", t_lt},
      {"<", t_lt},              {"le", t_le},               {"<=", t_le},
      {"gt", t_gt},             {"greaterthan", t_gt},      {">", t_gt},
      {"ge", t_ge},             {">=", t_ge},               {"in", t_in},
      {"sameas", t_sameas},     {"lower", t_lower},         {"upper", t_upper},
      {"escaped", t_escaped},   {"filter", t_filter},       {"test", t_test},
  };
  return t;
}

}  // namespace

bool is_known_test(const std::string& name) { return test_table().count(name) > 0; }

bool call_test(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args,
               bool& result) {
  const auto& t = test_table();
  auto it = t.find(name);
  if (it == t.end()) return false;
  result = it->second(in, operand, args);
  return true;
}

}  // namespace m3::jinja

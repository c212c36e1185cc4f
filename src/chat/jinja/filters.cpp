// jinja2's built-in filters (3.1) plus transformers' tojson override
// (json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

#include <utf8proc.h>

#include "chat/jinja/builtins.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

// jinja2's soft_str: str() of the value (Undefined -> "").
std::string soft_str(const Value& v) { return v.is_string() ? v.str() : to_str(v); }

Value ignore_case(const Value& v) { return v.is_string() ? Value(py_lower(v.str())) : v; }

// make_attrgetter: dotted path, integer parts index sequences; getitem semantics.
Value get_attribute(Interpreter& in, const Value& item, const Value& attribute) {
  if (attribute.is_int()) return in.getitem(item, attribute);
  std::string path = to_str(attribute);
  Value cur = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? in.getitem(cur, Value(static_cast<int64_t>(std::stoll(part)))) : in.getitem(cur, Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

size_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return utf8_length(v.str());
    case Value::Kind::kList:
      if (v.list_obj().is_generator) fail("object of type 'generator' has no len()");
      return v.items().size();
    case Value::Kind::kDict: return v.dict().size();
    default: fail("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "length", {});
  return Value(static_cast<int64_t>(py_len(v)));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "default", {"default_value", "boolean"});
  Value dflt = b.get(0, Value(""));
  bool boolean = b.get(1, Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
  return v;
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = b.get(0, Value(false)).truthy();
  const Value& ind = b[1];
  if (b.has(1) && !ind.is_none()) {
    if (ind.is_string()) {
      o.has_indent_str = true;
      o.indent_str = ind.str();
    } else if (ind.is_int() || ind.is_bool()) {
      o.indent = static_cast<int>(std::clamp<int64_t>(ind.int_value(), 0, 1000));
      if (ind.int_value() < 0) o.indent = 0;
    } else {
      fail("tojson: indent must be an int or a string");
    }
  }
  if (b.has(2) && !b[2].is_none()) {
    const Value& s = b[2];
    if (!s.is_list() || s.items().size() != 2 || !s.items()[0].is_string() ||
        !s.items()[1].is_string())
      fail("tojson: separators must be a pair of strings");
    o.has_separators = true;
    o.item_sep = s.items()[0].str();
    o.key_sep = s.items()[1].str();
  }
  o.sort_keys = b.get(3, Value(false)).truthy();
  std::string s = to_json(v, o);
  in.check_string_size(s.size());
  return Value(std::move(s));
}

Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "items", {});
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict().entries) out.push_back(Value::list({k, val}, true));
  return Value::generator(std::move(out));
}

Value select_impl(Interpreter& in, const Value& seq, CallArgs& a, bool by_attr, bool keep,
                  const char* fn) {
  size_t first = 0;
  Value attribute;
  if (by_attr) {
    if (a.args.empty()) fail(std::string(fn) + "() missing attribute argument");
    attribute = a.args[0];
    first = 1;
  }
  std::string test;
  std::vector<Value> test_args;
  if (a.args.size() > first) {
    test = to_str(a.args[first]);
    test_args.assign(a.args.begin() + static_cast<long>(first) + 1, a.args.end());
  }
  std::vector<Value> out;
  for (const Value& item : in.iterate(seq)) {
    in.tick();
    Value x = by_attr ? get_attribute(in, item, attribute) : item;
    bool r;
    if (test.empty()) {
      r = x.truthy();
    } else {
      CallArgs ta;
      ta.args = test_args;
      ta.kwargs = a.kwargs;
      r = in.apply_test(test, x, ta);
    }
    if (r == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true, "selectattr");
}
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false, "rejectattr");
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true, "select");
}
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false, "reject");
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  Value dflt;
  bool has_default = false;
  for (const auto& [k, val] : a.kwargs) {
    if (k == "attribute") {
      attribute = &val;
    } else if (k == "default") {
      dflt = val;
      has_default = true;
    }
  }
  if (attribute) {
    for (const auto& [k, val] : a.kwargs)
      if (k != "attribute" && k != "default") fail("Unexpected keyword argument '" + k + "'");
    for (const Value& item : in.iterate(v)) {
      in.tick();
      Value x = get_attribute(in, item, *attribute);
      if (x.is_undefined() && has_default) x = dflt;
      out.push_back(std::move(x));
    }
    return Value::generator(std::move(out));
  }
  if (a.args.empty()) fail("map requires a filter argument");
  std::string name = to_str(a.args[0]);
  for (const Value& item : in.iterate(v)) {
    in.tick();
    CallArgs fa;
    fa.args.assign(a.args.begin() + 1, a.args.end());
    fa.kwargs = a.kwargs;
    out.push_back(in.apply_filter(name, item, fa));
  }
  return Value::generator(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "join", {"d", "attribute"});
  std::string sep = soft_str(b.get(0, Value("")));
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    Value x = b.has(1) && !b[1].is_none() ? get_attribute(in, item, b[1]) : item;
    if (!first) out += sep;
    first = false;
    out += soft_str(x);
    in.check_string_size(out.size());
  }
  return Value(std::move(out));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "trim", {"chars"});
  return Value(py_strip(soft_str(v), b.get(0, Value::none()), true, true));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "upper", {});
  return Value(py_upper(soft_str(v)));
}
Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "lower", {});
  return Value(py_lower(soft_str(v)));
}
Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "capitalize", {});
  return Value(py_capitalize(soft_str(v)));
}

// jinja2 do_title: capitalise after runs of [-\s({[<].
Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "title", {});
  std::u32string s = utf8_decode(soft_str(v));
  std::string out;
  bool start = true;
  for (char32_t c : s) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c);
    if (sep) {
      utf8_append(out, c);
      start = true;
      continue;
    }
    std::string ch = utf8_encode(std::u32string(1, c));
    out += start ? py_upper(ch) : py_lower(ch);
    start = false;
  }
  return Value(std::move(out));
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "replace", {"old", "new", "count"});
  if (!b.has(0) || !b.has(1)) fail("replace() missing required arguments 'old' and 'new'");
  int64_t count = b.has(2) && !b[2].is_none() ? b[2].int_value() : -1;
  std::string r = py_replace(soft_str(v), soft_str(b[0]), soft_str(b[1]), count);
  in.check_string_size(r.size());
  return Value(std::move(r));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(a, "first", {});
  if (v.is_list()) {
    if (v.items().empty()) return Value::undefined("No first item, sequence was empty.");
    return v.items()[0];
  }
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items[0];
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(a, "last", {});
  if (v.is_list() && v.list_obj().is_generator) fail("'generator' object is not reversible");
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(a, "list", {});
  return Value::list(in.iterate(v));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "string", {});
  return Value(soft_str(v));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "int", {"default", "base"});
  Value dflt = b.get(0, Value(static_cast<int64_t>(0)));
  int64_t base = b.get(1, Value(static_cast<int64_t>(10))).int_value();
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return Value(v.int_value());
  if (v.is_float()) {
    double d = v.as_float();
    if (!std::isfinite(d)) fail("cannot convert float infinity or NaN to integer");
    return Value(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    int64_t out;
    if (parse_py_int(v.str(), base, out)) return Value(out);
    double d;
    if (parse_py_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(static_cast<int64_t>(std::trunc(d)));
  }
  return dflt;
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "float", {"default"});
  Value dflt = b.get(0, Value(0.0));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.number_value());
  if (v.is_string()) {
    double d;
    if (parse_py_float(v.str(), d)) return Value(d);
  }
  return dflt;
}

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "abs", {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.int_value() == INT64_MIN) fail("integer overflow");
    return Value(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  if (v.is_undefined()) fail_undefined(v);
  fail("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "round", {"precision", "method"});
  int64_t precision = b.get(0, Value(static_cast<int64_t>(0))).int_value();
  std::string method = b.has(1) ? to_str(b[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail("type " + v.type_name() + " doesn't define __round__ method");
  double p = std::pow(10.0, static_cast<double>(precision));
  if (method == "common") {
    if (!v.is_float() && precision >= 0) return Value(v.int_value());
    double x = v.number_value();
    if (!std::isfinite(x)) return Value(x);
    if (precision >= 0 && precision < 300) {
      // Python rounds the exact binary value half-to-even (round(2.675, 2) == 2.67); printf's
      // %.*f does the same exact decimal rounding.
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), x);
      return Value(std::strtod(buf, nullptr));
    }
    return Value(std::nearbyint(x * p) / p);
  }
  double x = v.number_value() * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "unique", {"case_sensitive", "attribute"});
  bool cs = b.get(0, Value(false)).truthy();
  DictObj seen;  // a Python set: unhashable items are an error, as in jinja2
  std::vector<Value> out;
  for (const Value& item : in.iterate(v)) {
    Value key = b.has(1) && !b[1].is_none() ? get_attribute(in, item, b[1]) : item;
    if (!cs) key = ignore_case(key);
    if (seen.find(key)) continue;
    seen.set(key, Value::none());
    out.push_back(item);
  }
  return Value::generator(std::move(out));
}

void sort_values(std::vector<Value>& items, const std::function<Value(const Value&)>& key,
                 bool reverse) {
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare(key(y), key(x)) < 0 : compare(key(x), key(y)) < 0;
  });
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "dictsort", {"case_sensitive", "by", "reverse"});
  bool cs = b.get(0, Value(false)).truthy();
  std::string by = b.has(1) ? to_str(b[1]) : "key";
  bool reverse = b.get(2, Value(false)).truthy();
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) fail("dictsort: value is not a mapping");
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict().entries) items.push_back(Value::list({k, val}, true));
  size_t pos = by == "key" ? 0 : 1;
  sort_values(
      items, [&](const Value& x) { return cs ? x.items()[pos] : ignore_case(x.items()[pos]); },
      reverse);
  return Value::list(std::move(items));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool reverse = b.get(0, Value(false)).truthy();
  bool cs = b.get(1, Value(false)).truthy();
  std::vector<Value> items = in.iterate(v);
  bool by_attr = b.has(2) && !b[2].is_none();
  sort_values(
      items,
      [&](const Value& x) {
        Value k = by_attr ? get_attribute(in, x, b[2]) : x;
        return cs ? k : ignore_case(k);
      },
      reverse);
  return Value::list(std::move(items));
}

Value minmax(Interpreter& in, const Value& v, CallArgs& a, bool want_max, const char* fn) {
  BoundArgs b = bind_args(a, fn, {"case_sensitive", "attribute"});
  bool cs = b.get(0, Value(false)).truthy();
  bool by_attr = b.has(1) && !b[1].is_none();
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  auto key = [&](const Value& x) {
    Value k = by_attr ? get_attribute(in, x, b[1]) : x;
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, false, "min"); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return minmax(in, v, a, true, "max"); }

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "sum", {"attribute", "start"});
  Value total = b.get(1, Value(static_cast<int64_t>(0)));
  for (const Value& item : in.iterate(v)) {
    Value x = b.has(0) && !b[0].is_none() ? get_attribute(in, item, b[0]) : item;
    if (!x.is_number() || !total.is_number())
      fail("unsupported operand type(s) for +: '" + total.type_name() + "' and '" +
           x.type_name() + "'");
    if (x.is_float() || total.is_float())
      total = Value(total.number_value() + x.number_value());
    else
      total = Value(total.int_value() + x.int_value());
  }
  return total;
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(a, "reverse", {});
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value(utf8_encode(u));
  }
  if (v.is_list() && v.list_obj().is_generator) {
    std::vector<Value> items = v.items();
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));
}

std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> lines;
  std::u32string u = utf8_decode(s);
  std::u32string cur;
  for (size_t i = 0; i < u.size(); ++i) {
    char32_t c = u[i];
    bool br = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
              c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!br) {
      cur.push_back(c);
      continue;
    }
    if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    lines.push_back(utf8_encode(cur));
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(utf8_encode(cur));
  return lines;
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "indent", {"width", "first", "blank"});
  std::string ind;
  Value w = b.get(0, Value(static_cast<int64_t>(4)));
  if (w.is_string()) {
    ind = w.str();
  } else {
    int64_t n = w.int_value();
    if (n > 0) {
      in.check_string_size(static_cast<size_t>(std::min<int64_t>(n, INT32_MAX)));
      ind.assign(static_cast<size_t>(n), ' ');
    }
  }
  bool first = b.get(1, Value(false)).truthy();
  bool blank = b.get(2, Value(false)).truthy();
  std::string s = soft_str(v) + "\n";
  std::vector<std::string> lines = py_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
      check_size(rv.size());
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += ind;
        rv += lines[i];
        check_size(rv.size());
      }
    }
  }
  if (first) rv = ind + rv;
  in.check_string_size(rv.size());
  return Value(std::move(rv));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "wordcount", {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(soft_str(v))) {
    bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : [&] {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO;
    }());
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "center", {"width"});
  int64_t width = b.get(0, Value(static_cast<int64_t>(80))).int_value();
  std::string s = soft_str(v);
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value(s);
  in.check_string_size(static_cast<size_t>(width));
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(marg - left), ' '));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "escape", {});
  return Value(html_escape(soft_str(v)));
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "safe", {});
  return Value(soft_str(v));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  // str % args via the interpreter's binary operator semantics.
  Value args = a.args.size() == 1 ? a.args[0] : Value::list(a.args, true);
  if (!a.kwargs.empty()) fail("format filter: keyword arguments are not supported");
  std::string fmt = soft_str(v);
  std::string out;
  std::vector<Value> items =
      args.is_list() && args.list_obj().is_tuple ? args.items() : std::vector<Value>{args};
  size_t ai = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    if (ai >= items.size()) fail("not enough arguments for format string");
    const Value& x = items[ai++];
    if (fmt[i] == 's') out += to_str(x);
    else if (fmt[i] == 'r') out += repr(x);
    else if (fmt[i] == 'd' || fmt[i] == 'i') out += std::to_string(x.is_float() ? static_cast<int64_t>(x.as_float()) : x.int_value());
    else fail(std::string("unsupported format character '") + fmt[i] + "'");
    check_size(out.size());
  }
  in.check_string_size(out.size());
  return Value(std::move(out));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "attr", {"name"});
  if (!b.has(0)) fail("attr() missing required argument 'name'");
  // Python getattr only: a dict's keys are not attributes (only its methods are).
  std::string name = to_str(b[0]);
  if (v.is_object()) return v.object().getattr(name);
  if (v.is_undefined()) return in.getattr(v, name);
  Value m = get_method(v, name);
  if (m.is_callable() || !m.undefined_hint().empty()) return m;
  return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
}

Value f_pprint(Interpreter&, const Value& v, CallArgs& a) {
  bind_args(a, "pprint", {});
  return Value(repr(v));
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  BoundArgs b = bind_args(a, "batch", {"linecount", "fill_with"});
  int64_t n = b.get(0, Value(static_cast<int64_t>(1))).int_value();
  if (n <= 0) fail("batch: linecount must be positive");
  std::vector<Value> out, cur;
  for (const Value& item : in.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (b.has(1) && !b[1].is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(b[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> t = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
      {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent},     {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},           {"pprint", f_pprint},
      {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},
      {"select", f_select},     {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string},     {"sum", f_sum},           {"title", f_title},
      {"tojson", f_tojson},     {"trim", f_trim},         {"unique", f_unique},
      {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return t;
}

}  // namespace

BoundArgs bind_args(const CallArgs& args, const std::string& fn,
                    std::initializer_list<const char*> names) {
  BoundArgs b;
  b.values.resize(names.size());
  b.given.assign(names.size(), false);
  if (args.args.size() > names.size())
    fail(fn + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
         std::to_string(args.args.size()) + " given)");
  for (size_t i = 0; i < args.args.size(); ++i) {
    b.values[i] = args.args[i];
    b.given[i] = true;
  }
  for (const auto& [k, v] : args.kwargs) {
    size_t i = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++i;
    }
    if (i == names.size()) fail(fn + "() got an unexpected keyword argument '" + k + "'");
    if (b.given[i]) fail(fn + "() got multiple values for argument '" + k + "'");
    b.values[i] = v;
    b.given[i] = true;
  }
  return b;
}

bool is_known_filter(const std::string& name) {
  static const std::unordered_set<std::string> known = {
      "abs",      "attr",     "batch",     "capitalize", "center",     "count",      "d",
      "default",  "dictsort", "e",         "escape",     "filesizeformat", "first",  "float",
      "forceescape", "format", "groupby",  "indent",     "int",        "join",       "last",
      "length",   "list",     "lower",     "items",      "map",        "min",        "max",
      "pprint",   "random",   "reject",    "rejectattr", "replace",    "reverse",    "round",
      "safe",     "select",   "selectattr", "slice",     "sort",       "string",     "striptags",
      "sum",      "title",    "trim",      "truncate",   "unique",     "upper",      "urlencode",
      "urlize",   "wordcount", "wordwrap", "xmlattr",    "tojson"};
  return known.count(name) > 0;
}

bool call_filter(Interpreter& in, const std::string& name, const Value& operand, CallArgs& args,
                 Value& result) {
  const auto& t = filter_table();
  auto it = t.find(name);
  if (it == t.end()) return false;
  result = it->second(in, operand, args);
  return true;
}

}  // namespace m3::jinja

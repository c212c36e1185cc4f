// Python methods templates call on values: str (strip, split, startswith, ...), dict (items, get,
// ...), list (index, count). Mutating methods are refused like jinja2's
// ImmutableSandboxedEnvironment does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include <utf8proc.h>

#include "chat/jinja/builtins.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

bool is_cased_upper(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LU ||
         utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LT;
}
bool is_cased_lower(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LL;
}
bool is_cased(char32_t c) {
  return is_cased_upper(c) || is_cased_lower(c) ||
         utf8proc_tolower(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c);
}
char32_t to_upper(char32_t c) {
  return c < 0x80 ? static_cast<char32_t>(std::toupper(static_cast<int>(c)))
                  : static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return c < 0x80 ? static_cast<char32_t>(std::tolower(static_cast<int>(c)))
                  : static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  return c < 0x80 ? static_cast<char32_t>(std::toupper(static_cast<int>(c)))
                  : static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

std::string map_chars(const std::string& s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out += static_cast<char>(f(static_cast<unsigned char>(c)));
    return out;
  }
  for (char32_t c : utf8_decode(s)) {
    if (c == 0xDF && f == to_upper) {  // ß -> SS (Python's full case mapping)
      out += "SS";
      continue;
    }
    utf8_append(out, f(c));
  }
  return out;
}

// Code-point index of a byte offset.
int64_t cp_index(const std::string& s, size_t byte_off) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_off)));
}

// Python's optional [start:end] arguments of find/count/startswith, as byte offsets.
std::pair<size_t, size_t> byte_range(const std::string& s, const CallArgs& a, size_t first) {
  int64_t n = static_cast<int64_t>(utf8_length(s));
  auto norm = [&](const Value& v, int64_t dflt) -> int64_t {
    if (v.is_none() || v.is_undefined()) return dflt;
    int64_t i = v.int_value();
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  int64_t lo = a.args.size() > first ? norm(a.args[first], 0) : 0;
  int64_t hi = a.args.size() > first + 1 ? norm(a.args[first + 1], n) : n;
  auto to_byte = [&](int64_t cp) {
    if (is_ascii(s)) return static_cast<size_t>(cp);
    size_t b = 0;
    int64_t k = 0;
    while (b < s.size() && k < cp) {
      ++b;
      while (b < s.size() && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) ++b;
      ++k;
    }
    return b;
  };
  return {to_byte(lo), to_byte(std::max(lo, hi))};
}

Value bound(const std::string& name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  return Value::function(name, std::move(fn));
}

const std::string& str_arg(const CallArgs& a, size_t i, const char* fn) {
  if (a.args.size() <= i) fail(std::string(fn) + "() missing a required argument");
  if (!a.args[i].is_string())
    fail(std::string(fn) + "() argument must be str, not " + a.args[i].type_name());
  return a.args[i].str();
}

bool match_affix(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  std::vector<Value> options;
  if (affix.is_list() && affix.list_obj().is_tuple) {
    options = affix.items();
  } else {
    options.push_back(affix);
  }
  for (const Value& o : options) {
    if (!o.is_string())
      fail(std::string(fn) + " first arg must be str or a tuple of str, not " + o.type_name());
    const std::string& t = o.str();
    if (t.size() > s.size()) continue;
    if (prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0)
      return true;
  }
  return false;
}

// str.format with positional/keyword fields, !r/!s conversions and no format specs.
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      char conv = 0;
      if (field.size() >= 2 && field[field.size() - 2] == '!') {
        conv = field.back();
        field.resize(field.size() - 2);
      }
      if (field.find(':') != std::string::npos) fail("format specs are not supported");
      const Value* v = nullptr;
      if (field.empty()) {
        if (auto_idx >= a.args.size()) fail("Replacement index out of range");
        v = &a.args[auto_idx++];
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        size_t k = std::stoul(field);
        if (k >= a.args.size()) fail("Replacement index out of range");
        v = &a.args[k];
      } else {
        for (const auto& [k, val] : a.kwargs)
          if (k == field) v = &val;
        if (!v) fail("KeyError: '" + field + "'");
      }
      out += conv == 'r' ? repr(*v) : to_str(*v);
      check_size(out.size());
      i = close;
    } else if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else fail("Single '}' encountered in format string");
      out += '}';
    } else {
      out += c;
    }
  }
  return out;
}

Value str_method(const Value& self, const std::string& name) {
  const std::string& s = self.str();
  auto strip = [s](bool l, bool r) {
    return [s, l, r](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b = bind_args(a, "strip", {"chars"});
      return Value(py_strip(s, b.get(0, Value::none()), l, r));
    };
  };
  if (name == "strip") return bound(name, strip(true, true));
  if (name == "lstrip") return bound(name, strip(true, false));
  if (name == "rstrip") return bound(name, strip(false, true));
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return bound(name, [s, right](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b = bind_args(a, "split", {"sep", "maxsplit"});
      int64_t maxsplit = b.get(1, Value(static_cast<int64_t>(-1))).int_value();
      return Value::list(py_split(s, b.get(0, Value::none()), maxsplit, right));
    });
  }
  if (name == "splitlines") {
    return bound(name, [s](Interpreter&, CallArgs& a) -> Value {
      BoundArgs b = bind_args(a, "splitlines", {"keepends"});
      bool keep = b.get(0, Value(false)).truthy();
      std::vector<Value> out;
      std::u32string u = utf8_decode(s), cur;
      for (size_t i = 0; i < u.size(); ++i) {
        char32_t c = u[i];
        bool br = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                  c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!br) {
          cur.push_back(c);
          continue;
        }
        std::u32string end(1, c);
        if (c == '\r' && i + 1 < u.size() && u[i + 1] == '\n') {
          ++i;
          end.push_back('\n');
        }
        if (keep) cur += end;
        out.emplace_back(utf8_encode(cur));
        cur.clear();
      }
      if (!cur.empty()) out.emplace_back(utf8_encode(cur));
      return Value::list(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return bound(name, [s, prefix, name](Interpreter&, CallArgs& a) -> Value {
      if (a.args.empty()) fail(name + "() takes at least 1 argument (0 given)");
      auto [lo, hi] = byte_range(s, a, 1);
      return Value(match_affix(s.substr(lo, hi - lo), a.args[0], prefix, name.c_str()));
    });
  }
  if (name == "replace") {
    return bound(name, [s](Interpreter& in, CallArgs& a) -> Value {
      BoundArgs b = bind_args(a, "replace", {"old", "new", "count"});
      if (!b.has(0) || !b.has(1)) fail("replace() takes at least 2 arguments");
      if (!b[0].is_string() || !b[1].is_string())
        fail("replace() argument must be str");
      int64_t count = b.get(2, Value(static_cast<int64_t>(-1))).int_value();
      std::string r = py_replace(s, b[0].str(), b[1].str(), count);
      in.check_string_size(r.size());
      return Value(std::move(r));
    });
  }
  if (name == "upper") return bound(name, [s](Interpreter&, CallArgs&) { return Value(py_upper(s)); });
  if (name == "lower" || name == "casefold")
    return bound(name, [s](Interpreter&, CallArgs&) { return Value(py_lower(s)); });
  if (name == "title") return bound(name, [s](Interpreter&, CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize")
    return bound(name, [s](Interpreter&, CallArgs&) { return Value(py_capitalize(s)); });
  if (name == "swapcase") {
    return bound(name, [s](Interpreter&, CallArgs&) {
      std::string out;
      for (char32_t c : utf8_decode(s))
        utf8_append(out, is_cased_upper(c) ? to_lower(c) : is_cased_lower(c) ? to_upper(c) : c);
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    bool rev = name[0] == 'r';
    bool raise = name.find("index") != std::string::npos;
    return bound(name, [s, rev, raise, name](Interpreter&, CallArgs& a) -> Value {
      const std::string& sub = str_arg(a, 0, name.c_str());
      auto [lo, hi] = byte_range(s, a, 1);
      std::string_view hay = std::string_view(s).substr(lo, hi - lo);
      size_t p = rev ? hay.rfind(sub) : hay.find(sub);
      if (p == std::string_view::npos) {
        if (raise) fail("substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(cp_index(s, lo + p));
    });
  }
  if (name == "count") {
    return bound(name, [s](Interpreter&, CallArgs& a) -> Value {
      const std::string& sub = str_arg(a, 0, "count");
      auto [lo, hi] = byte_range(s, a, 1);
      std::string_view hay = std::string_view(s).substr(lo, hi - lo);
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(hay) + 1));
      int64_t n = 0;
      for (size_t p = hay.find(sub); p != std::string_view::npos; p = hay.find(sub, p + sub.size()))
        ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return bound(name, [s](Interpreter& in, CallArgs& a) -> Value {
      if (a.args.size() != 1) fail("join() takes exactly one argument");
      std::string out;
      size_t i = 0;
      for (const Value& v : in.iterate(a.args[0])) {
        if (!v.is_string())
          fail("sequence item " + std::to_string(i) + ": expected str instance, " + v.type_name() +
               " found");
        if (i++) out += s;
        out += v.str();
        in.check_string_size(out.size());
      }
      return Value(std::move(out));
    });
  }
  auto pred = [&](bool (*p)(char32_t)) {
    return bound(name, [s, p](Interpreter&, CallArgs&) -> Value {
      std::u32string u = utf8_decode(s);
      if (u.empty()) return Value(false);
      for (char32_t c : u)
        if (!p(c)) return Value(false);
      return Value(true);
    });
  };
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
    return pred([](char32_t c) {
      return (c >= '0' && c <= '9') ||
             utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
    });
  if (name == "isalpha")
    return pred([](char32_t c) {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    });
  if (name == "isalnum")
    return pred([](char32_t c) {
      auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
             (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    });
  if (name == "isspace") return pred(py_isspace);
  if (name == "isupper" || name == "islower") {
    bool up = name == "isupper";
    return bound(name, [s, up](Interpreter&, CallArgs&) -> Value {
      bool any = false;
      for (char32_t c : utf8_decode(s)) {
        if (up ? is_cased_lower(c) : is_cased_upper(c)) return Value(false);
        if (up ? is_cased_upper(c) : is_cased_lower(c)) any = true;
      }
      return Value(any);
    });
  }
  if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
    return bound(name, [s, name](Interpreter& in, CallArgs& a) -> Value {
      if (a.args.empty() || !(a.args[0].is_int() || a.args[0].is_bool()))
        fail(name + "() requires an integer width");
      int64_t width = a.args[0].int_value();
      std::string fill = a.args.size() > 1 && a.args[1].is_string() ? a.args[1].str() : " ";
      int64_t len = static_cast<int64_t>(utf8_length(s));
      if (width <= len) return Value(s);
      in.check_string_size(static_cast<size_t>(width) * fill.size());
      int64_t pad = width - len;
      auto rep = [&](int64_t n) {
        std::string r;
        for (int64_t i = 0; i < n; ++i) r += fill;
        return r;
      };
      if (name == "zfill") {
        size_t sign = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
        return Value(s.substr(0, sign) + std::string(static_cast<size_t>(pad), '0') + s.substr(sign));
      }
      if (name == "ljust") return Value(s + rep(pad));
      if (name == "rjust") return Value(rep(pad) + s);
      int64_t left = pad / 2 + (pad & width & 1);
      return Value(rep(left) + s + rep(pad - left));
    });
  }
  if (name == "partition" || name == "rpartition") {
    bool rev = name[0] == 'r';
    return bound(name, [s, rev, name](Interpreter&, CallArgs& a) -> Value {
      const std::string& sep = str_arg(a, 0, name.c_str());
      if (sep.empty()) fail("empty separator");
      size_t p = rev ? s.rfind(sep) : s.find(sep);
      if (p == std::string::npos)
        return rev ? Value::list({Value(""), Value(""), Value(s)}, true)
                   : Value::list({Value(s), Value(""), Value("")}, true);
      return Value::list({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))}, true);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    return bound(name, [s, pre, name](Interpreter&, CallArgs& a) -> Value {
      const std::string& x = str_arg(a, 0, name.c_str());
      if (x.size() <= s.size()) {
        if (pre && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
        if (!pre && s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value(s.substr(0, s.size() - x.size()));
      }
      return Value(s);
    });
  }
  if (name == "format") {
    return bound(name, [s](Interpreter& in, CallArgs& a) -> Value {
      std::string r = py_format(s, a);
      in.check_string_size(r.size());
      return Value(std::move(r));
    });
  }
  return Value::undefined();
}

Value unsafe(const std::string& name, const std::string& type) {
  return Value::undefined("access to attribute '" + name + "' of '" + type +
                          "' object is unsafe.");
}

Value dict_method(const Value& self, const std::string& name) {
  static const std::unordered_set<std::string> mutating = {"pop", "popitem", "update",
                                                           "setdefault", "clear"};
  if (mutating.count(name)) return unsafe(name, "dict");
  if (name == "items") {
    return bound(name, [self](Interpreter&, CallArgs& a) -> Value {
      bind_args(a, "items", {});
      std::vector<Value> out;
      for (const auto& [k, v] : self.dict().entries) out.push_back(Value::list({k, v}, true));
      return Value::list(std::move(out));
    });
  }
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return bound(name, [self, keys](Interpreter&, CallArgs& a) -> Value {
      bind_args(a, keys ? "keys" : "values", {});
      std::vector<Value> out;
      for (const auto& [k, v] : self.dict().entries) out.push_back(keys ? k : v);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return bound(name, [self](Interpreter&, CallArgs& a) -> Value {
      if (!a.kwargs.empty()) fail("get() takes no keyword arguments");
      if (a.args.empty() || a.args.size() > 2)
        fail("get expected 1 or 2 arguments, got " + std::to_string(a.args.size()));
      if (const Value* v = self.dict().find(a.args[0])) return *v;
      return a.args.size() > 1 ? a.args[1] : Value::none();
    });
  }
  if (name == "copy") return bound(name, [self](Interpreter&, CallArgs&) { return self; });
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  if (self.list_obj().is_generator) return Value::undefined();
  static const std::unordered_set<std::string> mutating = {
      "append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  bool tuple = self.list_obj().is_tuple;
  if (mutating.count(name)) return tuple ? Value::undefined() : unsafe(name, "list");
  if (name == "index") {
    return bound(name, [self](Interpreter&, CallArgs& a) -> Value {
      if (a.args.empty()) fail("index() takes at least 1 argument");
      const auto& items = self.items();
      for (size_t i = 0; i < items.size(); ++i)
        if (equals(items[i], a.args[0])) return Value(static_cast<int64_t>(i));
      fail(repr(a.args[0]) + " is not in list");
    });
  }
  if (name == "count") {
    return bound(name, [self](Interpreter&, CallArgs& a) -> Value {
      if (a.args.size() != 1) fail("count() takes exactly one argument");
      int64_t n = 0;
      for (const Value& v : self.items()) n += equals(v, a.args[0]);
      return Value(n);
    });
  }
  if (name == "copy" && !tuple) return bound(name, [self](Interpreter&, CallArgs&) { return self; });
  return Value::undefined();
}

}  // namespace

Value get_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kString: return str_method(obj, name);
    case Value::Kind::kDict: return dict_method(obj, name);
    case Value::Kind::kList: return list_method(obj, name);
    default: return Value::undefined();
  }
}

// ---- shared Python string helpers ----

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string set;
  bool ws = chars.is_none() || chars.is_undefined();
  if (!ws) {
    if (!chars.is_string()) fail("strip arg must be None or str");
    set = utf8_decode(chars.str());
  }
  auto strip_it = [&](char32_t c) {
    return ws ? py_isspace(c) : set.find(c) != std::u32string::npos;
  };
  if (is_ascii(s) && (ws || is_ascii(chars.str()))) {
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && strip_it(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && strip_it(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(b, e - b);
  }
  std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::string py_upper(const std::string& s) { return map_chars(s, to_upper); }
std::string py_lower(const std::string& s) { return map_chars(s, to_lower); }

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) utf8_append(out, i == 0 ? to_title(u[i]) : to_lower(u[i]));
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (is_cased(c)) {
      utf8_append(out, prev_cased ? to_lower(c) : to_title(c));
      prev_cased = true;
    } else {
      utf8_append(out, c);
      prev_cased = false;
    }
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  if (count == 0) return s;
  std::string out;
  if (old.empty()) {
    std::u32string u = utf8_decode(s);
    int64_t n = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || n < count) {
        out += repl;
        ++n;
        check_size(out.size());
      }
      if (i < u.size()) utf8_append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (true) {
    size_t p = s.find(old, pos);
    if (p == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, pos, p - pos);
    out += repl;
    check_size(out.size());
    pos = p + old.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::vector<Value> py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool right) {
  std::vector<Value> out;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string u = utf8_decode(s);
    std::vector<std::u32string> parts;
    if (!right) {
      size_t i = 0;
      int64_t n = 0;
      while (i < u.size()) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && n >= maxsplit) {  // the rest, trailing whitespace kept
          parts.push_back(u.substr(i));
          break;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        parts.push_back(u.substr(i, j - i));
        ++n;
        i = j;
      }
    } else {
      int64_t i = static_cast<int64_t>(u.size());
      int64_t n = 0;
      while (i > 0) {
        while (i > 0 && py_isspace(u[static_cast<size_t>(i - 1)])) --i;
        if (i <= 0) break;
        if (maxsplit >= 0 && n >= maxsplit) {  // the rest, leading whitespace kept
          parts.push_back(u.substr(0, static_cast<size_t>(i)));
          break;
        }
        int64_t j = i;
        while (j > 0 && !py_isspace(u[static_cast<size_t>(j - 1)])) --j;
        parts.push_back(u.substr(static_cast<size_t>(j), static_cast<size_t>(i - j)));
        ++n;
        i = j;
      }
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.emplace_back(utf8_encode(p));
    return out;
  }
  if (!sep.is_string()) fail("must be str or None, not " + sep.type_name());
  const std::string& d = sep.str();
  if (d.empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!right) {
    size_t pos = 0;
    int64_t n = 0;
    while (true) {
      size_t p = s.find(d, pos);
      if (p == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
      parts.push_back(s.substr(pos, p - pos));
      pos = p + d.size();
      ++n;
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    int64_t n = 0;
    while (true) {
      if (end < d.size()) break;
      size_t p = s.rfind(d, end - d.size());
      if (p == std::string::npos || (maxsplit >= 0 && n >= maxsplit)) break;
      parts.push_back(s.substr(p + d.size(), end - p - d.size()));
      end = p;
      ++n;
      if (p == 0 && end == 0) break;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.emplace_back(std::move(p));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

bool parse_py_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = py_strip(text, Value::none(), true, true);
  if (s.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    i = 1;
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36) return false;
  if (base == 16 && s.compare(i, 2, "0x") == 0) i += 2;
  if (i >= s.size()) return false;
  __int128 v = 0;
  bool prev_us = true;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                          : 99;
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return false;
    prev_us = false;
  }
  if (prev_us) return false;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return false;
  out = static_cast<int64_t>(v);
  return true;
}

bool parse_py_float(const std::string& text, double& out) {
  std::string s = py_strip(text, Value::none(), true, true);
  if (s.empty()) return false;
  std::string low = py_lower(s);
  std::string body = (low[0] == '+' || low[0] == '-') ? low.substr(1) : low;
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : (low[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (i == 0 || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1])))
        return false;
      continue;
    }
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
          c == '+' || c == '-'))
      return false;
    clean += c;
  }
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end && *end == 0 && end != clean.c_str();
}

}  // namespace m3::jinja

#include "chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <utf8proc.h>

namespace m3::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.v_ = UndefinedInfo{std::move(hint)};
  return v;
}

Value Value::none() {
  Value v;
  v.v_ = NoneT{};
  return v;
}

namespace {

// Recursion guard for printing/comparing values that reach through namespace objects (which may
// even form cycles).
thread_local int g_value_recursion = 0;
struct RecursionGuard {
  RecursionGuard() {
    if (++g_value_recursion > static_cast<int>(kMaxValueDepth) + 64) {
      --g_value_recursion;
      throw TemplateError("value nested too deeply");
    }
  }
  ~RecursionGuard() { --g_value_recursion; }
};

uint32_t items_depth(const std::vector<Value>& items) {
  uint32_t d = 0;
  for (const Value& v : items) d = std::max(d, value_depth(v));
  if (d + 1 > kMaxValueDepth) throw TemplateError("value nested too deeply");
  return d + 1;
}

}  // namespace

namespace {
thread_local size_t g_size_limit = static_cast<size_t>(-1);
}  // namespace

ScopedSizeLimit::ScopedSizeLimit(size_t max_bytes) : prev_(g_size_limit) {
  g_size_limit = max_bytes;
}
ScopedSizeLimit::~ScopedSizeLimit() { g_size_limit = prev_; }

void check_size(size_t bytes) {
  if (bytes > g_size_limit) {
    TemplateError e("template produced a string over the size limit (" +
                    std::to_string(g_size_limit) + " bytes)");
    e.limit_exceeded = true;
    throw e;
  }
}

uint32_t value_depth(const Value& v) {
  if (v.is_list()) return v.list_obj().depth;
  if (v.is_dict()) return v.dict().depth;
  return 0;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto l = std::make_shared<ListObj>();
  l->depth = items_depth(items);
  l->items = std::move(items);
  l->is_tuple = is_tuple;
  return Value(std::shared_ptr<const ListObj>(std::move(l)));
}

Value Value::generator(std::vector<Value> items) {
  auto l = std::make_shared<ListObj>();
  l->depth = items_depth(items);
  l->items = std::move(items);
  l->is_generator = true;
  return Value(std::shared_ptr<const ListObj>(std::move(l)));
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value(std::shared_ptr<const Callable>(std::move(c)));
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return list_obj().is_generator || !items().empty();
    case Kind::kDict:
      return dict().size() != 0;
    case Kind::kCallable:
    case Kind::kObject:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return list_obj().is_generator ? "generator" : list_obj().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kCallable:
      return "function";
    case Kind::kObject:
      return object().type_name();
  }
  return "?";
}

// ---- dict ----

namespace {

// Canonical hash key: Python treats 1, 1.0 and True as the same dict key.
bool key_id(const Value& k, std::string& out) {
  switch (k.kind()) {
    case Value::Kind::kString:
      out = "s";
      out += k.str();
      return true;
    case Value::Kind::kInt:
    case Value::Kind::kBool:
      out = "i" + std::to_string(k.int_value());
      return true;
    case Value::Kind::kFloat: {
      double d = k.as_float();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
        out = "i" + std::to_string(static_cast<int64_t>(d));
      } else {
        out = "f" + float_repr(d);
      }
      return true;
    }
    case Value::Kind::kNone:
      out = "n";
      return true;
    case Value::Kind::kList:
      if (k.list_obj().is_tuple) {
        out = "t";
        for (const Value& e : k.items()) {
          std::string sub;
          if (!key_id(e, sub)) return false;
          out += std::to_string(sub.size()) + ":" + sub;
        }
        return true;
      }
      return false;
    default:
      return false;
  }
}

}  // namespace

const Value* DictObj::find(const Value& key) const {
  std::string id;
  if (!key_id(key, id)) return nullptr;
  auto it = index.find(id);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

const Value* DictObj::find(std::string_view key) const {
  std::string id = "s";
  id += key;
  auto it = index.find(id);
  return it == index.end() ? nullptr : &entries[it->second].second;
}

void DictObj::set(Value key, Value value) {
  std::string id;
  if (!key_id(key, id)) throw TemplateError("unhashable type: '" + key.type_name() + "'");
  auto it = index.find(id);
  if (it != index.end()) {
    uint32_t dv = value_depth(value) + 1;
    if (dv > kMaxValueDepth) throw TemplateError("value nested too deeply");
    depth = std::max(depth, dv);
    entries[it->second].second = std::move(value);
    return;
  }
  uint32_t d = std::max(value_depth(key), value_depth(value)) + 1;
  if (d > kMaxValueDepth) throw TemplateError("value nested too deeply");
  depth = std::max(depth, d);
  index.emplace(std::move(id), entries.size());
  entries.emplace_back(std::move(key), std::move(value));
}

Value make_dict(std::vector<std::pair<Value, Value>> entries) {
  auto d = std::make_shared<DictObj>();
  for (auto& [k, v] : entries) d->set(std::move(k), std::move(v));
  return Value(std::shared_ptr<const DictObj>(std::move(d)));
}

Value Namespace::getattr(const std::string& name) const {
  const Value* v = attrs_.find(std::string_view(name));
  return v ? *v : Value::undefined("'Namespace' object has no attribute '" + name + "'");
}

bool Namespace::setattr(const std::string& name, Value value) {
  attrs_.set(Value(name), std::move(value));
  return true;
}

std::string Namespace::repr() const {
  RecursionGuard g;
  std::string s = "<Namespace {";
  bool first = true;
  for (const auto& [k, v] : attrs_.entries) {
    if (!first) s += ", ";
    first = false;
    s += jinja::repr(k) + ": " + jinja::repr(v);
  }
  return s + "}>";
}

// ---- UTF-8 ----

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    char32_t cp;
    int n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c >> 5) == 6) {
      cp = c & 0x1f;
      n = 2;
    } else if ((c >> 4) == 14) {
      cp = c & 0x0f;
      n = 3;
    } else if ((c >> 3) == 30) {
      cp = c & 0x07;
      n = 4;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    if (i + n > s.size()) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    bool ok = true;
    for (int k = 1; k < n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 2) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Python str.isspace() / str.split() whitespace.
bool py_isspace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0a: case 0x0b: case 0x0c: case 0x0d: case 0x1c: case 0x1d: case 0x1e:
    case 0x1f: case 0x20: case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

// ---- formatting ----

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]d[.ddd]e[+-]XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python repr: fixed notation when -4 <= exp < 16
    int point = exp + 1;           // digits before the decimal point
    if (point <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-point), '0');
      out += digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(point) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point));
      out += ".";
      out += digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + eb;
}

namespace {

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  if (c > 0x10FFFF) return false;
  utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  switch (cat) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

}  // namespace

std::string py_str_repr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (py_isprintable(c)) {
      utf8_append(out, c);
    } else {
      char b[16];
      if (c < 0x100) {
        std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      }
      out += b;
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v) {
  RecursionGuard g;
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kString:
      return py_str_repr(v.str());
    case Value::Kind::kList: {
      const ListObj& l = v.list_obj();
      if (l.is_generator) return "<generator object>";
      std::string s = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) s += ", ";
        s += repr(l.items[i]);
        check_size(s.size());
      }
      if (l.is_tuple && l.items.size() == 1) s += ",";
      return s + (l.is_tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().entries) {
        if (!first) s += ", ";
        first = false;
        s += repr(k) + ": " + repr(val);
        check_size(s.size());
      }
      return s + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return float_repr(v.as_float());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return repr(v);
    case Value::Kind::kCallable:
      return "<function " + v.callable().name + ">";
    case Value::Kind::kObject:
      return v.object().repr();
  }
  return "";
}

// ---- comparison ----

bool equals(const Value& a, const Value& b) {
  RecursionGuard g;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number_value() == b.number_value();
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      const ListObj& la = a.list_obj();
      const ListObj& lb = b.list_obj();
      if (la.is_generator || lb.is_generator) return &la == &lb;
      if (la.is_tuple != lb.is_tuple || la.items.size() != lb.items.size()) return false;
      for (size_t i = 0; i < la.items.size(); ++i)
        if (!equals(la.items[i], lb.items[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const DictObj& da = a.dict();
      const DictObj& db = b.dict();
      if (da.size() != db.size()) return false;
      for (const auto& [k, v] : da.entries) {
        const Value* o = db.find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return &a.callable() == &b.callable();
    case Value::Kind::kObject:
      return &a.object() == &b.object();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b) {
  RecursionGuard g;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.number_value(), y = b.number_value();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.int_value(), y = b.int_value();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.list_obj().is_tuple == b.list_obj().is_tuple &&
      !a.list_obj().is_generator && !b.list_obj().is_generator) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

// ---- JSON ----

Value from_json(const nlohmann::ordered_json& j) {
  RecursionGuard g;
  using J = nlohmann::ordered_json;
  switch (j.type()) {
    case J::value_t::null:
      return Value::none();
    case J::value_t::boolean:
      return Value(j.get<bool>());
    case J::value_t::number_integer:
      return Value(j.get<int64_t>());
    case J::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case J::value_t::number_float:
      return Value(j.get<double>());
    case J::value_t::string:
      return Value(j.get<std::string>());
    case J::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case J::value_t::object: {
      auto d = std::make_shared<DictObj>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(Value(it.key()), from_json(it.value()));
      return Value(std::shared_ptr<const DictObj>(std::move(d)));
    }
    default:
      return Value::none();
  }
}

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char b[16];
    if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                      static_cast<unsigned>(0xDC00 | (v & 0x3ff)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      }
      out += b;
    } else {
      utf8_append(out, c);
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return float_repr(d);
}

void json_dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  bool indented = o.indent >= 0 || o.has_indent_str;
  std::string item_sep = o.has_separators ? o.item_sep : (indented ? "," : ", ");
  std::string key_sep = o.has_separators ? o.key_sep : ": ";
  auto newline = [&](int lvl) {
    check_size(out.size());
    out += '\n';
    for (int i = 0; i < lvl; ++i) {
      if (o.has_indent_str)
        out += o.indent_str;
      else
        out.append(static_cast<size_t>(o.indent), ' ');
    }
  };
  if (level > 512) throw TemplateError("tojson: nesting too deep");
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat:
      out += json_float(v.as_float());
      return;
    case Value::Kind::kString:
      json_string(out, v.str(), o.ensure_ascii);
      check_size(out.size());
      return;
    case Value::Kind::kList: {
      if (v.list_obj().is_generator)
        throw TemplateError("Object of type generator is not JSON serializable");
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indented) newline(level + 1);
        json_dump(out, items[i], o, level + 1);
      }
      if (indented) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      const DictObj& d = v.dict();
      if (d.size() == 0) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : d.entries) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return compare(a->first, b->first) < 0; });
      }
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += item_sep;
        first = false;
        if (indented) newline(level + 1);
        const Value& k = e->first;
        std::string ks;
        switch (k.kind()) {
          case Value::Kind::kString:
            ks = k.str();
            break;
          case Value::Kind::kBool:
            ks = k.as_bool() ? "true" : "false";
            break;
          case Value::Kind::kInt:
            ks = std::to_string(k.as_int());
            break;
          case Value::Kind::kFloat:
            ks = json_float(k.as_float());
            break;
          case Value::Kind::kNone:
            ks = "null";
            break;
          default:
            throw TemplateError("keys must be str, int, float, bool or None, not " +
                                k.type_name());
        }
        json_string(out, ks, o.ensure_ascii);
        out += key_sep;
        json_dump(out, e->second, o, level + 1);
      }
      if (indented) newline(level);
      out += '}';
      return;
    }
    default:
      throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  json_dump(out, v, opt, 0);
  return out;
}

}  // namespace m3::jinja

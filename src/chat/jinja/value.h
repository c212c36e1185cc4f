// Jinja values with Python semantics: what chat templates see (None, bool, int, float, str, list,
// tuple, dict with insertion order, callables, objects such as namespace() and loop) plus
// jinja2's default Undefined. Values are cheap to copy: containers and strings are shared and
// never mutated after construction (the ImmutableSandboxedEnvironment forbids in-place changes),
// except namespace objects, which are mutable by design.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace m3::jinja {

// Position in the template source (1-based); line 0 means "unknown".
struct SourcePos {
  int line = 0;
  int col = 0;
};

// Every failure while lexing, parsing or rendering. Caught at the Template API boundary and turned
// into a Status; never escapes the engine.
class TemplateError : public std::runtime_error {
 public:
  TemplateError(std::string msg, SourcePos pos = {})
      : std::runtime_error(std::move(msg)), pos_(pos) {}
  SourcePos pos() const { return pos_; }
  void set_pos_if_unknown(SourcePos p) {
    if (pos_.line == 0) pos_ = p;
  }
  // raise_exception() from the template (a deliberate error, reported as such).
  bool raised_by_template = false;
  // A resource limit (output size, operation budget, recursion) was hit.
  bool limit_exceeded = false;

 private:
  SourcePos pos_;
};

class Value;
class Interpreter;

struct ListObj {
  std::vector<Value> items;
  bool is_tuple = false;
  // A Python generator/iterator (what select/map/reverse return): always truthy, no len(), no
  // indexing. Kept so templates that test `if x | selectattr(...)` behave like jinja2.
  bool is_generator = false;
  uint32_t depth = 1;  // container nesting (bounded so printing/destroying cannot blow the stack)
};

struct DictObj;
struct Object;

// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  SourcePos pos;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

struct UndefinedInfo {
  std::string hint;  // the error raised when the undefined value is used
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable,
    kObject
  };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  Value(bool b) : v_(b) {}  // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}  // NOLINT
  Value(int64_t i) : v_(i) {}  // NOLINT
  Value(double d) : v_(d) {}  // NOLINT
  Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}  // NOLINT
  Value(std::shared_ptr<const ListObj> l) : v_(std::move(l)) {}  // NOLINT
  Value(std::shared_ptr<const DictObj> d) : v_(std::move(d)) {}  // NOLINT
  Value(std::shared_ptr<const Callable> c) : v_(std::move(c)) {}  // NOLINT
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}  // NOLINT

  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value generator(std::vector<Value> items);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  bool is_object() const { return kind() == Kind::kObject; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  // Int-like (int or bool) as int64.
  int64_t int_value() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  double number_value() const { return is_float() ? as_float() : static_cast<double>(int_value()); }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const ListObj& list_obj() const { return *std::get<std::shared_ptr<const ListObj>>(v_); }
  const std::vector<Value>& items() const { return list_obj().items; }
  const DictObj& dict() const { return *std::get<std::shared_ptr<const DictObj>>(v_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  Object& object() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const std::string& undefined_hint() const { return std::get<UndefinedInfo>(v_).hint; }

  // Python truthiness.
  bool truthy() const;
  // Python type name for error messages ('str', 'int', 'dict', ...).
  std::string type_name() const;

 private:
  struct NoneT {};
  std::variant<UndefinedInfo, NoneT, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const ListObj>, std::shared_ptr<const DictObj>,
               std::shared_ptr<const Callable>, std::shared_ptr<Object>>
      v_;
};

// Insertion-ordered dict with Python key equality for hashable scalars (str, int, bool, float,
// None; 1 == 1.0 == True as keys).
struct DictObj {
  std::vector<std::pair<Value, Value>> entries;
  std::unordered_map<std::string, size_t> index;
  uint32_t depth = 1;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // throws TemplateError for unhashable keys
  size_t size() const { return entries.size(); }
};

// Objects with attributes: namespace() (mutable) and the loop variable.
struct Object {
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;
  // Undefined when missing.
  virtual Value getattr(const std::string& name) const = 0;
  // Only namespace() supports assignment.
  virtual bool setattr(const std::string& name, Value value) {
    (void)name;
    (void)value;
    return false;
  }
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
};

class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  Value getattr(const std::string& name) const override;
  bool setattr(const std::string& name, Value value) override;
  std::string repr() const override;
  // Drops the attributes (the interpreter does this after a render to break reference cycles
  // such as `set ns.self = ns`).
  void clear() { attrs_ = DictObj(); }

 private:
  DictObj attrs_;
};

// Containers may nest at most this deep (templates and requests alike).
constexpr uint32_t kMaxValueDepth = 512;
// Nesting depth a value adds to a container holding it.
uint32_t value_depth(const Value& v);

// Size limit for strings built while rendering, per thread (the interpreter sets it for the
// duration of a render): check_size throws a limit TemplateError beyond it.
class ScopedSizeLimit {
 public:
  explicit ScopedSizeLimit(size_t max_bytes);
  ~ScopedSizeLimit();
  ScopedSizeLimit(const ScopedSizeLimit&) = delete;
  ScopedSizeLimit& operator=(const ScopedSizeLimit&) = delete;

 private:
  size_t prev_;
};
void check_size(size_t bytes);

// Builders.
Value make_dict(std::vector<std::pair<Value, Value>> entries);  // throws on unhashable keys

// Python str() and repr().
std::string to_str(const Value& v);
std::string repr(const Value& v);
// Python float repr: 1.0, 0.1, 1e-05, 1e+16, inf, nan.
std::string float_repr(double d);
std::string py_str_repr(std::string_view s);

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <, for sorting and comparisons: -1, 0, 1; throws TemplateError for unorderable types.
int compare(const Value& a, const Value& b);

// JSON boundary (ordered_json keeps dict key order).
Value from_json(const nlohmann::ordered_json& j);
// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent < 0 means None;
// indent_str overrides indent when non-empty (a string indent). Throws TemplateError for values
// JSON cannot represent (Undefined, callables).
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_str;
  bool has_indent_str = false;
  bool has_separators = false;
  std::string item_sep;
  std::string key_sep;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonDumpOptions& opt);

// UTF-8 helpers (strings are UTF-8; Python indexes by code point).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
bool is_ascii(std::string_view s);
bool py_isspace(char32_t c);

}  // namespace m3::jinja

// Globals every chat template sees: jinja2's range/namespace/dict/joiner and transformers'
// raise_exception and strftime_now.
#include <ctime>

#include "chat/jinja/builtins.h"

namespace m3::jinja {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

// jinja2's sandbox refuses ranges longer than MAX_RANGE.
constexpr int64_t kMaxRange = 100000;

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.kwargs.empty()) fail("range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3)
    fail("range expected at most 3 arguments, got " + std::to_string(a.args.size()));
  for (const Value& v : a.args)
    if (!v.is_int() && !v.is_bool())
      fail("'" + v.type_name() + "' object cannot be interpreted as an integer");
  int64_t start = 0, stop, step = 1;
  if (a.args.size() == 1) {
    stop = a.args[0].int_value();
  } else {
    start = a.args[0].int_value();
    stop = a.args[1].int_value();
    if (a.args.size() == 3) step = a.args[2].int_value();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  __int128 n = 0;
  if (step > 0 && stop > start) n = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) n = (static_cast<__int128>(start) - stop - step - 1) / (-step);
  if (n > kMaxRange)
    fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  in.check_list_size(static_cast<size_t>(n));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) items.emplace_back(start + i * step);
  return Value::list(std::move(items));
}

Value g_namespace(Interpreter& in, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  in.own(ns);
  if (a.args.size() > 1) fail("namespace() takes at most one positional argument");
  if (a.args.size() == 1) {
    if (!a.args[0].is_dict()) fail("namespace() positional argument must be a mapping");
    for (const auto& [k, v] : a.args[0].dict().entries) {
      if (!k.is_string()) fail("namespace keys must be strings");
      ns->setattr(k.str(), v);
    }
  }
  for (const auto& [k, v] : a.kwargs) ns->setattr(k, v);
  return Value(std::shared_ptr<Object>(std::move(ns)));
}

Value g_dict(Interpreter& in, CallArgs& a) {
  std::vector<std::pair<Value, Value>> entries;
  if (a.args.size() > 1) fail("dict expected at most 1 argument");
  if (a.args.size() == 1) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      entries = src.dict().entries;
    } else {
      for (const Value& item : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(item);
        if (kv.size() != 2) fail("dictionary update sequence element has wrong length");
        entries.emplace_back(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) entries.emplace_back(Value(k), v);
  return make_dict(std::move(entries));
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  std::string msg = a.args.empty() ? std::string() : to_str(a.args[0]);
  TemplateError e(msg);
  e.raised_by_template = true;
  throw e;
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  if (a.args.size() != 1 || !a.args[0].is_string())
    fail("strftime_now() takes one format string");
  std::string fmt = a.args[0].str();
  int64_t micros = 0;
  std::time_t t;
  if (in.options().now_unix) {
    t = static_cast<std::time_t>(*in.options().now_unix);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    t = ts.tv_sec;
    micros = ts.tv_nsec / 1000;
  }
  std::tm tm{};
  localtime_r(&t, &tm);
  // Python's strftime adds %f (microseconds); the rest goes to the C library as Python does.
  std::string expanded;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      if (fmt[i + 1] == 'f') {
        char b[32];
        std::snprintf(b, sizeof b, "%06lld", static_cast<long long>(micros));
        expanded += b;
        ++i;
        continue;
      }
      expanded += fmt[i];
      expanded += fmt[++i];
      continue;
    }
    expanded += fmt[i];
  }
  if (expanded.size() > 4096) fail("strftime_now: format too long");
  std::string out(expanded.size() * 16 + 64, '\0');
  size_t n = expanded.empty() ? 0 : std::strftime(out.data(), out.size(), expanded.c_str(), &tm);
  out.resize(n);
  return Value(std::move(out));
}

Value g_joiner(Interpreter&, CallArgs& a) {
  BoundArgs b = bind_args(a, "joiner", {"sep"});
  std::string sep = b.has(0) ? to_str(b[0]) : ", ";
  auto used = std::make_shared<bool>(false);
  return Value::function("joiner", [sep, used](Interpreter&, CallArgs&) -> Value {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

}  // namespace

void install_globals(Frame& g) {
  g.vars["range"] = Value::function("range", g_range);
  g.vars["namespace"] = Value::function("namespace", g_namespace);
  g.vars["dict"] = Value::function("dict", g_dict);
  g.vars["joiner"] = Value::function("joiner", g_joiner);
  g.vars["raise_exception"] = Value::function("raise_exception", g_raise_exception);
  g.vars["strftime_now"] = Value::function("strftime_now", g_strftime_now);
}

}  // namespace m3::jinja

#include "app/serve_flags.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string_view>

#include "chat/parsers/output_parser.h"
#include "server/fake/fake_flags.h"

namespace m3::app {

namespace {

struct Flag {
  const char* name;
  bool takes_value;
  const char* help;  // nullptr: hidden
  std::function<Status(ServeConfig&, const std::string&)> set;
};

Result<int64_t> to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used != v.size() || x < lo || x > hi) throw std::out_of_range("");
    return static_cast<int64_t>(x);
  } catch (const std::exception&) {
    return invalid_argument(flag + " expects an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]; got '" + v + "'");
  }
}

Result<double> to_double(const std::string& flag, const std::string& v, double lo, double hi) {
  try {
    size_t used = 0;
    double x = std::stod(v, &used);
    if (used != v.size() || !(x >= lo && x <= hi)) throw std::out_of_range("");
    return x;
  } catch (const std::exception&) {
    return invalid_argument(flag + " expects a number in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]; got '" + v + "'");
  }
}

#define INT_FLAG(field, lo, hi)                       \
  [](ServeConfig& f, const std::string& v) -> Status { \
    auto r = to_int(current_flag(), v, lo, hi);       \
    if (!r.is_ok()) return r.status();                \
    f.field = static_cast<decltype(f.field)>(*r);     \
    return Status::ok();                              \
  }

thread_local std::string g_current_flag;
const std::string& current_flag() {
  return g_current_flag;
}

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(',', start);
    std::string item = v.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!item.empty()) out.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {"--model-path", true, "checkpoint directory (default: the bundled models/m3-tiny)",
       [](ServeConfig& f, const std::string& v) {
         f.model_path = v;
         return Status::ok();
       }},
      {"--host", true, "address to listen on (default 0.0.0.0)",
       [](ServeConfig& f, const std::string& v) {
         f.server.host = v;
         return Status::ok();
       }},
      {"--port", true, "port (default 30000; 0 picks a free one)", INT_FLAG(server.port, 0, 65535)},
      {"--api-key", true, "require 'Authorization: Bearer <key>' on every route but /health",
       [](ServeConfig& f, const std::string& v) {
         f.server.api_key = v;
         return Status::ok();
       }},
      {"--served-model-name", true, "model name(s) reported and accepted, comma-separated",
       [](ServeConfig& f, const std::string& v) {
         f.server.served_model_names = split_list(v);
         return Status::ok();
       }},
      {"--reasoning-parser", true, "minimax-m3 (default) or none",
       [](ServeConfig& f, const std::string& v) {
         if (!chat::is_known_reasoning_parser(v))
           return invalid_argument("--reasoning-parser: unknown parser '" + v +
                                   "'; available: minimax-m3, none");
         f.server.reasoning_parser = v;
         return Status::ok();
       }},
      {"--tool-call-parser", true, "minimax-m3 (default) or none",
       [](ServeConfig& f, const std::string& v) {
         if (!chat::is_known_tool_parser(v))
           return invalid_argument("--tool-call-parser: unknown parser '" + v +
                                   "'; available: minimax-m3, none");
         f.server.tool_call_parser = v;
         return Status::ok();
       }},
      {"--context-length", true, "maximum prompt + completion tokens per request",
       INT_FLAG(server.context_length, 1, INT32_MAX)},
      {"--chunked-prefill-size", true, "prefill tokens per step (default 8192)",
       INT_FLAG(chunked_prefill_size, -1, INT32_MAX)},
      {"--max-running-requests", true, "requests decoded together",
       INT_FLAG(max_running_requests, 1, INT32_MAX)},
      {"--max-queued-requests", true, "waiting requests before 429 (default 4096)",
       INT_FLAG(max_queued_requests, 1, INT32_MAX)},
      {"--kv-cache-bytes", true,
       "CPU KV cache pool in bytes (default 536870912); must hold one request of the context "
       "length",
       INT_FLAG(kv_cache_bytes, 1, INT64_MAX)},
      {"--mem-fraction-static", true, "GPU memory fraction for weights + KV cache",
       [](ServeConfig& f, const std::string& v) {
         auto r = to_double("--mem-fraction-static", v, 0.0, 1.0);
         if (!r.is_ok()) return r.status();
         f.mem_fraction_static = *r;
         return Status::ok();
       }},
      {"--load-format", true, "auto, safetensors or dummy",
       [](ServeConfig& f, const std::string& v) {
         if (v != "auto" && v != "safetensors" && v != "dummy")
           return invalid_argument("--load-format: '" + v + "'; allowed: auto, safetensors, dummy");
         f.load_format = v;
         return Status::ok();
       }},
      {"--tp", true, "tensor-parallel size (also --tp-size)", INT_FLAG(tp, 1, 64)},
      {"--tp-size", true, nullptr, INT_FLAG(tp, 1, 64)},
      {"--device", true, "auto, cuda or cpu",
       [](ServeConfig& f, const std::string& v) {
         if (v != "auto" && v != "cuda" && v != "cpu")
           return invalid_argument("--device: '" + v + "'; allowed: auto, cuda, cpu");
         f.device = v;
         return Status::ok();
       }},
      {"--speculative-algorithm", true, "DSPARK, MTP or NEXTN (when the engine supports it)",
       [](ServeConfig& f, const std::string& v) {
         f.speculative_algorithm = v;
         return Status::ok();
       }},
      {"--enable-hierarchical-cache", false, "host-memory KV tier",
       [](ServeConfig& f, const std::string&) {
         f.enable_hierarchical_cache = true;
         return Status::ok();
       }},
      {"--hicache-size", true, "host KV tier size in GB",
       [](ServeConfig& f, const std::string& v) {
         auto r = to_double("--hicache-size", v, 0.0, 1e6);
         if (!r.is_ok()) return r.status();
         f.hicache_size_gb = *r;
         return Status::ok();
       }},
      {"--revision", true, "ignored (offline: the checkpoint directory is used as is)",
       [](ServeConfig&, const std::string&) { return Status::ok(); }},
      {"--trust-remote-code", false, "ignored (accepted for SGLang compatibility)",
       [](ServeConfig&, const std::string&) { return Status::ok(); }},
      {"--enable-metrics", false, "accepted; /metrics is always on",
       [](ServeConfig&, const std::string&) { return Status::ok(); }},
      {"--allowed-media-domains", true, "hosts allowed in remote image URLs, comma-separated",
       [](ServeConfig& f, const std::string& v) {
         f.server.media.allowed_domains = split_list(v);
         return Status::ok();
       }},
      {"--max-image-bytes", true, "largest accepted image (default 20 MiB)",
       INT_FLAG(server.media.max_image_bytes, 1, INT64_MAX)},
      {"--max-request-body-bytes", true, "largest request body, else 413 (default 64 MiB)",
       INT_FLAG(server.max_body_bytes, 1024, INT64_MAX)},
      {"--max-connections", true,
       "open connections served at once; beyond it 503 and close (default: the open-file limit "
       "less 64)",
       INT_FLAG(server.max_connections, 1, 10000000)},
      {"--keep-alive-timeout", true,
       "seconds a connection may wait without a complete request header (default 5)",
       [](ServeConfig& f, const std::string& v) {
         auto r = to_double("--keep-alive-timeout", v, 0.1, 3600.0);
         if (!r.is_ok()) return r.status();
         f.server.keep_alive_timeout = std::chrono::milliseconds(static_cast<int64_t>(*r * 1000));
         return Status::ok();
       }},
      {"--http-threads", true, "HTTP I/O threads (default 4)", INT_FLAG(server.io_threads, 1, 256)},
      {"--tokenizer-worker-num", true, "request preprocessing threads (default 2)",
       INT_FLAG(server.worker_threads, 1, 256)},
      {"--drain-timeout", true, "seconds in-flight requests get on SIGTERM (default 30)",
       [](ServeConfig& f, const std::string& v) {
         auto r = to_double("--drain-timeout", v, 0.0, 86400.0);
         if (!r.is_ok()) return r.status();
         f.server.drain_timeout = std::chrono::milliseconds(static_cast<int64_t>(*r * 1000));
         return Status::ok();
       }},
  };
  return kFlags;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string serve_help() {
  std::string out =
      "usage: m3serve serve [--model-path DIR] [options]\n\n"
      "Serves an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models,\n"
      "/health, /health_generate, /tokenize, /detokenize, /metrics). Flags follow SGLang.\n\n"
      "options:\n";
  for (const auto& f : flags()) {
    if (!f.help) continue;
    char line[512];
    std::snprintf(line, sizeof line, "  %-28s %s\n",
                  (std::string(f.name) + (f.takes_value ? " V" : "")).c_str(), f.help);
    out += line;
  }
  out += "  --help                       show this help\n";
  return out;
}

Result<ParsedServeFlags> parse_serve_flags(const std::vector<std::string>& args) {
  ParsedServeFlags parsed;
  ServeConfig& out = parsed.config;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    std::string value;
    bool has_inline = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    std::string normalized = arg;
    std::replace(normalized.begin(), normalized.end(), '_', '-');
    if (normalized == "--help" || normalized == "-h") {
      if (has_inline) return invalid_argument("--help takes no value");
      parsed.help = true;
      continue;
    }
    const Flag* flag = nullptr;
    for (const auto& f : flags())
      if (normalized == f.name) flag = &f;
    const server::FakeFlag* fake = nullptr;
    for (const auto& f : server::fake_flags())
      if (normalized == f.name) fake = &f;
    if (!flag && !fake) {
      if (arg.rfind("--", 0) != 0) {
        return invalid_argument("unexpected argument '" + arg + "' (flags start with --)");
      }
      const Flag* best = nullptr;
      size_t best_d = SIZE_MAX;
      for (const auto& f : flags()) {
        if (!f.help) continue;
        size_t d = edit_distance(normalized, f.name);
        // A prefix of a longer flag ("--mem-fraction") is a strong hint too.
        if (std::string_view(f.name).rfind(normalized, 0) == 0) d = std::min<size_t>(d, 1);
        if (d < best_d) best_d = d, best = &f;
      }
      std::string msg = "unknown flag '" + arg + "'";
      if (best && best_d <= std::max<size_t>(3, normalized.size() / 3)) {
        msg += "; did you mean '" + std::string(best->name) + "'?";
      }
      return invalid_argument(msg + " (see 'm3serve serve --help')");
    }
    const char* name = flag ? flag->name : fake->name;
    const bool takes_value = flag ? flag->takes_value : fake->takes_value;
    if (takes_value && !has_inline) {
      if (i + 1 >= args.size()) return invalid_argument(std::string(name) + " needs a value");
      value = args[++i];
    } else if (!takes_value && has_inline) {
      return invalid_argument(std::string(name) + " takes no value");
    }
    g_current_flag = name;
    Status s = flag ? flag->set(out, value) : fake->set(out.fake, value);
    if (!s.is_ok()) return s;
  }
  out.server.model_path = out.model_path;
  if (out.server.served_model_names.empty()) {
    std::string name = out.model_path.empty() ? "m3-tiny" : out.model_path;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    out.server.served_model_names.push_back(name);
  }
  return parsed;
}

}  // namespace m3::app

// GET /metrics: Prometheus text exposition of the router's counters, per worker where it
// matters. Names start with "m3serve_router:" (the workers' own metrics are "m3serve:").
#include <cstdio>
#include <map>

#include "router/cache_aware_policy.h"
#include "router/router.h"

namespace m3::router {

namespace {

// A label value with '\', '"' and newlines escaped (the exposition format's rule).
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP m3serve_router:") + name + " " + help + "\n";
  out += std::string("# TYPE m3serve_router:") + name + " " + type + "\n";
}

void sample(std::string& out, const char* name, const std::string& worker, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  out += std::string("m3serve_router:") + name;
  if (!worker.empty()) out += "{worker=\"" + label(worker) + "\"}";
  out += std::string(" ") + buf + "\n";
}

}  // namespace

std::string Router::metrics_text() const {
  std::string out;
  const auto workers = workers_.all();
  std::map<uint64_t, TreeStats> trees;
  if (const auto* ca = dynamic_cast<const CacheAwarePolicy*>(policy_.get())) {
    for (const TreeStats& t : ca->tree_stats()) trees[t.worker_id] = t;
  }
  header(out, "requests_total", "counter", "Requests received by the router.");
  sample(out, "requests_total", "", static_cast<double>(requests_total_.load()));
  header(out, "retries_total", "counter",
         "Attempts sent to another worker after one failed before its first response byte.");
  sample(out, "retries_total", "", static_cast<double>(retries_total_.load()));
  header(out, "no_worker_total", "counter", "Requests refused because no worker could take them.");
  sample(out, "no_worker_total", "", static_cast<double>(no_worker_total_.load()));
  header(out, "cache_routed_total", "counter",
         "cache_aware: requests sent to the worker with the longest prefix match.");
  sample(out, "cache_routed_total", "", static_cast<double>(cache_routed_total_.load()));
  header(out, "load_routed_total", "counter",
         "cache_aware: requests sent to the least loaded worker (short match or imbalance).");
  sample(out, "load_routed_total", "", static_cast<double>(load_routed_total_.load()));
  header(out, "workers", "gauge", "Workers in the pool.");
  sample(out, "workers", "", static_cast<double>(workers.size()));

  header(out, "worker_healthy", "gauge", "1 while the worker takes requests.");
  for (const auto& w : workers) sample(out, "worker_healthy", w->url, w->healthy.load() ? 1 : 0);
  header(out, "worker_requests_total", "counter", "Attempts sent to the worker.");
  for (const auto& w : workers) {
    sample(out, "worker_requests_total", w->url, static_cast<double>(w->requests_total.load()));
  }
  header(out, "worker_in_flight", "gauge", "Requests in flight on the worker through the router.");
  for (const auto& w : workers) {
    sample(out, "worker_in_flight", w->url, static_cast<double>(w->in_flight.load()));
  }
  header(out, "worker_failures_total", "counter",
         "Attempts on the worker that failed before the client got a byte (then retried).");
  for (const auto& w : workers) {
    sample(out, "worker_failures_total", w->url, static_cast<double>(w->failures_total.load()));
  }
  header(out, "worker_stream_errors_total", "counter",
         "Streams the worker cut after their first byte (ended with an error event).");
  for (const auto& w : workers) {
    sample(out, "worker_stream_errors_total", w->url,
           static_cast<double>(w->errors_total.load()));
  }
  header(out, "worker_prefix_match_rate", "gauge",
         "cache_aware: matched bytes / routing-text bytes of the requests sent to the worker, "
         "from the router's approximate tree (an estimate of the worker's prefix-cache hits).");
  for (const auto& w : workers) {
    const double text = static_cast<double>(w->text_bytes_total.load());
    sample(out, "worker_prefix_match_rate", w->url,
           text > 0 ? static_cast<double>(w->matched_bytes_total.load()) / text : 0.0);
  }
  header(out, "worker_tree_bytes", "gauge", "cache_aware: bytes of text in the worker's tree.");
  for (const auto& w : workers) {
    auto it = trees.find(w->id);
    sample(out, "worker_tree_bytes", w->url,
           it == trees.end() ? 0.0 : static_cast<double>(it->second.tree_bytes));
  }
  return out;
}

}  // namespace m3::router

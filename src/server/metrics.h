// Prometheus text exposition (format 0.0.4) with vLLM-style names under the "m3serve:" prefix.
// Gauges of the backend (running/waiting requests, KV pages) are read at scrape time; counters and
// histograms are updated by the request handlers. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/backend.h"

namespace m3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines for `name`.
  void render(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), plus +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  Histogram time_to_first_token{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}};
  Histogram inter_token_latency{{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                 0.075, 0.1,    0.15,  0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.5}};
  Histogram e2e_request_latency{{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0}};
  Histogram request_prompt_tokens{{16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576}};
  Histogram request_generation_tokens{{16, 64, 256, 1024, 4096, 16384, 65536}};

  std::atomic<uint64_t> prompt_tokens_total{0};
  std::atomic<uint64_t> generation_tokens_total{0};
  std::atomic<uint64_t> reasoning_tokens_total{0};
  std::atomic<uint64_t> http_requests_total{0};
  std::atomic<int64_t> http_connections_open{0};
  std::atomic<int64_t> http_connections_refused_total{0};  // past --max-connections
  std::atomic<int64_t> requests_in_flight{0};  // generation requests being served

  // finished_reason: stop, length, abort, error, tool_calls.
  void count_finished(const std::string& reason);
  // Rejections before the backend: status 400/401/404/413/429/503.
  void count_rejected(int http_status);

  std::string render(const BackendStats& stats, bool ready, bool draining) const;

 private:
  std::string model_label_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> finished_;
  std::map<int, uint64_t> rejected_;
};

}  // namespace m3::server

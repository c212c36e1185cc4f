// The router's workers: their URLs, health and counters. Workers are added and removed at
// runtime (admin routes); a request holds a shared_ptr to its worker, so removing one never
// pulls it from under a request in flight. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/http_client.h"
#include "core/status.h"

namespace m3::router {

// Parses a worker URL (http://host:port[/prefix]); errors name the URL.
Result<bench::Endpoint> parse_worker_url(const std::string& url);

struct Worker {
  uint64_t id = 0;  // never reused, so a policy's state cannot outlive its worker's removal
  std::string url;  // as given, without a trailing '/'
  bench::Endpoint endpoint;
  std::atomic<bool> healthy{true};
  std::atomic<int> consecutive_probe_failures{0};
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> requests_total{0};  // requests sent to it (every attempt)
  std::atomic<int64_t> failures_total{0};  // attempts that failed before a response (retried)
  std::atomic<int64_t> errors_total{0};    // responses cut off after their first byte
  std::atomic<uint64_t> matched_bytes_total{0};  // cache_aware: matched bytes of its requests
  std::atomic<uint64_t> text_bytes_total{0};     // cache_aware: routing text bytes
};

class WorkerRegistry {
 public:
  // Adds a worker (healthy until a probe or a request says otherwise). Refuses a duplicate URL.
  Result<std::shared_ptr<Worker>> add(const std::string& url);
  // Removes a worker by URL; returns it (nullptr when there was none).
  std::shared_ptr<Worker> remove(const std::string& url);
  std::vector<std::shared_ptr<Worker>> all() const;
  std::shared_ptr<Worker> find(uint64_t id) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Worker>> workers_;
  uint64_t next_id_ = 1;
};

}  // namespace m3::router

// Routing policies: which healthy worker gets a request. The proxy hands a policy the candidates
// (healthy workers not yet tried for this request, with the router's own in-flight count as
// their load) and the request's routing text; the policy answers with one of them.
//   round_robin   the next candidate in turn;
//   random        uniform;
//   power_of_two  two distinct random candidates, the less loaded;
//   cache_aware   see cache_aware_policy.h.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace m3::router {

struct Candidate {
  uint64_t worker_id = 0;
  int64_t load = 0;       // requests in flight through this router
  int64_t processed = 0;  // requests sent so far (a tie-break among equal loads)
};

struct Selection {
  uint64_t worker_id = 0;
  // cache_aware only: matched bytes of the routing text in the chosen worker's tree, and the
  // text's length; whether the choice followed the match (else it balanced the load).
  size_t matched_bytes = 0;
  size_t text_bytes = 0;
  bool by_cache = false;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual const char* name() const = 0;
  // `candidates` is never empty.
  virtual Selection select(std::string_view text, const std::vector<Candidate>& candidates) = 0;
  // A worker left the pool: drop what the policy keeps about it.
  virtual void forget_worker(uint64_t /*worker_id*/) {}
  // Periodic upkeep (the cache-aware trees' eviction).
  virtual void evict() {}
};

// The candidate with the least load; ties go to the fewest processed, then the lowest id, so
// that slow prefills with equal in-flight counts still spread.
size_t least_loaded(const std::vector<Candidate>& candidates);

class RoundRobinPolicy : public RoutingPolicy {
 public:
  const char* name() const override { return "round_robin"; }
  Selection select(std::string_view text, const std::vector<Candidate>& candidates) override;

 private:
  std::mutex mu_;
  uint64_t next_ = 0;
};

class RandomPolicy : public RoutingPolicy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed) {}
  const char* name() const override { return "random"; }
  Selection select(std::string_view text, const std::vector<Candidate>& candidates) override;

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
};

class PowerOfTwoPolicy : public RoutingPolicy {
 public:
  explicit PowerOfTwoPolicy(uint64_t seed) : rng_(seed) {}
  const char* name() const override { return "power_of_two"; }
  Selection select(std::string_view text, const std::vector<Candidate>& candidates) override;

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
};

}  // namespace m3::router

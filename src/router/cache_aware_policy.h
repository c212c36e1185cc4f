// The cache-aware policy (SGLang router's `cache_aware`, with the fixes its users asked for):
//   1. Imbalanced if max_load - min_load > balance_abs_threshold and
//      max_load > balance_rel_threshold * min_load (loads: in-flight requests through this
//      router). Then the least loaded candidate gets the request.
//   2. Else the candidate whose tree matches the longest prefix of the routing text gets it if
//      matched/len >= cache_threshold; otherwise the least loaded one (not the smallest tree:
//      that piled unique traffic on one busy worker in SGLang's router).
//   3. The text is inserted into the chosen worker's tree either way.
// One tree per worker, each capped at max_tree_size bytes by evict() (called every
// eviction_interval); an insert that takes a tree past twice the cap evicts at once, so memory
// stays bounded by about 2 * max_tree_size * workers bytes of text between periodic evictions.
#pragma once

#include <map>

#include "router/policy.h"
#include "router/radix_tree.h"

namespace m3::router {

struct CacheAwareConfig {
  double cache_threshold = 0.5;
  int64_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.0001;
  size_t max_tree_size = 1u << 24;  // bytes of request text per worker
};

// Per-worker figures for /metrics.
struct TreeStats {
  uint64_t worker_id = 0;
  size_t tree_bytes = 0;
  size_t tree_nodes = 0;
};

class CacheAwarePolicy : public RoutingPolicy {
 public:
  explicit CacheAwarePolicy(CacheAwareConfig config) : config_(config) {}
  const char* name() const override { return "cache_aware"; }
  Selection select(std::string_view text, const std::vector<Candidate>& candidates) override;
  void forget_worker(uint64_t worker_id) override;
  void evict() override;
  std::vector<TreeStats> tree_stats() const;

 private:
  CacheAwareConfig config_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<ApproxRadixTree>> trees_;
};

}  // namespace m3::router

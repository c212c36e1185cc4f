#include "router/cache_aware_policy.h"

#include <algorithm>

namespace m3::router {

Selection CacheAwarePolicy::select(std::string_view text, const std::vector<Candidate>& c) {
  Selection s;
  s.text_bytes = text.size();
  int64_t min_load = c[0].load, max_load = c[0].load;
  for (const Candidate& x : c) {
    min_load = std::min(min_load, x.load);
    max_load = std::max(max_load, x.load);
  }
  const bool imbalanced =
      max_load - min_load > config_.balance_abs_threshold &&
      static_cast<double>(max_load) > config_.balance_rel_threshold * static_cast<double>(min_load);
  std::lock_guard<std::mutex> lock(mu_);
  auto tree_of = [&](uint64_t id) -> ApproxRadixTree& {
    auto& t = trees_[id];
    if (!t) t = std::make_unique<ApproxRadixTree>();
    return *t;
  };
  // The longest match over the candidates (a tie keeps the less loaded, then the first).
  size_t best = least_loaded(c);
  size_t best_match = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    auto it = trees_.find(c[i].worker_id);
    if (it == trees_.end() || text.empty()) continue;
    const size_t m = it->second->match(text, /*touch=*/false);
    if (m > best_match || (m == best_match && m > 0 && c[i].load < c[best].load)) {
      best_match = m;
      best = i;
    }
  }
  const double rate = text.empty() ? 0.0 : static_cast<double>(best_match) / text.size();
  size_t chosen = least_loaded(c);
  if (!imbalanced && best_match > 0 && rate >= config_.cache_threshold) {
    chosen = best;
    s.by_cache = true;
  }
  s.worker_id = c[chosen].worker_id;
  ApproxRadixTree& tree = tree_of(s.worker_id);
  s.matched_bytes = chosen == best ? best_match : tree.match(text, /*touch=*/false);
  if (!text.empty()) {
    tree.insert(text);  // stamps the whole path: the chosen worker's prefix stays fresh
    if (tree.size_bytes() > 2 * config_.max_tree_size) tree.evict_to(config_.max_tree_size);
  }
  return s;
}

void CacheAwarePolicy::forget_worker(uint64_t worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  trees_.erase(worker_id);
}

void CacheAwarePolicy::evict() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, tree] : trees_) tree->evict_to(config_.max_tree_size);
}

std::vector<TreeStats> CacheAwarePolicy::tree_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TreeStats> out;
  for (const auto& [id, tree] : trees_) out.push_back({id, tree->size_bytes(), tree->node_count()});
  return out;
}

}  // namespace m3::router

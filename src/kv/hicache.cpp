#include "kv/hicache.h"

#include <algorithm>

namespace m3 {

Result<HiCacheWritePolicy> parse_hicache_write_policy(const std::string& name) {
  if (name == "write_through") return HiCacheWritePolicy::kWriteThrough;
  if (name == "write_back") return HiCacheWritePolicy::kWriteBack;
  return invalid_argument("--hicache-write-policy: unknown policy '" + name +
                          "'; choices: write_through, write_back");
}

const char* hicache_write_policy_name(HiCacheWritePolicy policy) {
  return policy == HiCacheWritePolicy::kWriteThrough ? "write_through" : "write_back";
}

const std::vector<double>& hicache_load_seconds_bounds() {
  static const std::vector<double> bounds{0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05,   0.1,    0.25,  0.5,    1.0,   2.5,  5.0};
  return bounds;
}

void HiCacheCounters::observe_load(double seconds) {
  const std::vector<double>& b = hicache_load_seconds_bounds();
  const size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), seconds) - b.begin());
  ++load_seconds_counts[i];
  load_seconds_sum += seconds;
  ++num_loads;
}

Result<std::unique_ptr<HiCache>> make_hicache(KvPageCopier* copier, const HiCacheOptions& o) {
  if (copier == nullptr) {
    return invalid_argument("--enable-hierarchical-cache: the model runner cannot copy KV pages");
  }
  auto cache = std::make_unique<HiCache>();
  cache->copier = copier;
  cache->policy = o.policy;
  cache->root_key = root_page_key(o.model_identity);
  M3_ASSIGN_OR_RETURN(cache->host, HostPagePool::create(copier, o.host_pages));
  if (!o.disk_dir.empty()) {
    M3_ASSIGN_OR_RETURN(cache->disk, DiskPageStore::open(o.disk_dir, o.model_identity, o.page_size,
                                                         copier->page_bytes()));
  }
  return cache;
}

}  // namespace m3

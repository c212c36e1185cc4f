// HiCache: the tiers below the device KV pool of one radix prefix index (SGLang's hierarchical
// cache; docs/kv-cache.md). Pages the device pool evicts stay in the index as host pages (a
// HostPagePool filled through the model runner's KvPageCopier); pages the host tier evicts go to
// an optional disk tier (DiskPageStore) keyed by the prefix's chained key. A prefix hit on host or
// disk pages copies them back into device pages before the request's prefill.
//
// Write policies (--hicache-write-policy):
//   write_through: a page is copied to the host tier when it enters the radix index, so evicting
//     it from the device later only drops the device copy;
//   write_back: a page is copied to the host tier only when the device evicts it.
// Either way a page the device evicts without a host copy gets one then (taking the least
// recently used host page if the host tier is full), and only when no host page can be had is it
// written straight to disk (or dropped without a disk tier).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/disk_page_store.h"
#include "kv/host_page_pool.h"
#include "kv/kv_page_copier.h"
#include "kv/page_key.h"

namespace m3 {

enum class HiCacheWritePolicy : uint8_t { kWriteThrough, kWriteBack };
// "write_through" / "write_back"; anything else is an invalid argument naming
// --hicache-write-policy and the choices.
Result<HiCacheWritePolicy> parse_hicache_write_policy(const std::string& name);
const char* hicache_write_policy_name(HiCacheWritePolicy policy);

// Upper bounds (seconds) of the m3serve:hicache_load_seconds histogram's buckets.
const std::vector<double>& hicache_load_seconds_bounds();

struct HiCacheCounters {
  uint64_t host_hit_tokens = 0;   // tokens loaded back to the device from the host tier
  uint64_t disk_hit_tokens = 0;   // tokens loaded back to the device from the disk tier
  uint64_t pages_saved_to_host = 0;
  uint64_t pages_written_to_disk = 0;
  uint64_t pages_dropped = 0;     // left every tier (no room, no disk tier, or a failed write)
  // One load back (all the pages of one admission): per bucket of hicache_load_seconds_bounds(),
  // then +Inf; not cumulative.
  std::vector<uint64_t> load_seconds_counts =
      std::vector<uint64_t>(hicache_load_seconds_bounds().size() + 1, 0);
  double load_seconds_sum = 0;
  uint64_t num_loads = 0;

  void observe_load(double seconds);
};

// What a radix index needs to use the lower tiers. Owns the host pool and the disk store.
struct HiCache {
  KvPageCopier* copier = nullptr;          // the model runner's; outlives this
  std::unique_ptr<HostPagePool> host;      // required
  std::unique_ptr<DiskPageStore> disk;     // null: no disk tier
  HiCacheWritePolicy policy = HiCacheWritePolicy::kWriteThrough;
  PageKey root_key;                        // root_page_key(model identity)
  HiCacheCounters counters;
};

struct HiCacheOptions {
  int32_t host_pages = 0;
  HiCacheWritePolicy policy = HiCacheWritePolicy::kWriteThrough;
  std::string disk_dir;        // empty: no disk tier
  std::string model_identity;  // the key chain's root; must name model, dtype and KV layout
  int32_t page_size = 0;
};
// Builds the tiers: allocates the host pool through the copier and opens the disk directory.
Result<std::unique_ptr<HiCache>> make_hicache(KvPageCopier* copier, const HiCacheOptions& options);

}  // namespace m3

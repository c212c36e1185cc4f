// The KvPageCopier (kv/kv_page_copier.h) of the float32 model's PagedKvCache: synchronous page
// copies through the backend's copy_to_host / copy_to_device, heap memory for the host tier, and
// a wait() with nothing to wait for. Over tensor-parallel CPU ranks (one process, one attention
// group) a page is every rank's shard of it (the rank's KV heads, its copy of the index keys):
// the host page holds the shards one after another, in rank order. The CUDA path's copier
// (pinned memory, its own copy stream) would be a separate implementation of the same interface.
#pragma once

#include <vector>

#include "kv/kv_page_copier.h"
#include "model/minimax_m3/kv_cache.h"

namespace m3::minimax_m3 {

class PagedKvCacheCopier final : public KvPageCopier {
 public:
  explicit PagedKvCacheCopier(PagedKvCache* cache) : PagedKvCacheCopier(std::vector{cache}) {}
  // One cache per rank, all with the same page ids.
  explicit PagedKvCacheCopier(std::vector<PagedKvCache*> shards);

  int64_t page_bytes() const override { return page_bytes_; }
  std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) override;
  Status save(std::span<const PageCopy> copies) override;
  Status load(std::span<const PageCopy> copies) override;
  Status wait() override { return Status::ok(); }

 private:
  Status check(const PageCopy& c, const char* op) const;
  std::vector<PagedKvCache*> shards_;
  int64_t page_bytes_ = 0;
};

}  // namespace m3::minimax_m3

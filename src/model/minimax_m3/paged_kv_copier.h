// The KvPageCopier (kv/kv_page_copier.h) of the float32 model's PagedKvCache: synchronous page
// copies through the backend's copy_to_host / copy_to_device, heap memory for the host tier, and
// a wait() with nothing to wait for. The CUDA path's copier (pinned memory, its own copy stream)
// is a separate implementation of the same interface.
#pragma once

#include "kv/kv_page_copier.h"
#include "model/minimax_m3/kv_cache.h"

namespace m3::minimax_m3 {

class PagedKvCacheCopier final : public KvPageCopier {
 public:
  explicit PagedKvCacheCopier(PagedKvCache* cache) : cache_(cache) {}

  int64_t page_bytes() const override { return cache_->bytes_per_page(); }
  std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) override;
  Status save(std::span<const PageCopy> copies) override;
  Status load(std::span<const PageCopy> copies) override;
  Status wait() override { return Status::ok(); }

 private:
  Status check(const PageCopy& c, const char* op) const;
  PagedKvCache* cache_;
};

}  // namespace m3::minimax_m3

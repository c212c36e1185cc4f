#include "model/minimax_m3/paged_kv_copier.h"

#include <new>
#include <string>
#include <utility>

namespace m3::minimax_m3 {

PagedKvCacheCopier::PagedKvCacheCopier(std::vector<PagedKvCache*> shards)
    : shards_(std::move(shards)) {
  for (const PagedKvCache* c : shards_) page_bytes_ += c->bytes_per_page();
}

std::unique_ptr<HostPageArena> PagedKvCacheCopier::allocate_host_arena(int64_t bytes) {
  try {
    return std::make_unique<HeapPageArena>(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;  // the caller names the size in its error
  }
}

Status PagedKvCacheCopier::check(const PageCopy& c, const char* op) const {
  const int64_t pages = shards_.front()->num_pages();
  if (c.device_page < 0 || c.device_page >= pages || c.host == nullptr) {
    return internal_error(std::string("[kv_copier.") + op + "] page " +
                          std::to_string(c.device_page) + " of " + std::to_string(pages) +
                          (c.host == nullptr ? ", null host memory" : ""));
  }
  return Status::ok();
}

Status PagedKvCacheCopier::save(std::span<const PageCopy> copies) {
  for (const PageCopy& c : copies) {
    M3_RETURN_IF_ERROR(check(c, "save"));
    std::byte* at = c.host;
    for (PagedKvCache* shard : shards_) {
      shard->save_page(c.device_page, at);
      at += shard->bytes_per_page();
    }
  }
  return Status::ok();
}

Status PagedKvCacheCopier::load(std::span<const PageCopy> copies) {
  for (const PageCopy& c : copies) {
    M3_RETURN_IF_ERROR(check(c, "load"));
    const std::byte* at = c.host;
    for (PagedKvCache* shard : shards_) {
      shard->load_page(c.device_page, at);
      at += shard->bytes_per_page();
    }
  }
  return Status::ok();
}

}  // namespace m3::minimax_m3

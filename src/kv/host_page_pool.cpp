#include "kv/host_page_pool.h"

#include <string>

namespace m3 {

Result<std::unique_ptr<HostPagePool>> HostPagePool::create(KvPageCopier* copier,
                                                           int32_t num_pages) {
  M3_CHECK(copier != nullptr, "[kv.host_page_pool] null copier");
  if (num_pages <= 0) {
    return invalid_argument("[kv.host_page_pool] host tier of " + std::to_string(num_pages) +
                            " pages; it must hold at least one page");
  }
  const int64_t page_bytes = copier->page_bytes();
  M3_CHECK(page_bytes > 0, "[kv.host_page_pool] page_bytes " + std::to_string(page_bytes));
  const int64_t bytes = page_bytes * num_pages;
  std::unique_ptr<HostPageArena> arena = copier->allocate_host_arena(bytes);
  if (!arena || arena->size() < bytes) {
    return Status(StatusCode::kResourceExhausted, "[kv.host_page_pool] cannot allocate " + std::to_string(bytes) +
                              " bytes of host memory for " + std::to_string(num_pages) +
                              " KV pages");
  }
  return std::unique_ptr<HostPagePool>(new HostPagePool(std::move(arena), num_pages, page_bytes));
}

HostPagePool::HostPagePool(std::unique_ptr<HostPageArena> arena, int32_t num_pages,
                           int64_t page_bytes)
    : arena_(std::move(arena)), num_pages_(num_pages), page_bytes_(page_bytes) {
  allocated_.assign(static_cast<size_t>(num_pages), 0);
  pins_.assign(static_cast<size_t>(num_pages), 0);
  free_.reserve(static_cast<size_t>(num_pages));
  for (HostPageId p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

void HostPagePool::check_allocated(HostPageId page, const char* op) const {
  M3_CHECK(page >= 0 && page < num_pages_ && allocated_[static_cast<size_t>(page)],
           std::string("[kv.host_page_pool.") + op + "] host page " + std::to_string(page) +
               " is not allocated");
}

HostPageId HostPagePool::alloc() {
  if (free_.empty()) return -1;
  HostPageId p = free_.back();
  free_.pop_back();
  allocated_[static_cast<size_t>(p)] = 1;
  return p;
}

void HostPagePool::free(HostPageId page) {
  check_allocated(page, "free");
  M3_CHECK(pins_[static_cast<size_t>(page)] == 0,
           "[kv.host_page_pool.free] host page " + std::to_string(page) + " is pinned");
  allocated_[static_cast<size_t>(page)] = 0;
  free_.push_back(page);
}

bool HostPagePool::is_allocated(HostPageId page) const {
  return page >= 0 && page < num_pages_ && allocated_[static_cast<size_t>(page)] != 0;
}

std::byte* HostPagePool::data(HostPageId page) {
  check_allocated(page, "data");
  return arena_->data() + static_cast<int64_t>(page) * page_bytes_;
}

void HostPagePool::pin(HostPageId page) {
  check_allocated(page, "pin");
  ++pins_[static_cast<size_t>(page)];
}

void HostPagePool::unpin(HostPageId page) {
  check_allocated(page, "unpin");
  M3_CHECK(pins_[static_cast<size_t>(page)] > 0,
           "[kv.host_page_pool.unpin] host page " + std::to_string(page) + " is not pinned");
  --pins_[static_cast<size_t>(page)];
}

bool HostPagePool::is_pinned(HostPageId page) const {
  return is_allocated(page) && pins_[static_cast<size_t>(page)] > 0;
}

}  // namespace m3

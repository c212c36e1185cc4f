#include "model/minimax_m3/paged_kv_copier.h"

#include <new>
#include <string>

namespace m3::minimax_m3 {

std::unique_ptr<HostPageArena> PagedKvCacheCopier::allocate_host_arena(int64_t bytes) {
  try {
    return std::make_unique<HeapPageArena>(bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;  // the caller names the size in its error
  }
}

Status PagedKvCacheCopier::check(const PageCopy& c, const char* op) const {
  if (c.device_page < 0 || c.device_page >= cache_->num_pages() || c.host == nullptr) {
    return internal_error(std::string("[kv_copier.") + op + "] page " +
                          std::to_string(c.device_page) + " of " +
                          std::to_string(cache_->num_pages()) +
                          (c.host == nullptr ? ", null host memory" : ""));
  }
  return Status::ok();
}

Status PagedKvCacheCopier::save(std::span<const PageCopy> copies) {
  for (const PageCopy& c : copies) {
    M3_RETURN_IF_ERROR(check(c, "save"));
    cache_->save_page(c.device_page, c.host);
  }
  return Status::ok();
}

Status PagedKvCacheCopier::load(std::span<const PageCopy> copies) {
  for (const PageCopy& c : copies) {
    M3_RETURN_IF_ERROR(check(c, "load"));
    cache_->load_page(c.device_page, c.host);
  }
  return Status::ok();
}

}  // namespace m3::minimax_m3

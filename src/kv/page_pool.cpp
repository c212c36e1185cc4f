#include "kv/page_pool.h"

#include <string>

#include "core/status.h"

namespace m3 {

PagePool::PagePool(int32_t num_pages) {
  M3_CHECK(num_pages >= 0, "[kv.page_pool] num_pages " + std::to_string(num_pages) + " < 0");
  refcount_.assign(num_pages, 0);
  cached_.assign(num_pages, 0);
  free_.reserve(num_pages);
  // Reverse order so that the first allocations return 0, 1, 2, ...: simulations read better.
  for (int32_t p = num_pages - 1; p >= 0; --p) free_.push_back(p);
}

void PagePool::check_id(PageId page, const char* op) const {
  M3_CHECK(page >= 0 && page < num_pages(), std::string("[kv.page_pool.") + op + "] page id " +
                                                std::to_string(page) + " out of range [0, " +
                                                std::to_string(num_pages()) + ")");
}

bool PagePool::alloc(int32_t n, std::vector<PageId>* out) {
  M3_CHECK(n >= 0, "[kv.page_pool.alloc] n " + std::to_string(n) + " < 0");
  if (n > num_free()) return false;
  for (int32_t i = 0; i < n; ++i) {
    PageId p = free_.back();
    free_.pop_back();
    refcount_[p] = 1;
    out->push_back(p);
  }
  return true;
}

void PagePool::incref(PageId page) {
  check_id(page, "incref");
  M3_CHECK(refcount_[page] > 0,
           "[kv.page_pool.incref] page " + std::to_string(page) + " is free");
  if (cached_[page] && refcount_[page] == 1) --num_cached_only_;
  ++refcount_[page];
}

void PagePool::decref(PageId page) {
  check_id(page, "decref");
  M3_CHECK(refcount_[page] > 0,
           "[kv.page_pool.decref] page " + std::to_string(page) + " is already free");
  --refcount_[page];
  if (cached_[page] && refcount_[page] == 1) ++num_cached_only_;
  if (refcount_[page] == 0) {
    M3_CHECK(!cached_[page], "[kv.page_pool.decref] page " + std::to_string(page) +
                                 " freed while the prefix index still holds it");
    free_.push_back(page);
  }
}

int32_t PagePool::refcount(PageId page) const {
  check_id(page, "refcount");
  return refcount_[page];
}

void PagePool::set_cached(PageId page, bool cached) {
  check_id(page, "set_cached");
  M3_CHECK(refcount_[page] > 0,
           "[kv.page_pool.set_cached] page " + std::to_string(page) + " is free");
  if (static_cast<bool>(cached_[page]) == cached) return;
  cached_[page] = cached ? 1 : 0;
  if (refcount_[page] == 1) num_cached_only_ += cached ? 1 : -1;
}

bool PagePool::is_cached(PageId page) const {
  check_id(page, "is_cached");
  return cached_[page] != 0;
}

}  // namespace m3

// KV page pool: a fixed number of pages, each holding kPageSize consecutive token positions of one
// sequence for every layer (K, V and, on sparse layers, the indexer keys: one page id covers all
// three, m3-architecture.md §3.6). The pool only hands out ids and counts references; the model
// runner owns the memory behind the ids. Not thread-safe: the scheduler thread owns it.
#pragma once

#include <cstdint>
#include <vector>

namespace m3 {

using PageId = int32_t;

// Tokens per page. Equals the MSA index block size; the real model needs exactly 128 (vLLM refuses
// anything else for sparse layers). Tests use small pages to keep simulations readable.
inline constexpr int32_t kPageSize = 128;

class PagePool {
 public:
  explicit PagePool(int32_t num_pages);

  int32_t num_pages() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  // Pages whose only holder is the prefix index (evictable cache), for kv_pages_cached.
  int32_t num_cached_only() const { return num_cached_only_; }
  // Pages held by at least one live sequence (kv_pages_used).
  int32_t num_used() const { return num_pages() - num_free() - num_cached_only_; }

  // Appends n fresh pages (refcount 1) to *out. All or nothing: returns false and changes nothing
  // when fewer than n pages are free. Pages come out in a deterministic order.
  bool alloc(int32_t n, std::vector<PageId>* out);

  // Reference counting. decref() to zero returns the page to the free list. Misuse (bad id,
  // decref of a free page) is an internal invariant violation (M3_CHECK).
  void incref(PageId page);
  void decref(PageId page);
  int32_t refcount(PageId page) const;

  // Marks a page as held by the prefix index (the index takes one reference on its own). Only
  // used to keep num_cached_only() exact in O(1).
  void set_cached(PageId page, bool cached);
  bool is_cached(PageId page) const;

 private:
  void check_id(PageId page, const char* op) const;

  std::vector<int32_t> refcount_;
  std::vector<uint8_t> cached_;
  std::vector<PageId> free_;  // stack; back() is handed out next
  int32_t num_cached_only_ = 0;
};

}  // namespace m3

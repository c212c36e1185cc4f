// The host tier's pages: a fixed number of page-sized slots in host memory (from the copier, so
// pinned on GPUs), handed out by id. A slot belongs to at most one radix-index node; `pinned`
// counts the operations that must not lose it (a load back to the device in progress). Not
// thread-safe: the scheduler thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_page_copier.h"

namespace m3 {

using HostPageId = int32_t;

class HostPagePool {
 public:
  // Fails (resource exhausted) when the copier cannot provide the memory.
  static Result<std::unique_ptr<HostPagePool>> create(KvPageCopier* copier, int32_t num_pages);

  int32_t num_pages() const { return num_pages_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_pages_ - num_free(); }
  int64_t page_bytes() const { return page_bytes_; }

  // A free slot, or -1 when none is free.
  HostPageId alloc();
  void free(HostPageId page);
  bool is_allocated(HostPageId page) const;
  std::byte* data(HostPageId page);

  void pin(HostPageId page);
  void unpin(HostPageId page);
  bool is_pinned(HostPageId page) const;

 private:
  HostPagePool(std::unique_ptr<HostPageArena> arena, int32_t num_pages, int64_t page_bytes);
  void check_allocated(HostPageId page, const char* op) const;

  std::unique_ptr<HostPageArena> arena_;
  int32_t num_pages_;
  int64_t page_bytes_;
  std::vector<uint8_t> allocated_;
  std::vector<int32_t> pins_;
  std::vector<HostPageId> free_;  // stack; back() is handed out next
};

}  // namespace m3

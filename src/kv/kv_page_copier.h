// The seam through which the tiered KV cache (kv/radix_prefix_index.h with HiCacheTiers) moves
// whole KV pages between the device pool and host memory. A page is opaque bytes here: every
// layer's K, V and indexer keys of one page id, in the implementation's own layout, page_bytes()
// long. The model runner that owns the device memory implements it (model/model.h,
// ModelRunner::kv_page_copier()).
//
// Shaped for an asynchronous GPU implementation: host memory comes from the copier
// (allocate_host_arena, so a GPU copier can hand out pinned memory), save() and load() only
// enqueue (a GPU copier issues them on its own copy stream), and wait() is the one point where
// the host sees them completed. The callers keep to that contract:
//   - the engine calls order_before_forward() before every forward: a loaded page must be
//     complete before attention reads it, and a released page's save must have read it before a
//     forward writes that page id again. A GPU copier makes its compute stream wait for exactly
//     those copies (the host does not block, and saves of pages still cached run on beside the
//     forward); the default blocks on every copy (wait());
//   - the cache calls release() for a page it gives back to the device pool (evicted), before
//     the pool can hand the id out again;
//   - the cache calls wait() before it reads host bytes a save() wrote (writing them to disk) and
//     before it overwrites host bytes a load() may still be reading.
//   - save() is called only for pages whose K/V a completed forward wrote (they are in the radix
//     index); a GPU copier still orders its copy stream after the compute stream's last write
//     (an event recorded after the forward) before reading them.
// The CPU implementation copies synchronously and wait() returns at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "kv/page_pool.h"

namespace m3 {

// Host memory for the host tier: one contiguous block of `size()` bytes.
class HostPageArena {
 public:
  virtual ~HostPageArena() = default;
  virtual std::byte* data() = 0;
  virtual int64_t size() const = 0;
};

// One page copy: a device page id and page_bytes() of host memory.
struct PageCopy {
  PageId device_page = -1;
  std::byte* host = nullptr;
};

class KvPageCopier {
 public:
  virtual ~KvPageCopier() = default;

  // Bytes of one page (all layers' K, V and indexer keys).
  virtual int64_t page_bytes() const = 0;
  // Host memory the copier can copy to and from at full speed (pinned on GPUs). Null when the
  // memory cannot be had.
  virtual std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) = 0;
  // Device -> host. Enqueues; complete after wait().
  virtual Status save(std::span<const PageCopy> copies) = 0;
  // Host -> device. Enqueues; complete after wait().
  virtual Status load(std::span<const PageCopy> copies) = 0;
  // Blocks until every copy enqueued so far has completed.
  virtual Status wait() = 0;
  // The cache gives `page` back to the device pool: a save still reading it must be complete
  // before the next forward (order_before_forward) may write the id again.
  virtual void release(PageId page) { (void)page; }
  // Before a forward: the loads enqueued so far and the saves of released pages come first.
  virtual Status order_before_forward() { return wait(); }
};

// Plain heap memory: what a CPU copier hands out.
class HeapPageArena final : public HostPageArena {
 public:
  explicit HeapPageArena(int64_t bytes)
      : bytes_(std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(bytes))), size_(bytes) {}
  std::byte* data() override { return bytes_.get(); }
  int64_t size() const override { return size_; }

 private:
  std::unique_ptr<std::byte[]> bytes_;
  int64_t size_;
};

}  // namespace m3

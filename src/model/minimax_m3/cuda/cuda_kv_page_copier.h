// HiCache's page copies (kv/kv_page_copier.h) for the real-shape CUDA model: a page is every
// rank's shard of it (the rank's bf16 K, V and index keys of every layer, CudaM3Model::
// kv_page_runs), the shards one after another in rank order in host memory. The host tier is
// page-locked memory, and the copies run on a copy stream per GPU:
//  * save() waits, on the copy stream, for the compute stream's work queued so far (the forward
//    that wrote the pages), then queues the device-to-host copies;
//  * load() queues the host-to-device copies and makes the compute stream wait for them, so the
//    next forward reads complete pages even before wait();
//  * a save's pages are remembered with an event on each copy stream until it is reached;
//    release() marks the save of a page the cache gives back to the pool, and
//    order_before_forward() makes the compute streams wait (on the GPU) for those saves only:
//    the host does not block, and saves of pages that stay cached overlap the forward;
//  * wait() blocks until every queued copy has finished.
// Plain host code over the CUDA runtime wrappers (backend/cuda/runtime); no CUDA header.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/kv_page_copier.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

namespace m3::minimax_m3 {

class CudaKvPageCopier final : public KvPageCopier {
 public:
  // The pages of a runner's rank models (the same page ids on every rank, each on its GPU).
  static Result<std::unique_ptr<CudaKvPageCopier>> create(std::vector<CudaM3Model*> ranks);
  ~CudaKvPageCopier() override;

  int64_t page_bytes() const override { return page_bytes_; }
  std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) override;
  Status save(std::span<const PageCopy> copies) override;
  Status load(std::span<const PageCopy> copies) override;
  Status wait() override;
  void release(PageId page) override;
  Status order_before_forward() override;

  struct Rank;
  struct SaveBatch;

 private:
  CudaKvPageCopier() = default;
  Status check(const PageCopy& c, const char* op) const;
  // save (to_host) or load: every rank's shard of each page, on the rank's copy stream.
  Status copy(std::span<const PageCopy> copies, bool to_host);

  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t page_bytes_ = 0;
  std::deque<SaveBatch> saves_;  // queued saves not yet known to be complete, oldest first
};

}  // namespace m3::minimax_m3

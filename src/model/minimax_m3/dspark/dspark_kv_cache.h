// The draft's context K/V for one sequence (m3-architecture.md §5.2 step 2; docs/dspark.md,
// "Context cache"): per draft layer and committed position j, K = RoPE_j(k_norm(W_k c_j)) and
// V = W_v c_j, in pages of 128 positions ([P, S, Hkv, D] per layer, a KvLayerView the backend's
// kv_write fills).
//
// Invariant: the cache holds exactly the committed positions [0, length()); a draft block is
// proposed for the anchor at position length(). Only the last sliding_window positions are ever
// read, so the cache keeps a fixed number of pages: a page is released once all its positions lie
// more than one page behind the window of the next query (position >= length()), and positions
// that would be released at once are never computed. Truncation to a committed length L (a
// rollback) is allowed while the window of L is still held; it always is for
// L >= length() - page_size.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::minimax_m3::dspark {

class DSparkContextCache {
 public:
  static constexpr int64_t kDefaultPageSize = 128;

  // `backend` null: the page bookkeeping alone (block table, releases, truncation) over
  // capacity_pages() page ids, for a draft that keeps the K/V elsewhere (the real-shape CUDA
  // draft's bf16 pages); layer() is then unavailable.
  DSparkContextCache(Backend* backend, const DSparkConfig& cfg,
                     int64_t page_size = kDefaultPageSize);

  int64_t length() const { return length_; }
  int64_t page_size() const { return page_size_; }
  int64_t capacity_pages() const { return capacity_; }
  int64_t pages_in_use() const { return capacity_ - static_cast<int64_t>(free_.size()); }
  // The first position whose K/V may still be read or written: positions below it are released.
  int64_t first_held_position() const;

  // Rolls the cache back to `new_length` <= length(). Fails, changing nothing, when the window of
  // a query at new_length reaches positions already released.
  Status truncate(int64_t new_length);

  // --- For the draft forward.
  // The first position of an append that ends at `new_length` whose K/V can ever be read.
  int64_t first_needed_position(int64_t new_length) const;
  // Releases the pages nothing after `new_length` can read and gives pages to every block of
  // [first_needed_position(new_length), new_length). Call before writing those positions.
  Status prepare_append(int64_t new_length);
  void set_length(int64_t length) { length_ = length; }
  KvLayerView layer(int64_t i);
  // Logical block -> page id; -1 for released or never-held blocks.
  const std::vector<int32_t>& block_table() const { return table_; }

 private:
  // Blocks whose every position is < bound are never read again.
  int64_t release_bound(int64_t length) const;

  Backend* backend_;
  int64_t page_size_, window_, num_kv_heads_, head_dim_, capacity_;
  int64_t length_ = 0;
  int64_t first_block_ = 0;                 // blocks below are released
  std::vector<DeviceBuffer<float>> k_, v_;  // per layer [capacity, S, Hkv, D]
  std::vector<int32_t> table_;
  std::vector<int32_t> free_;
};

}  // namespace m3::minimax_m3::dspark

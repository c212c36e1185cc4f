// The draft's inputs kept alongside the target's KV pages, so that a speculative request can be
// served from the prefix cache (docs/dspark.md, "Prefix cache").
//
// A prefix-cache hit skips the target's forward over the cached positions, so their hidden
// states (the draft's context input) are not computed again. The engine therefore keeps, per KV
// page, the captured hidden states of the positions it wrote there: [num_layers, page_size,
// hidden] floats, filled in position order. A cached page may be used by a speculative request
// only when its entry covers the whole page at the page's own positions; otherwise the
// scheduler's match stops before it (Scheduler::set_prefix_match_limit) and the target computes
// that page again, capturing its features.
//
// Why this is exact: a page is only ever written by the sequence that holds it, in position
// order, and an indexed (full) page is immutable. Every write of a speculative sequence records
// its features here (write()); every write of another sequence invalidates the page
// (invalidate()). So an entry that covers a whole page holds the features of the computation that
// produced the page's K/V. The rejected drafts of a verify step are written to the pages but not
// recorded: only committed positions are (the accepted rows), and the pages past them are never
// indexed.
//
// Memory: entries are allocated the first time a page is written by a speculative sequence and
// kept for the page's life, at most num_pages * bytes_per_page() (app/memory_plan counts it).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/page_pool.h"

namespace m3 {

class DraftFeatureStore {
 public:
  // num_layers: captured target layers (DraftModel::capture_layers().size()); hidden: the target's
  // hidden size; page_size: tokens per KV page; num_pages: the KV pool's pages.
  DraftFeatureStore(int32_t num_layers, int32_t hidden, int32_t page_size, int32_t num_pages);

  static int64_t bytes_per_page(int32_t num_layers, int32_t hidden, int32_t page_size) {
    return int64_t{num_layers} * hidden * page_size * static_cast<int64_t>(sizeof(float));
  }

  // Records positions [pos, pos + n) of a sequence whose block table is `pages`: `rows` is
  // [num_layers, T, hidden] captured hidden states, of which tokens [first_row, first_row + n)
  // are those positions. A write into a page that does not continue its entry (a page reused,
  // or a rollback) restarts the entry at that position; one that leaves a gap is not recorded.
  void write(std::span<const PageId> pages, int64_t pos, int64_t n, std::span<const float> rows,
             int64_t T, int64_t first_row);
  // Positions [pos, pos + n) of `pages` were written without their features recorded.
  void invalidate(std::span<const PageId> pages, int64_t pos, int64_t n);

  // `kept` replaces `dropped` as a sequence's `index`-th page (Scheduler::set_page_dedup_hook):
  // when `kept` lacks the features (it was written by a sequence that recorded none) and
  // `dropped` has them, they move to `kept` (the same tokens at the same positions).
  void adopt(PageId kept, PageId dropped, int64_t index);

  // Whether `page`, as the `index`-th page of a sequence, holds the features of all its positions.
  bool covers(PageId page, int64_t index) const;
  // Leading pages of `pages` that covers() (the usable prefix of a cache match).
  int32_t covered_prefix(std::span<const PageId> pages) const;

  // The features of positions [0, num_pages * page_size) of `pages`, as [num_layers, T, hidden];
  // every page must be covered.
  std::vector<float> read(std::span<const PageId> pages, int64_t num_pages) const;

  int32_t page_size() const { return page_size_; }
  // Pages with an entry allocated (tests, the memory report).
  int32_t num_allocated() const;

 private:
  struct Entry {
    int64_t first_pos = -1;  // the page's first position when the entry was (re)started
    int32_t valid = 0;       // positions [first_pos, first_pos + valid) hold their features
    std::vector<float> data;  // [num_layers, page_size, hidden]; empty until first written
  };
  Entry* entry(PageId page);

  int32_t num_layers_;
  int32_t hidden_;
  int32_t page_size_;
  std::vector<Entry> entries_;
};

}  // namespace m3

// Radix prefix index over FULL KV pages: maps a token prefix, in whole pages, to the pages that
// already hold its K/V (and indexer keys). Each tree edge is exactly one page of token ids, so a
// match is always page-granular and a cached page is immutable (only a sequence's last, partial
// page is ever written, and partial pages are never indexed).
//
// Ownership: the index holds one pool reference per node. A page whose only holder is the index
// (refcount 1) is evictable; eviction removes least-recently-used leaves first, so a sequence that
// holds a page always holds the whole path above it and that path stays in the tree.
// Not thread-safe: owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kv/page_pool.h"

namespace m3 {

class RadixPrefixIndex {
 public:
  // `pool` must outlive the index. page_size: tokens per page (kPageSize in production).
  RadixPrefixIndex(PagePool* pool, int32_t page_size);
  ~RadixPrefixIndex();
  RadixPrefixIndex(const RadixPrefixIndex&) = delete;
  RadixPrefixIndex& operator=(const RadixPrefixIndex&) = delete;

  int32_t page_size() const { return page_size_; }

  // The pages holding the longest cached prefix of `tokens`, in whole pages, at most max_pages.
  // Marks the matched path as recently used. Takes NO reference: the caller increfs the pages it
  // keeps before anything can evict (i.e. before the next evict()/insert on this index).
  std::vector<PageId> match(std::span<const int32_t> tokens, int32_t max_pages);

  // Indexes full pages: pages[i] holds the K/V of tokens [i*P, (i+1)*P). Requires
  // tokens.size() >= pages.size() * P. Returns, for each page, the canonical page id now in the
  // index for that prefix: pages[i] itself when newly inserted (the index takes one reference) or
  // already present, or the page another sequence inserted first for the same tokens (then the
  // caller may swap its block-table entry to the canonical page and release its duplicate).
  std::vector<PageId> insert(std::span<const int32_t> tokens, std::span<const PageId> pages);

  // Frees up to `num_pages` pages held only by the index, least recently used leaves first.
  // Returns how many pages went back to the pool.
  int32_t evict(int32_t num_pages);

  // Drops every node whose page is held only by the index (as if evict(infinity)).
  void evict_all() { evict(INT32_MAX); }

  int32_t num_nodes() const { return num_nodes_; }
  // Evictable pages right now (held only by the index).
  int32_t num_evictable() const { return pool_->num_cached_only(); }

 private:
  struct Node {
    Node* parent = nullptr;
    PageId page = -1;
    uint64_t last_access = 0;
    std::vector<int32_t> key;  // the page's token ids (empty for the root)
    // Ordered map: deterministic iteration (eviction ties) and no hash to get wrong. Lookup costs
    // O(log children * P) token compares per page, small next to the model step.
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  };

  PagePool* pool_;
  int32_t page_size_;
  uint64_t clock_ = 0;
  int32_t num_nodes_ = 0;
  std::unique_ptr<Node> root_;
};

}  // namespace m3

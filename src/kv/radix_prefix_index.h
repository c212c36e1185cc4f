// Radix prefix index over FULL KV pages: maps a token prefix, in whole pages, to the pages that
// already hold its K/V (and indexer keys). Each tree edge is exactly one page of token ids, so a
// match is always page-granular and a cached page is immutable (only a sequence's last, partial
// page is ever written, and partial pages are never indexed).
//
// Ownership: the index holds one pool reference per device-resident node. A page whose only
// holder is the index (refcount 1) is evictable; eviction takes least-recently-used nodes without
// device children first, so a sequence that holds a page always holds the whole path above it and
// that path stays in the tree.
//
// With HiCache (set_hicache, kv/hicache.h) a node has a device page, a host page, or both:
//   - a node the device evicts keeps its host copy (made then, or earlier by write_through) and
//     stays in the tree as a host-only node; without any host page to be had it is written to the
//     disk tier (if any) and removed with its host-only subtree;
//   - invariant: a host-only node's children are host-only (device-resident nodes form a prefix
//     of every path), so loading back a path is loading its host-only tail in order;
//   - the host tier evicts its least recently used pages that are not pinned: a host-only leaf is
//     written to disk (if any) and removed; a device-resident node only loses its (redundant)
//     host copy. Host pages being loaded back are pinned;
//   - acquire() loads host-only nodes, then pages found on disk by the prefix's chained key, into
//     fresh device pages before returning them.
// Not thread-safe: owned by the scheduler thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/hicache.h"
#include "kv/page_pool.h"

namespace m3 {

// What one acquire() brought back from the lower tiers.
struct HiCacheLoad {
  int32_t host_pages = 0;
  int32_t disk_pages = 0;
};

class RadixPrefixIndex {
 public:
  // `pool` must outlive the index. page_size: tokens per page (kPageSize in production).
  RadixPrefixIndex(PagePool* pool, int32_t page_size);
  ~RadixPrefixIndex();
  RadixPrefixIndex(const RadixPrefixIndex&) = delete;
  RadixPrefixIndex& operator=(const RadixPrefixIndex&) = delete;

  int32_t page_size() const { return page_size_; }

  // Turns the lower tiers on; only while the index is empty. The index owns them from now on.
  void set_hicache(std::unique_ptr<HiCache> hicache);
  HiCache* hicache() { return hicache_.get(); }
  const HiCache* hicache() const { return hicache_.get(); }

  // The device pages holding the longest cached device-resident prefix of `tokens`, in whole
  // pages, at most max_pages. Marks the matched path as recently used. Takes NO reference: the
  // caller increfs the pages it keeps before anything can evict (i.e. before the next
  // evict()/insert on this index).
  std::vector<PageId> match(std::span<const int32_t> tokens, int32_t max_pages);

  // Like match(), but the caller gets one reference on every returned page, and with HiCache the
  // match continues through host-only nodes and then the disk tier: those pages are copied into
  // fresh device pages (evicting others if needed; a load stops early when no device page can be
  // had) and become device-resident nodes. `load` (optional) counts what came from which tier.
  // The copies are enqueued on the copier: the caller waits on it before the pages are read.
  std::vector<PageId> acquire(std::span<const int32_t> tokens, int32_t max_pages,
                              HiCacheLoad* load = nullptr);

  // Indexes full pages: pages[i] holds the K/V of tokens [i*P, (i+1)*P). Requires
  // tokens.size() >= pages.size() * P. Returns, for each page, the canonical page id now in the
  // index for that prefix: pages[i] itself when newly inserted (the index takes one reference) or
  // already present, or the page another sequence inserted first for the same tokens (then the
  // caller may swap its block-table entry to the canonical page and release its duplicate). A
  // host-only node for the same tokens adopts pages[i] as its device page.
  std::vector<PageId> insert(std::span<const int32_t> tokens, std::span<const PageId> pages);

  // Frees up to `num_pages` device pages held only by the index, least recently used first.
  // With HiCache their nodes move to the host tier (see the header comment). Returns how many
  // pages went back to the pool.
  int32_t evict(int32_t num_pages);

  // Evicts every device page held only by the index (as if evict(infinity)).
  void evict_all() { evict(INT32_MAX); }

  int32_t num_nodes() const { return num_nodes_; }
  // Evictable pages right now (held only by the index).
  int32_t num_evictable() const { return pool_->num_cached_only(); }
  // Nodes holding a host page (0 without HiCache).
  int32_t num_host_nodes() const;
  // Walks the tree and checks every invariant against the pools (tests): each node holds a device
  // or a host page; host-only nodes have host-only children; device pages are cached, referenced
  // and distinct; host pages allocated, distinct, unpinned and as many as the host pool has in
  // use. Returns the first violation, or an empty string.
  std::string check_invariants() const;

 private:
  struct Node {
    Node* parent = nullptr;
    PageId page = -1;        // device page, -1 when host-only
    HostPageId host_page = -1;
    uint64_t last_access = 0;
    PageKey hash;            // chained key of the prefix up to this page (HiCache only)
    std::vector<int32_t> key;  // the page's token ids (empty for the root)
    // Ordered map: deterministic iteration (eviction ties) and no hash to get wrong. Lookup costs
    // O(log children * P) token compares per page, small next to the model step.
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  };

  Node* add_child(Node* parent, std::vector<int32_t> key);
  bool has_device_child(const Node* n) const;
  bool device_evictable(const Node* n) const;
  // Drops the node's device page (the pool gets its reference back).
  void release_device(Node* n);
  // A free host page, evicting the least recently used unpinned host pages if needed; -1 if none.
  HostPageId alloc_host();
  int32_t evict_host(int32_t num_pages);
  // write_through: copies a device-resident node to the host tier if it has no copy yet.
  void write_through(Node* n);
  // Writes the node's page to the disk tier (from its host copy, else its device page).
  void spill_to_disk(Node* n);
  // Removes a node whose device page is already released, with its (host-only) subtree, writing
  // each page to disk first when there is a disk tier.
  void drop_subtree(Node* n);
  // A device page for a load: a free one, else one evicted; -1 when none can be had.
  PageId alloc_device_for_load();

  PagePool* pool_;
  int32_t page_size_;
  uint64_t clock_ = 0;
  int32_t num_nodes_ = 0;
  std::unique_ptr<Node> root_;
  std::unique_ptr<HiCache> hicache_;
  std::vector<std::byte> scratch_;  // one page: disk reads and device -> disk writes
};

}  // namespace m3

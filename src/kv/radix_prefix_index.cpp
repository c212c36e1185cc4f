#include "kv/radix_prefix_index.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <queue>
#include <set>
#include <string>
#include <tuple>

#include "core/status.h"

namespace m3 {

RadixPrefixIndex::RadixPrefixIndex(PagePool* pool, int32_t page_size)
    : pool_(pool), page_size_(page_size), root_(std::make_unique<Node>()) {
  M3_CHECK(pool != nullptr, "[kv.radix_prefix_index] null pool");
  M3_CHECK(page_size > 0, "[kv.radix_prefix_index] page_size " + std::to_string(page_size));
}

RadixPrefixIndex::~RadixPrefixIndex() {
  // Return the index's references so the pool's counters stay exact if it outlives the index.
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [k, c] : n->children) stack.push_back(c.get());
    if (n->page >= 0) release_device(n);
    if (n->host_page >= 0) hicache_->host->free(n->host_page);
  }
}

void RadixPrefixIndex::set_hicache(std::unique_ptr<HiCache> hicache) {
  M3_CHECK(num_nodes_ == 0, "[kv.radix_prefix_index.set_hicache] the index is not empty");
  M3_CHECK(hicache && hicache->copier && hicache->host,
           "[kv.radix_prefix_index.set_hicache] incomplete tiers");
  M3_CHECK(hicache->copier->page_bytes() == hicache->host->page_bytes(),
           "[kv.radix_prefix_index.set_hicache] host pages of another size");
  hicache_ = std::move(hicache);
  root_->hash = hicache_->root_key;
  scratch_.resize(static_cast<size_t>(hicache_->host->page_bytes()));
}

RadixPrefixIndex::Node* RadixPrefixIndex::add_child(Node* parent, std::vector<int32_t> key) {
  auto child = std::make_unique<Node>();
  child->parent = parent;
  child->key = key;
  if (hicache_) child->hash = chain_page_key(parent->hash, child->key);
  ++num_nodes_;
  return parent->children.emplace(std::move(key), std::move(child)).first->second.get();
}

bool RadixPrefixIndex::has_device_child(const Node* n) const {
  for (const auto& [k, c] : n->children) {
    if (c->page >= 0) return true;
  }
  return false;
}

bool RadixPrefixIndex::device_evictable(const Node* n) const {
  return n != root_.get() && n->page >= 0 && pool_->refcount(n->page) == 1 &&
         !has_device_child(n);
}

void RadixPrefixIndex::release_device(Node* n) {
  if (hicache_) hicache_->copier->release(n->page);  // a save may still be reading it
  pool_->set_cached(n->page, false);
  pool_->decref(n->page);
  n->page = -1;
}

std::vector<PageId> RadixPrefixIndex::match(std::span<const int32_t> tokens, int32_t max_pages) {
  std::vector<PageId> out;
  const int64_t num_full = static_cast<int64_t>(tokens.size()) / page_size_;
  const int64_t limit = std::min<int64_t>(num_full, std::max(max_pages, 0));
  ++clock_;
  Node* node = root_.get();
  std::vector<int32_t> key(page_size_);
  for (int64_t i = 0; i < limit; ++i) {
    key.assign(tokens.begin() + i * page_size_, tokens.begin() + (i + 1) * page_size_);
    auto it = node->children.find(key);
    if (it == node->children.end() || it->second->page < 0) break;
    node = it->second.get();
    node->last_access = clock_;
    out.push_back(node->page);
  }
  return out;
}

PageId RadixPrefixIndex::alloc_device_for_load() {
  if (pool_->num_free() == 0) evict(1);
  std::vector<PageId> got;
  if (!pool_->alloc(1, &got)) return -1;
  return got[0];
}

std::vector<PageId> RadixPrefixIndex::acquire(std::span<const int32_t> tokens, int32_t max_pages,
                                              HiCacheLoad* load) {
  std::vector<PageId> out;
  const int64_t num_full = static_cast<int64_t>(tokens.size()) / page_size_;
  const int64_t limit = std::min<int64_t>(num_full, std::max(max_pages, 0));
  ++clock_;
  std::vector<Node*> path;
  Node* node = root_.get();
  std::vector<int32_t> key(page_size_);
  for (int64_t i = 0; i < limit; ++i) {
    key.assign(tokens.begin() + i * page_size_, tokens.begin() + (i + 1) * page_size_);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_access = clock_;
    path.push_back(node);
  }
  // The device-resident prefix: referenced first, so no eviction below can take it.
  size_t d = 0;
  for (; d < path.size() && path[d]->page >= 0; ++d) {
    pool_->incref(path[d]->page);
    out.push_back(path[d]->page);
  }
  if (!hicache_) return out;
  HiCache& hc = *hicache_;
  const auto t0 = std::chrono::steady_clock::now();
  int32_t host_pages = 0, disk_pages = 0;
  // The host-only tail, in path order; pinned so that making room on the device (which may
  // evict host pages) cannot take the pages about to be loaded.
  for (size_t i = d; i < path.size(); ++i) hc.host->pin(path[i]->host_page);
  size_t loaded = d;
  for (; loaded < path.size(); ++loaded) {
    Node* n = path[loaded];
    const PageId page = alloc_device_for_load();
    if (page < 0) break;
    Status st = hc.copier->load({{PageCopy{page, hc.host->data(n->host_page)}}});
    if (!st.is_ok()) {
      pool_->decref(page);
      break;
    }
    n->page = page;
    pool_->set_cached(page, true);  // the allocation's reference is the index's
    pool_->incref(page);            // the caller's
    out.push_back(page);
    ++host_pages;
  }
  for (size_t i = d; i < path.size(); ++i) hc.host->unpin(path[i]->host_page);
  // The disk tier continues a path that is now all on the device.
  if (hc.disk && loaded == path.size()) {
    Node* parent = path.empty() ? root_.get() : path.back();
    for (int64_t i = static_cast<int64_t>(path.size()); i < limit; ++i) {
      std::span<const int32_t> page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_),
                                                            static_cast<size_t>(page_size_));
      const PageKey k = chain_page_key(parent->hash, page_tokens);
      if (!hc.disk->contains(k)) break;
      const PageId page = alloc_device_for_load();
      if (page < 0) break;
      // The scratch page may still feed an earlier load.
      if (!hc.copier->wait().is_ok() ||
          !hc.disk->get(k, parent->hash, page_tokens, scratch_.data()) ||
          !hc.copier->load({{PageCopy{page, scratch_.data()}}}).is_ok()) {
        pool_->decref(page);
        break;
      }
      Node* n = add_child(parent, std::vector<int32_t>(page_tokens.begin(), page_tokens.end()));
      n->page = page;
      n->last_access = clock_;
      pool_->set_cached(page, true);
      pool_->incref(page);
      out.push_back(page);
      ++disk_pages;
      write_through(n);
      parent = n;
    }
  }
  if (host_pages + disk_pages > 0) {
    // The load time includes its completion (immediate on the CPU copier).
    (void)hc.copier->wait();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    hc.counters.observe_load(seconds);
    hc.counters.host_hit_tokens += static_cast<uint64_t>(host_pages) * page_size_;
    hc.counters.disk_hit_tokens += static_cast<uint64_t>(disk_pages) * page_size_;
  }
  if (load) {
    load->host_pages += host_pages;
    load->disk_pages += disk_pages;
  }
  return out;
}

std::vector<PageId> RadixPrefixIndex::insert(std::span<const int32_t> tokens,
                                             std::span<const PageId> pages) {
  M3_CHECK(tokens.size() >= pages.size() * static_cast<size_t>(page_size_),
           "[kv.radix_prefix_index.insert] " + std::to_string(pages.size()) + " pages need " +
               std::to_string(pages.size() * page_size_) + " tokens, got " +
               std::to_string(tokens.size()));
  ++clock_;
  std::vector<PageId> canonical;
  canonical.reserve(pages.size());
  Node* node = root_.get();
  for (size_t i = 0; i < pages.size(); ++i) {
    std::vector<int32_t> key(tokens.begin() + i * page_size_, tokens.begin() + (i + 1) * page_size_);
    auto it = node->children.find(key);
    Node* child = it == node->children.end() ? add_child(node, std::move(key)) : it->second.get();
    if (child->page < 0) {
      // New, or host-only: the sequence's page becomes the node's device copy. Every node walked
      // so far is device-resident, so the invariant holds.
      child->page = pages[i];
      pool_->incref(pages[i]);
      pool_->set_cached(pages[i], true);
    }
    node = child;
    node->last_access = clock_;
    write_through(node);
    canonical.push_back(node->page);
  }
  return canonical;
}

void RadixPrefixIndex::write_through(Node* n) {
  if (!hicache_ || hicache_->policy != HiCacheWritePolicy::kWriteThrough || n->host_page >= 0) {
    return;
  }
  const HostPageId h = alloc_host();
  if (h < 0) return;  // the host tier is pinned full; the page is saved on eviction if there is room
  if (!hicache_->copier->save({{PageCopy{n->page, hicache_->host->data(h)}}}).is_ok()) {
    hicache_->host->free(h);
    return;
  }
  n->host_page = h;
  ++hicache_->counters.pages_saved_to_host;
}

int32_t RadixPrefixIndex::evict(int32_t num_pages) {
  if (num_pages <= 0) return 0;
  // Collect candidates on demand rather than keeping an LRU list in sync with every pool refcount
  // change: eviction runs only when an allocation is short, and then costs O(nodes log).
  using Entry = std::tuple<uint64_t, PageId, Node*>;  // (last_access, page) orders ties
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [k, c] : n->children) stack.push_back(c.get());
    if (device_evictable(n)) heap.emplace(n->last_access, n->page, n);
  }
  int32_t freed = 0;
  while (freed < num_pages && !heap.empty()) {
    Node* n = std::get<2>(heap.top());
    heap.pop();
    // Host-tier eviction below never touches device-resident nodes, so n is still a candidate.
    Node* parent = n->parent;
    if (hicache_ && n->host_page < 0) {
      const HostPageId h = alloc_host();
      if (h >= 0) {
        if (hicache_->copier->save({{PageCopy{n->page, hicache_->host->data(h)}}}).is_ok()) {
          n->host_page = h;
          ++hicache_->counters.pages_saved_to_host;
        } else {
          hicache_->host->free(h);
        }
      }
    }
    if (n->host_page >= 0) {
      release_device(n);  // stays in the tree as a host-only node
    } else {
      if (hicache_ && hicache_->disk) spill_to_disk(n);  // no host page to be had
      release_device(n);
      drop_subtree(n);  // destroys n
    }
    ++freed;
    if (device_evictable(parent)) heap.emplace(parent->last_access, parent->page, parent);
  }
  return freed;
}

HostPageId RadixPrefixIndex::alloc_host() {
  HostPageId h = hicache_->host->alloc();
  if (h >= 0) return h;
  evict_host(1);
  return hicache_->host->alloc();
}

int32_t RadixPrefixIndex::evict_host(int32_t num_pages) {
  HostPagePool& host = *hicache_->host;
  // Candidates: host-only leaves (their last copy above the disk) and host copies of
  // device-resident nodes (redundant), least recently used first, never a pinned page.
  auto candidate = [&](const Node* n) {
    if (n == root_.get() || n->host_page < 0 || host.is_pinned(n->host_page)) return false;
    return n->page >= 0 || n->children.empty();
  };
  using Entry = std::tuple<uint64_t, HostPageId, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [k, c] : n->children) stack.push_back(c.get());
    if (candidate(n)) heap.emplace(n->last_access, n->host_page, n);
  }
  int32_t freed = 0;
  while (freed < num_pages && !heap.empty()) {
    Node* n = std::get<2>(heap.top());
    heap.pop();
    ++freed;
    if (n->page >= 0) {
      host.free(n->host_page);
      n->host_page = -1;
      continue;
    }
    Node* parent = n->parent;
    drop_subtree(n);  // a leaf: writes it to disk, frees its host page
    if (candidate(parent) && parent->page < 0) {
      heap.emplace(parent->last_access, parent->host_page, parent);
    }
  }
  return freed;
}

void RadixPrefixIndex::spill_to_disk(Node* n) {
  HiCache& hc = *hicache_;
  if (hc.disk->contains(n->hash)) return;
  const std::byte* bytes = nullptr;
  if (n->host_page >= 0) {
    bytes = hc.host->data(n->host_page);
  } else if (n->page >= 0 &&
             hc.copier->save({{PageCopy{n->page, scratch_.data()}}}).is_ok()) {
    bytes = scratch_.data();
  }
  // The host bytes a save() wrote are complete only after wait().
  if (bytes == nullptr || !hc.copier->wait().is_ok()) return;
  if (hc.disk->put(n->hash, n->parent->hash, n->key, bytes).is_ok()) {
    ++hc.counters.pages_written_to_disk;
  }
}

void RadixPrefixIndex::drop_subtree(Node* n) {
  // Children first (post-order), so every page is written with its parent's key still known.
  while (!n->children.empty()) drop_subtree(n->children.begin()->second.get());
  M3_CHECK(n->page < 0, "[kv.radix_prefix_index] dropping a node that is still on the device");
  const bool had_copy = n->host_page >= 0;
  if (hicache_) {
    if (hicache_->disk && had_copy) spill_to_disk(n);
    if (had_copy) {
      M3_CHECK(!hicache_->host->is_pinned(n->host_page),
               "[kv.radix_prefix_index] dropping a pinned host page");
      hicache_->host->free(n->host_page);
    }
    if (!hicache_->disk) ++hicache_->counters.pages_dropped;
  }
  Node* parent = n->parent;
  --num_nodes_;
  parent->children.erase(parent->children.find(n->key));  // destroys n
}

int32_t RadixPrefixIndex::num_host_nodes() const {
  int32_t count = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [k, c] : n->children) stack.push_back(c.get());
    if (n->host_page >= 0) ++count;
  }
  return count;
}

std::string RadixPrefixIndex::check_invariants() const {
  std::set<PageId> device;
  std::set<HostPageId> host;
  int32_t nodes = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [k, c] : n->children) {
      stack.push_back(c.get());
      if (n != root_.get() && n->page < 0 && c->page >= 0) {
        return "a device-resident node under a host-only node";
      }
    }
    if (n == root_.get()) continue;
    ++nodes;
    const std::string at = "node of page " + std::to_string(n->page) + "/host " +
                           std::to_string(n->host_page);
    if (n->page < 0 && n->host_page < 0) return at + ": holds no page";
    if (n->page >= 0) {
      if (!device.insert(n->page).second) return at + ": device page held twice";
      if (pool_->refcount(n->page) < 1 || !pool_->is_cached(n->page)) {
        return at + ": device page not referenced or not marked cached";
      }
    }
    if (n->host_page >= 0) {
      if (!hicache_) return at + ": host page without HiCache";
      if (!host.insert(n->host_page).second) return at + ": host page held twice";
      if (!hicache_->host->is_allocated(n->host_page)) return at + ": host page not allocated";
      if (hicache_->host->is_pinned(n->host_page)) return at + ": host page left pinned";
    }
  }
  if (nodes != num_nodes_) return "node count " + std::to_string(num_nodes_) + " != " +
                                  std::to_string(nodes) + " nodes in the tree";
  if (hicache_ && static_cast<int32_t>(host.size()) != hicache_->host->num_used()) {
    return "host pool has " + std::to_string(hicache_->host->num_used()) + " pages in use, the " +
           "tree holds " + std::to_string(host.size());
  }
  return "";
}

}  // namespace m3

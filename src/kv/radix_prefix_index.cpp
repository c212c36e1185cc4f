#include "kv/radix_prefix_index.h"

#include <algorithm>
#include <functional>
#include <queue>
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
    if (n->page >= 0) {
      pool_->set_cached(n->page, false);
      pool_->decref(n->page);
    }
  }
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
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_access = clock_;
    out.push_back(node->page);
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
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->parent = node;
      child->page = pages[i];
      child->key = key;
      pool_->incref(pages[i]);
      pool_->set_cached(pages[i], true);
      ++num_nodes_;
      it = node->children.emplace(std::move(key), std::move(child)).first;
    }
    node = it->second.get();
    node->last_access = clock_;
    canonical.push_back(node->page);
  }
  return canonical;
}

int32_t RadixPrefixIndex::evict(int32_t num_pages) {
  if (num_pages <= 0) return 0;
  // Collect evictable leaves on demand rather than keeping an LRU list in sync with every pool
  // refcount change: eviction runs only when an allocation is short, and then costs O(nodes log).
  using Entry = std::tuple<uint64_t, PageId, Node*>;  // (last_access, page) orders ties
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [k, c] : n->children) stack.push_back(c.get());
    if (n != root_.get() && n->children.empty() && pool_->refcount(n->page) == 1) {
      heap.emplace(n->last_access, n->page, n);
    }
  }
  int32_t freed = 0;
  while (freed < num_pages && !heap.empty()) {
    Node* n = std::get<2>(heap.top());
    heap.pop();
    Node* parent = n->parent;
    pool_->set_cached(n->page, false);
    pool_->decref(n->page);
    ++freed;
    --num_nodes_;
    parent->children.erase(parent->children.find(n->key));  // destroys n
    if (parent != root_.get() && parent->children.empty() && pool_->refcount(parent->page) == 1) {
      heap.emplace(parent->last_access, parent->page, parent);
    }
  }
  return freed;
}

}  // namespace m3

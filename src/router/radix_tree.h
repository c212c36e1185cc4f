// The cache-aware policy's picture of one worker's prefix cache: an approximate radix tree over
// the text of the requests sent to that worker. "Approximate" because it records what was sent,
// not what the worker really kept (the worker may have evicted it, or tokenised it differently);
// it is only a routing hint, so it works on request text and never needs the tokenizer.
//
// Edges hold byte strings (UTF-8 text; a match may end inside a multi-byte character, which only
// shifts the match rate by a byte). Every node carries a logical access time; eviction removes
// least recently used leaves until the tree holds at most a given number of bytes, so a parent
// is only removed once all its children are gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace m3::router {

class ApproxRadixTree {
 public:
  ApproxRadixTree();
  ~ApproxRadixTree();
  ApproxRadixTree(const ApproxRadixTree&) = delete;
  ApproxRadixTree& operator=(const ApproxRadixTree&) = delete;

  // Length in bytes of the longest prefix of `text` present in the tree. With `touch`, refreshes
  // the access time of the matched path (a hit keeps its prefix alive); a policy that only
  // compares workers passes false, so a worker not chosen does not keep the prefix for nothing.
  size_t match(std::string_view text, bool touch = true);
  // Adds `text` (shares existing prefixes, splits an edge where it diverges).
  void insert(std::string_view text);
  // Removes least recently used leaves until at most `max_bytes` bytes remain. Returns the
  // number of bytes removed.
  size_t evict_to(size_t max_bytes);

  size_t size_bytes() const { return bytes_; }  // sum of the edge lengths
  size_t node_count() const { return nodes_; }  // the root not counted

  // For tests: every non-root node has a non-empty edge, a parent that points back to it, no two
  // children with the same first byte, and the byte/node counts are right.
  bool check_invariants() const;

 private:
  struct Node;
  Node* find_child(Node* node, unsigned char first) const;

  std::unique_ptr<Node> root_;
  size_t bytes_ = 0;
  size_t nodes_ = 0;
  uint64_t clock_ = 0;  // logical time, advanced by every match and insert
};

}  // namespace m3::router

#include "router/radix_tree.h"

#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace m3::router {

struct ApproxRadixTree::Node {
  std::string edge;  // the bytes on the edge from the parent to this node
  Node* parent = nullptr;
  uint64_t last_access = 0;
  std::map<unsigned char, std::unique_ptr<Node>> children;  // keyed by the edge's first byte
};

ApproxRadixTree::ApproxRadixTree() : root_(std::make_unique<Node>()) {}
ApproxRadixTree::~ApproxRadixTree() {
  // Destroy iteratively: a long chain of single-child nodes would otherwise recurse deeply.
  std::vector<std::unique_ptr<Node>> stack;
  stack.push_back(std::move(root_));
  while (!stack.empty()) {
    std::unique_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    for (auto& [first, child] : n->children) stack.push_back(std::move(child));
  }
}

ApproxRadixTree::Node* ApproxRadixTree::find_child(Node* node, unsigned char first) const {
  auto it = node->children.find(first);
  return it == node->children.end() ? nullptr : it->second.get();
}

namespace {
size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}
}  // namespace

size_t ApproxRadixTree::match(std::string_view text, bool touch) {
  const uint64_t now = touch ? ++clock_ : 0;
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < text.size()) {
    Node* child = find_child(node, static_cast<unsigned char>(text[pos]));
    if (child == nullptr) break;
    const size_t n = common_prefix(child->edge, text.substr(pos));
    if (touch) child->last_access = now;
    pos += n;
    if (n < child->edge.size()) break;
    node = child;
  }
  return pos;
}

void ApproxRadixTree::insert(std::string_view text) {
  const uint64_t now = ++clock_;
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < text.size()) {
    const unsigned char first = static_cast<unsigned char>(text[pos]);
    Node* child = find_child(node, first);
    if (child == nullptr) {
      auto leaf = std::make_unique<Node>();
      leaf->edge = std::string(text.substr(pos));
      leaf->parent = node;
      leaf->last_access = now;
      bytes_ += leaf->edge.size();
      ++nodes_;
      node->children.emplace(first, std::move(leaf));
      return;
    }
    const size_t n = common_prefix(child->edge, text.substr(pos));
    child->last_access = now;
    if (n < child->edge.size()) {
      // Split: a new middle node holds the shared part, the old child keeps the rest.
      auto middle = std::make_unique<Node>();
      middle->edge = child->edge.substr(0, n);
      middle->parent = node;
      middle->last_access = now;
      std::unique_ptr<Node> old = std::move(node->children[first]);
      old->edge.erase(0, n);
      old->parent = middle.get();
      const unsigned char old_first = static_cast<unsigned char>(old->edge[0]);
      middle->children.emplace(old_first, std::move(old));
      Node* mid = middle.get();
      node->children[first] = std::move(middle);
      ++nodes_;  // the edge bytes are only redistributed
      child = mid;
    }
    pos += n;
    node = child;
  }
}

size_t ApproxRadixTree::evict_to(size_t max_bytes) {
  if (bytes_ <= max_bytes) return 0;
  using Entry = std::pair<uint64_t, Node*>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> leaves;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && n->children.empty()) leaves.emplace(n->last_access, n);
    for (auto& [first, child] : n->children) stack.push_back(child.get());
  }
  size_t removed = 0;
  while (bytes_ > max_bytes && !leaves.empty()) {
    Node* leaf = leaves.top().second;
    leaves.pop();
    Node* parent = leaf->parent;
    bytes_ -= leaf->edge.size();
    removed += leaf->edge.size();
    --nodes_;
    parent->children.erase(static_cast<unsigned char>(leaf->edge[0]));  // frees `leaf`
    // A parent left without children is now a leaf; its access time is at least its last
    // child's (every descent stamps the whole path), so LRU order holds.
    if (parent != root_.get() && parent->children.empty()) {
      leaves.emplace(parent->last_access, parent);
    }
  }
  return removed;
}

bool ApproxRadixTree::check_invariants() const {
  size_t bytes = 0, nodes = 0;
  std::vector<const Node*> stack{root_.get()};
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& [first, child] : n->children) {
      if (child->edge.empty() || static_cast<unsigned char>(child->edge[0]) != first ||
          child->parent != n) {
        return false;
      }
      bytes += child->edge.size();
      ++nodes;
      stack.push_back(child.get());
    }
  }
  return bytes == bytes_ && nodes == nodes_;
}

}  // namespace m3::router

#include "app/startup_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "app/memory_plan.h"
#include "loader/checkpoint.h"

namespace m3::app {

namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The role of a text-model weight by its checkpoint name; empty for what the summary leaves out.
std::string role_of(const std::string& name) {
  if (contains(name, "vision") || contains(name, "visual") || contains(name, "projector") ||
      contains(name, "dspark")) {
    return "";
  }
  if (contains(name, ".experts.") && !contains(name, "shared_experts")) return "routed experts";
  if (contains(name, "embed_tokens") || contains(name, "lm_head")) return "embeddings and head";
  const bool linear = contains(name, "_proj.") || contains(name, ".w1.") || contains(name, ".w2.") ||
                      contains(name, ".w3.");
  return linear ? "dense linears" : "";
}

}  // namespace

std::string weight_formats_summary(const WeightSource& weights) {
  // Roles in a fixed order; the formats of each, in name order.
  const char* order[] = {"dense linears", "routed experts", "embeddings and head"};
  std::map<std::string, std::set<std::string>> formats;
  for (const std::string& name : weights.names()) {
    const std::string role = role_of(name);
    if (role.empty()) continue;
    auto f = weights.format(name);
    if (f.is_ok()) formats[role].insert(weight_format_name(*f));
  }
  std::string out;
  for (const char* role : order) {
    auto it = formats.find(role);
    if (it == formats.end()) continue;
    std::string names;
    for (const std::string& f : it->second) names += (names.empty() ? "" : "/") + f;
    out += (out.empty() ? "" : ", ") + names + " " + role;
  }
  return out.empty() ? "no text-model linears found" : out;
}

std::string weights_read_summary(int first_rank, const std::vector<uint64_t>& bytes_per_rank,
                                 uint64_t stored_bytes) {
  std::string out = "checkpoint read: ";
  for (size_t i = 0; i < bytes_per_rank.size(); ++i) {
    const int64_t b = static_cast<int64_t>(bytes_per_rank[i]);
    out += (i ? ", " : "") + format_bytes(b) + " by rank " +
           std::to_string(first_rank + static_cast<int>(i)) + " (" + std::to_string(b) +
           " bytes)";
  }
  return out + " of " + format_bytes(static_cast<int64_t>(stored_bytes)) + " stored";
}

std::string kv_pool_summary(KvCacheDtype dtype, int64_t bytes_per_page, int32_t page_size,
                            int64_t max_tokens) {
  // bytes_per_page / page_size has at most log2(page_size) fractional binary digits; 3 decimals
  // show every page size up to 128 exactly, trailing zeros dropped.
  char per_token[64];
  std::snprintf(per_token, sizeof per_token, "%.3f",
                static_cast<double>(bytes_per_page) / std::max<int32_t>(1, page_size));
  std::string t = per_token;
  while (!t.empty() && t.back() == '0') t.pop_back();
  if (!t.empty() && t.back() == '.') t.pop_back();
  return std::string("kv dtype ") + kv_cache_dtype_name(dtype) + " (" + t + " bytes per token), " +
         std::to_string(max_tokens) + " tokens fit";
}

uint64_t checkpoint_stored_bytes(const WeightSource& weights) {
  const auto* ck = dynamic_cast<const Checkpoint*>(&weights);
  if (ck == nullptr) return 0;
  uint64_t total = 0;
  for (const std::string& n : ck->store().names()) {
    auto t = ck->raw(n);
    if (t.is_ok()) total += t->nbytes;
  }
  return total;
}

}  // namespace m3::app

// `m3serve router`'s command line, with SGLang router's flag names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3::router {

enum class PolicyKind { kCacheAware, kRoundRobin, kRandom, kPowerOfTwo };

struct RouterFlags {
  std::vector<std::string> worker_urls;  // http://host:port each
  PolicyKind policy = PolicyKind::kCacheAware;
  double cache_threshold = 0.5;
  int64_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.0001;
  double eviction_interval_s = 60;
  int64_t max_tree_size = 1 << 24;  // bytes of request text per worker
  double health_check_interval_s = 10;
  double health_check_timeout_s = 5;
  int max_attempts = 3;  // attempts per request (a retry only before the first response byte)
  double request_timeout_s = 0;  // 0: none
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  uint64_t seed = 0;  // random / power_of_two; 0: from the clock
  bool help = false;
};

const char* policy_name(PolicyKind kind);

// Parses the arguments after `router`; an error names the flag and the value.
Result<RouterFlags> parse_router_flags(const std::vector<std::string>& args);

extern const char* const kRouterUsage;

}  // namespace m3::router

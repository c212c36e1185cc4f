// The KV pool request from the composition root to the real-shape CUDA runner's factory.
#pragma once

#include <cstdint>
#include <functional>

#include "core/status.h"

namespace m3::app {

// A device's memory after the weights were loaded and a profile step ran (bytes): all of it, the
// weights, everything else in use (the working memory the KV pool must leave room for), and what
// was free (the most the pool can have, whatever the fraction asks).
struct MeasuredMemory {
  int64_t total_bytes = 0, weight_bytes = 0, working_bytes = 0, free_bytes = 0;
};

// How the real-shape CUDA runner sizes its KV pool: `kv_cache_bytes` > 0 exactly; else it loads
// the weights, runs a profile step of `profile_tokens` tokens, and makes a pool of
// plan_pool_bytes(what it measured) bytes (CudaM3Options::kv_pages_after_profile).
struct CudaKvPoolRequest {
  int64_t kv_cache_bytes = 0;
  int64_t profile_tokens = 0;
  std::function<Result<int64_t>(const MeasuredMemory&)> plan_pool_bytes;
};

}  // namespace m3::app

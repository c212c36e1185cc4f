// Inter-token latency of decode streams split by what ran beside them (--dataset mixed): each gap
// between two of a stream's chunks is "loaded" when it overlaps the time any arriving prompt was
// in flight (sent, not yet finished: queued, prefilling or generating), else "idle". The ratio of
// the two p99s is how much long prompts arriving stall the running streams; a scheduler that
// keeps decode rows in every step beside a bounded prefill chunk keeps it near 1.
#pragma once

#include <vector>

#include "bench/stats.h"

namespace m3::bench {

struct MixedItl {
  Summary idle_ms, loaded_ms;  // ITL gaps of the streams, in milliseconds
  double p99_ratio = 0;        // loaded p99 / idle p99; 0 when either side has no gap
};

// `results` in workload order; results[i] for i < streams are the streams. Failed requests are
// left out on both sides.
MixedItl split_itl_by_load(const std::vector<RequestResult>& results, size_t streams);

}  // namespace m3::bench

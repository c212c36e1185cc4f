// The benchmark's report: a table like sglang.bench_serving's and the same numbers as JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/mixed_itl.h"
#include "bench/spec_metrics.h"
#include "bench/stats.h"

namespace m3::bench {

// What the run was, printed above the numbers and stored in the JSON.
struct RunDescription {
  std::string backend;
  std::string base_url;
  std::string model;
  std::string dataset;
  double request_rate = 0;  // inf allowed
  int max_concurrency = 0;  // 0: not set
  int num_prompts = 0;
  int random_input_len = 0;
  int random_output_len = 0;
  double random_range_ratio = 0;
  unsigned long long seed = 0;
  int warmup_requests = 0;
  int mixed_streams = 0;  // --dataset mixed: the streams (then `mixed` is filled in)
  MixedItl mixed;
  SpecSummary spec;  // from the server's /metrics around the run; absent without a draft
};

std::string format_table(const RunDescription& run, const Aggregate& a);

// Flat keys as sglang writes them (completed, duration, mean_ttft_ms, p99_itl_ms, ...), plus
// failed and the first errors (status and message) so a failing run explains itself. With
// `details`, per-request arrays in workload order too: input_lens, output_lens, ttfts (s),
// itls (s, one array per request), request_errors ("" for a success), as sglang's
// --output-details.
nlohmann::ordered_json to_json(const RunDescription& run, const Aggregate& a,
                               const std::vector<RequestResult>& results, bool details = false);

}  // namespace m3::bench

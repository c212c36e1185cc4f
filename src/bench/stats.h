// Latency statistics and the aggregate results of a benchmark run, defined like
// sglang.bench_serving so numbers are comparable across servers:
//   TTFT  = time from sending the request to the first chunk with generated text;
//   ITL   = time between consecutive chunks with text (every gap of every request);
//   TPOT  = (E2E - TTFT) / (output_tokens - 1), per request with more than one output token;
//   E2E   = time from sending the request to the end of its stream.
// Percentiles interpolate linearly between order statistics (numpy's default).
#pragma once

#include <string>
#include <vector>

namespace m3::bench {

// The p-th percentile (0 <= p <= 100) of `values` with linear interpolation between the closest
// ranks: rank = p/100 * (n-1). Returns 0 for an empty input (no samples to report).
double percentile(std::vector<double> values, double p);

struct Summary {
  size_t count = 0;
  double mean = 0, median = 0, std = 0, p90 = 0, p95 = 0, p99 = 0, min = 0, max = 0;
};
// Summary of `values` (std is the population standard deviation, as numpy's default).
Summary summarize(const std::vector<double>& values);

// One request's outcome. Times are seconds.
struct RequestResult {
  bool success = false;
  int http_status = 0;    // 0 when no HTTP response came (connection refused, reset)
  std::string error;      // why it failed; empty on success
  int prompt_tokens = 0;  // reported by the server's usage, else the planned length
  int output_tokens = 0;  // reported by the server's usage, else the number of text chunks
  int cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens; -1 when not reported
  std::string output_text;  // the generated text (multi-turn: the next turn's history)
  double start_s = 0;     // send time, relative to the benchmark start
  double ttft_s = 0;
  double latency_s = 0;  // E2E
  std::vector<double> itl_s;
};

struct Aggregate {
  int completed = 0;
  int failed = 0;
  long long total_input_tokens = 0;   // successful requests only
  long long total_output_tokens = 0;  // successful requests only
  // Prompt tokens the server served from its prefix cache (successful requests that report
  // cached_tokens), and the prompt tokens of those requests; hit rate = cached / prompt.
  long long total_cached_tokens = 0;
  long long cache_reported_input_tokens = 0;
  bool cache_reported = false;
  double prefix_hit_rate = 0;
  double duration_s = 0;
  double request_throughput = 0;  // completed / duration
  double input_throughput = 0;    // tokens/s
  double output_throughput = 0;
  double total_throughput = 0;
  double concurrency = 0;  // sum of E2E latencies / duration: the mean number in flight
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// Aggregates the successful requests of a run that took `duration_s` seconds.
Aggregate aggregate(const std::vector<RequestResult>& results, double duration_s);

}  // namespace m3::bench

#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace m3::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  p = std::clamp(p, 0.0, 100.0);
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Summary summarize(const std::vector<double>& values) {
  Summary s;
  s.count = values.size();
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.std = std::sqrt(sq / static_cast<double>(values.size()));
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p95 = percentile(values, 95);
  s.p99 = percentile(values, 99);
  const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
  s.min = *mn;
  s.max = *mx;
  return s;
}

Aggregate aggregate(const std::vector<RequestResult>& results, double duration_s) {
  Aggregate a;
  a.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  double latency_sum = 0;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++a.failed;
      continue;
    }
    ++a.completed;
    a.total_input_tokens += r.prompt_tokens;
    a.total_output_tokens += r.output_tokens;
    if (r.cached_tokens >= 0) {
      a.cache_reported = true;
      a.total_cached_tokens += r.cached_tokens;
      a.cache_reported_input_tokens += r.prompt_tokens;
    }
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.latency_s * 1e3);
    latency_sum += r.latency_s;
    if (r.output_tokens > 1) {
      tpot.push_back((r.latency_s - r.ttft_s) / (r.output_tokens - 1) * 1e3);
    }
    for (double g : r.itl_s) itl.push_back(g * 1e3);
  }
  if (duration_s > 0) {
    a.request_throughput = a.completed / duration_s;
    a.input_throughput = static_cast<double>(a.total_input_tokens) / duration_s;
    a.output_throughput = static_cast<double>(a.total_output_tokens) / duration_s;
    a.total_throughput = a.input_throughput + a.output_throughput;
    a.concurrency = latency_sum / duration_s;
  }
  if (a.cache_reported_input_tokens > 0) {
    a.prefix_hit_rate = static_cast<double>(a.total_cached_tokens) /
                        static_cast<double>(a.cache_reported_input_tokens);
  }
  a.ttft_ms = summarize(ttft);
  a.tpot_ms = summarize(tpot);
  a.itl_ms = summarize(itl);
  a.e2e_ms = summarize(e2e);
  return a;
}

}  // namespace m3::bench

#include "bench/mixed_itl.h"

#include <algorithm>
#include <utility>

namespace m3::bench {

MixedItl split_itl_by_load(const std::vector<RequestResult>& results, size_t streams) {
  // The arriving prompts' in-flight intervals, merged, sorted by start.
  std::vector<std::pair<double, double>> busy;
  for (size_t i = streams; i < results.size(); ++i) {
    const RequestResult& r = results[i];
    if (!r.success) continue;
    busy.push_back({r.start_s, r.start_s + r.latency_s});
  }
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<double, double>> merged;
  for (const auto& b : busy) {
    if (!merged.empty() && b.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, b.second);
    } else {
      merged.push_back(b);
    }
  }
  // A gap (a, b] is loaded when some merged interval [s, e] has s < b and e > a.
  auto overlaps = [&](double a, double b) {
    auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(b, b));
    // Intervals starting before b are those before `it`; they are disjoint and sorted, so the
    // one with the latest end is the last of them.
    if (it == merged.begin()) return false;
    return std::prev(it)->second > a;
  };
  std::vector<double> idle, loaded;
  for (size_t i = 0; i < std::min(streams, results.size()); ++i) {
    const RequestResult& r = results[i];
    if (!r.success) continue;
    double t = r.start_s + r.ttft_s;
    for (double gap : r.itl_s) {
      const double a = t, b = t + gap;
      (overlaps(a, b) ? loaded : idle).push_back(gap * 1000.0);
      t = b;
    }
  }
  MixedItl out;
  out.idle_ms = summarize(idle);
  out.loaded_ms = summarize(loaded);
  if (!idle.empty() && !loaded.empty() && out.idle_ms.p99 > 0) {
    out.p99_ratio = out.loaded_ms.p99 / out.idle_ms.p99;
  }
  return out;
}

}  // namespace m3::bench

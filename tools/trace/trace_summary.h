// The pure half of the CUPTI kernel tracer (tools/trace/cuda_trace_inject.cpp): GPU activity
// records, their CSV, and the summary of the last N kernels (offset, duration, gap, per-name
// totals). No CUDA or CUPTI header here, so that a plain unit test can check the arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace m3::trace {

enum class Kind : uint8_t { kKernel, kMemcpy, kMemset };

inline const char* kind_name(Kind k) {
  return k == Kind::kKernel ? "kernel" : k == Kind::kMemcpy ? "memcpy" : "memset";
}

// One GPU activity, in CUPTI's terms (timestamps in ns on CUPTI's clock; graph ids 0 when the
// work was not launched from a CUDA graph).
struct Record {
  Kind kind = Kind::kKernel;
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, context = 0, stream = 0, correlation = 0, graph_id = 0;
  uint64_t graph_node_id = 0;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
  uint64_t bytes = 0;  // memcpy / memset only
};

// CUPTI should never report end < start; if it does, the row shows 0 rather than 584 years.
inline uint64_t duration_ns(const Record& r) {
  return r.end_ns > r.start_ns ? r.end_ns - r.start_ns : 0;
}

// Start order; ties by end, then by correlation id, so that the output is deterministic.
inline void sort_by_start(std::vector<Record>& r) {
  std::sort(r.begin(), r.end(), [](const Record& a, const Record& b) {
    return std::tie(a.start_ns, a.end_ns, a.correlation) <
           std::tie(b.start_ns, b.end_ns, b.correlation);
  });
}

// Names of templated kernels hold commas and may hold quotes: RFC 4180 quoting.
inline std::string csv_quote(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

inline void write_csv(std::FILE* f, const std::vector<Record>& recs) {
  std::fprintf(f,
               "kind,name,start_ns,end_ns,duration_ns,device,context,stream,correlation,graph_id,"
               "graph_node_id,grid_x,grid_y,grid_z,block_x,block_y,block_z,bytes\n");
  for (const Record& r : recs)
    std::fprintf(f, "%s,%s,%llu,%llu,%llu,%u,%u,%u,%u,%u,%llu,%d,%d,%d,%d,%d,%d,%llu\n",
                 kind_name(r.kind), csv_quote(r.name).c_str(), (unsigned long long)r.start_ns,
                 (unsigned long long)r.end_ns, (unsigned long long)duration_ns(r), r.device,
                 r.context, r.stream, r.correlation, r.graph_id,
                 (unsigned long long)r.graph_node_id, r.grid[0], r.grid[1], r.grid[2], r.block[0],
                 r.block[1], r.block[2], (unsigned long long)r.bytes);
}

struct Row {
  size_t index;      // into the sorted records
  double offset_us;  // start - the window's first start
  double duration_us;
  double gap_us;  // start - the latest end of any earlier row (any stream); < 0: overlap
};

struct NameStat {
  std::string name;
  int64_t count = 0;
  double total_us = 0;
};

struct Summary {
  std::vector<Row> rows;        // the window in start order: from the N-th last kernel to the end,
                                // copies and memsets in between included (they take GPU time too)
  std::vector<NameStat> names;  // the window's kernels by name, largest total first
  size_t kernels = 0;           // kernel rows in the window
  size_t graph_kernels = 0;     // of which launched from a CUDA graph (graph_id != 0)
  double span_us = 0;           // first start to last end of the window
  double kernel_us = 0;         // summed kernel durations (concurrent kernels counted twice)
  double copy_us = 0;           // summed memcpy + memset durations
  double gap_us = 0;            // summed positive gaps: time in the span with nothing running
};

// The gap is measured from the latest end so far rather than from the previous row alone: with
// two streams a short kernel can end before a long one that started earlier, and then the
// previous row's end would report idle time while the GPU is still busy. This way the positive
// gaps add up to exactly the idle time of the span.
inline Summary summarize(const std::vector<Record>& sorted, size_t last_kernels) {
  Summary s;
  if (last_kernels == 0) return s;
  size_t first = sorted.size(), seen = 0;
  for (size_t i = sorted.size(); i-- > 0 && seen < last_kernels;)
    if (sorted[i].kind == Kind::kKernel) first = i, ++seen;
  if (first == sorted.size()) return s;
  const uint64_t t0 = sorted[first].start_ns;
  uint64_t latest_end = sorted[first].end_ns;
  std::map<std::string, NameStat> by_name;
  for (size_t i = first; i < sorted.size(); ++i) {
    const Record& r = sorted[i];
    const double dur = duration_ns(r) * 1e-3;
    const double gap = i == first ? 0.0 : (double(r.start_ns) - double(latest_end)) * 1e-3;
    s.rows.push_back({i, (r.start_ns - t0) * 1e-3, dur, gap});
    if (gap > 0) s.gap_us += gap;
    latest_end = std::max(latest_end, r.end_ns);
    if (r.kind == Kind::kKernel) {
      ++s.kernels;
      s.graph_kernels += r.graph_id != 0;
      s.kernel_us += dur;
      NameStat& n = by_name[r.name];
      n.name = r.name;
      ++n.count;
      n.total_us += dur;
    } else {
      s.copy_us += dur;
    }
  }
  s.span_us = (std::max(latest_end, t0) - t0) * 1e-3;
  for (auto& [name, stat] : by_name) s.names.push_back(stat);
  std::stable_sort(s.names.begin(), s.names.end(),
                   [](const NameStat& a, const NameStat& b) { return a.total_us > b.total_us; });
  return s;
}

inline void print_summary(std::FILE* f, const std::vector<Record>& sorted, const Summary& s) {
  std::fprintf(
      f,
      "cuda_trace: last %zu kernels in start order (%zu from CUDA graphs), with the "
      "copies/memsets among them; gap = start - latest end so far, any stream (< 0: overlap)\n",
      s.kernels, s.graph_kernels);
  std::fprintf(f, "%10s %9s %9s %6s %6s  %s\n", "offset_us", "dur_us", "gap_us", "stream", "kind",
               "name");
  for (const Row& row : s.rows) {
    const Record& r = sorted[row.index];
    std::fprintf(f, "%10.3f %9.3f %9.3f %6u %6s  %s\n", row.offset_us, row.duration_us, row.gap_us,
                 r.stream, kind_name(r.kind), r.name.c_str());
  }
  std::fprintf(f, "cuda_trace: per kernel name over the window\n%6s %10s %9s  %s\n", "count",
               "total_us", "mean_us", "name");
  for (const NameStat& n : s.names)
    std::fprintf(f, "%6lld %10.3f %9.3f  %s\n", (long long)n.count, n.total_us,
                 n.total_us / n.count, n.name.c_str());
  std::fprintf(
      f,
      "cuda_trace: window span %.3f us, kernel time %.3f us (sum), copy/memset time %.3f us, "
      "idle (positive gaps) %.3f us\n",
      s.span_us, s.kernel_us, s.copy_us, s.gap_us);
}

}  // namespace m3::trace

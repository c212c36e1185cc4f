// The CUPTI tracer's summary (tools/trace/trace_summary.h) on hand-made timelines: which records
// form the window, gaps measured from the latest end on any stream (overlap negative, idle time
// summed exactly once), per-name totals, and CSV quoting of templated kernel names.
// Registered from tools/trace/CMakeLists.txt (tests/CMakeLists.txt lists its layers by name).
#include "trace_summary.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace m3::trace {
namespace {

Record rec(Kind kind, const char* name, uint64_t start_us, uint64_t end_us, uint32_t stream,
           uint32_t graph = 7) {
  Record r;
  r.kind = kind;
  r.name = name;
  r.start_ns = start_us * 1000;
  r.end_ns = end_us * 1000;
  r.stream = stream;
  r.graph_id = graph;
  return r;
}

// K1 [0,10] s1, copy [12,14] s1, K2 [15,25] s1, K3 [20,22] s2 (inside K2), K4 [40,45] s1 (not
// from a graph), given out of order as CUPTI may deliver them.
std::vector<Record> timeline() {
  std::vector<Record> r = {rec(Kind::kKernel, "b", 20, 22, 2),
                           rec(Kind::kKernel, "c", 40, 45, 1, 0), rec(Kind::kKernel, "a", 0, 10, 1),
                           rec(Kind::kMemcpy, "memcpy HtoD", 12, 14, 1),
                           rec(Kind::kKernel, "a", 15, 25, 1)};
  sort_by_start(r);
  return r;
}

TEST(TraceSummary, SortsByStart) {
  const auto r = timeline();
  for (size_t i = 1; i < r.size(); ++i) EXPECT_LE(r[i - 1].start_ns, r[i].start_ns);
  EXPECT_EQ(r.front().start_ns, 0u);
}

TEST(TraceSummary, LastKernelsWindowWithOverlapAndIdle) {
  const auto r = timeline();
  const Summary s = summarize(r, 3);  // K2, K3, K4: the copy before K2 is outside
  ASSERT_EQ(s.rows.size(), 3u);
  EXPECT_EQ(s.kernels, 3u);
  EXPECT_EQ(s.graph_kernels, 2u);
  EXPECT_DOUBLE_EQ(s.rows[0].offset_us, 0);
  EXPECT_DOUBLE_EQ(s.rows[0].gap_us, 0);
  EXPECT_DOUBLE_EQ(s.rows[1].offset_us, 5);
  EXPECT_DOUBLE_EQ(s.rows[1].gap_us, -5);  // K3 starts 5 us before K2 ends
  EXPECT_DOUBLE_EQ(s.rows[1].duration_us, 2);
  // K4: from K2's end (25), not K3's (22), since K2 ran longer.
  EXPECT_DOUBLE_EQ(s.rows[2].gap_us, 15);
  EXPECT_DOUBLE_EQ(s.span_us, 30);
  EXPECT_DOUBLE_EQ(s.kernel_us, 17);
  EXPECT_DOUBLE_EQ(s.copy_us, 0);
  EXPECT_DOUBLE_EQ(s.gap_us, 15);
  ASSERT_EQ(s.names.size(), 3u);  // a: 10 us, c: 5 us, b: 2 us
  EXPECT_EQ(s.names[0].name, "a");
  EXPECT_EQ(s.names[0].count, 1);
  EXPECT_EQ(s.names[1].name, "c");
  EXPECT_EQ(s.names[2].name, "b");
}

TEST(TraceSummary, WindowLargerThanTraceTakesAllFromFirstKernel) {
  const auto r = timeline();
  const Summary s = summarize(r, 150);
  ASSERT_EQ(s.rows.size(), 5u);  // the copy between kernels is listed
  EXPECT_EQ(s.kernels, 4u);
  // gaps: 0, copy 2, K2 1, K3 -5, K4 15 -> idle 18 = span 45 - busy union 27
  EXPECT_DOUBLE_EQ(s.rows[1].gap_us, 2);
  EXPECT_DOUBLE_EQ(s.rows[2].gap_us, 1);
  EXPECT_DOUBLE_EQ(s.gap_us, 18);
  EXPECT_DOUBLE_EQ(s.span_us, 45);
  EXPECT_DOUBLE_EQ(s.copy_us, 2);
  EXPECT_DOUBLE_EQ(s.kernel_us, 27);
  ASSERT_EQ(s.names.size(), 3u);
  EXPECT_EQ(s.names[0].name, "a");
  EXPECT_EQ(s.names[0].count, 2);
  EXPECT_DOUBLE_EQ(s.names[0].total_us, 20);
}

TEST(TraceSummary, EmptyWindows) {
  EXPECT_TRUE(summarize(timeline(), 0).rows.empty());
  EXPECT_TRUE(summarize({}, 150).rows.empty());
  const std::vector<Record> copies = {rec(Kind::kMemcpy, "memcpy DtoH", 1, 2, 1)};
  EXPECT_TRUE(summarize(copies, 150).rows.empty());
  // Printing an empty summary must not fail either.
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  print_summary(f, copies, summarize(copies, 150));
  std::fclose(f);
}

TEST(TraceSummary, CsvQuotesNamesAndClampsBadDurations) {
  Record r = rec(Kind::kKernel, "gemv<5, \"x\">", 3, 2, 4);  // end < start
  r.grid[0] = 132;
  r.block[0] = 256;
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  write_csv(f, {r});
  std::rewind(f);
  std::string text;
  for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
  std::fclose(f);
  const std::string row = text.substr(text.find('\n') + 1);
  EXPECT_EQ(row, "kernel,\"gemv<5, \"\"x\"\">\",3000,2000,0,0,0,4,0,7,0,132,0,0,256,0,0,0\n");
}

}  // namespace
}  // namespace m3::trace

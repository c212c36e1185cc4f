// `m3serve bench`: the serving benchmark's command line (like `python -m sglang.bench_serving`).
#pragma once

#include <string>
#include <vector>

#include "bench/runner.h"
#include "bench/workload.h"
#include "core/status.h"

namespace m3::bench {

struct BenchFlags {
  RunOptions run;
  WorkloadOptions workload;
  std::string base_url;         // as given, or built from --host/--port
  std::string output_file;      // JSON result; empty: none
  bool json_stdout = false;     // --json: the JSON on stdout instead of the table
  bool output_details = false;  // per-request arrays in the JSON
  int warmup_requests = 1;      // untimed requests before the run, as sglang's initial test run
  bool help = false;
};

// Parses the arguments after `bench`; errors name the flag.
Result<BenchFlags> parse_bench_flags(const std::vector<std::string>& args);

// Exit code: 0 when every request succeeded, 1 when any failed or the run could not start, 2 for
// bad flags.
int run_bench_command(const std::vector<std::string>& args);

}  // namespace m3::bench

// `m3serve bench`: the serving benchmark (src/bench), a client of any OpenAI-compatible server.
#include "bench/bench_command.h"

#include "cli/commands.h"

namespace m3::cli {

int cmd_bench(const std::vector<std::string>& args) {
  return m3::bench::run_bench_command(args);
}

}  // namespace m3::cli

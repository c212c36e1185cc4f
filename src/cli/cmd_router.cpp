// `m3serve router`: the cache-aware router over several workers (src/router).
#include "cli/commands.h"
#include "router/router_command.h"

namespace m3::cli {

int cmd_router(const std::vector<std::string>& args) {
  return m3::router::run_router_command(args);
}

}  // namespace m3::cli

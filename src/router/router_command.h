// `m3serve router`: parses the flags, starts the router, serves until SIGTERM/SIGINT.
#pragma once

#include <string>
#include <vector>

namespace m3::router {

// Exit code: 0 after a signal, 1 when the router cannot start, 2 for bad flags.
int run_router_command(const std::vector<std::string>& args);

}  // namespace m3::router

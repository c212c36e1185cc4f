// `m3serve serve`: the OpenAI-compatible HTTP server (src/server/serve_command.h).
#include "cli/commands.h"
#include "server/serve_command.h"

namespace m3::cli {

int cmd_serve(const std::vector<std::string>& args) {
  return m3::server::run_serve_command(args);
}

}  // namespace m3::cli

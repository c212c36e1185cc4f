// `m3serve serve`: parses the flags (app/serve_flags.h) and runs the composed server
// (app/serve.h). Without --model-path it serves the bundled models/m3-tiny.
#include <cstdio>

#include "app/serve.h"
#include "app/serve_flags.h"
#include "cli/commands.h"

#ifndef M3_VERSION
#define M3_VERSION "0.0.0"
#endif

namespace m3::cli {

int cmd_serve(const std::vector<std::string>& args) {
  auto parsed = app::parse_serve_flags(args);
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "m3serve serve: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->help) {
    std::fputs(app::serve_help().c_str(), stdout);
    return 0;
  }
  app::ServeConfig config = parsed->config;
  config.server.version = M3_VERSION;
  return app::run_serve(config);
}

}  // namespace m3::cli

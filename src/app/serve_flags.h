// `m3serve serve`'s command line: SGLang's flag names where they exist; an unknown flag is an
// error naming the closest known one. The flags become a ServeConfig, which run_serve (serve.h)
// builds the server from.
#pragma once

#include <string>
#include <vector>

#include "app/serve.h"
#include "core/status.h"

namespace m3::app {

struct ParsedServeFlags {
  ServeConfig config;
  bool help = false;  // --help: print serve_help() and exit
};

Result<ParsedServeFlags> parse_serve_flags(const std::vector<std::string>& args);

// Every flag of the table with a valid, non-default example value (empty for a switch), so a test
// can check that each one either changes the config or leaves a startup notice.
struct FlagExample {
  std::string name;
  std::string value;
  bool alias = false;
};
std::vector<FlagExample> serve_flag_examples();
std::string serve_help();
// Edit distance, for "did you mean" hints.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace m3::app

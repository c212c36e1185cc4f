// m3serve subcommands. Each lives in its own cmd_*.cpp and is listed in main.cpp's table.
// A command gets its arguments after the subcommand name and returns the process exit code.
#pragma once

#include <string>
#include <vector>

namespace m3::cli {

using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

int cmd_bench(const std::vector<std::string>& args);
int cmd_generate(const std::vector<std::string>& args);
int cmd_score(const std::vector<std::string>& args);
int cmd_detokenize(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_render_chat(const std::vector<std::string>& args);
int cmd_router(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_version(const std::vector<std::string>& args);

}  // namespace m3::cli

// m3serve: one binary, subcommands (serve, score, generate, tokenize, ...).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace m3::cli {
namespace {

// Add new subcommands here (one line each); keep the list sorted by name.
const Command kCommands[] = {
    {"bench", "benchmark a running OpenAI-compatible server (throughput, TTFT, ITL)", cmd_bench},
    {"detokenize", "JSON id arrays (one per line) -> JSON strings", cmd_detokenize},
    {"generate", "generate tokens from prompt token ids (JSON output)", cmd_generate},
    {"render-chat", "render a chat request with the model's chat template", cmd_render_chat},
    {"router", "route OpenAI requests over several workers, prefix-cache aware", cmd_router},
    {"serve", "serve the OpenAI-compatible HTTP API", cmd_serve},
    {"score", "per-position argmax and last logits of prompt token ids (JSON)", cmd_score},
    {"tokenize", "JSON strings (one per line) -> JSON arrays of token ids", cmd_tokenize},
    {"version", "print the version and build features", cmd_version},
};

void print_help() {
  std::printf(
      "m3serve: a native inference server for the MiniMax-M3 model family\n\n"
      "usage: m3serve <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-14s %s\n", c.name, c.summary);
  std::printf("\n'm3serve <command> --help' shows a command's options.\n");
}

}  // namespace
}  // namespace m3::cli

int main(int argc, char** argv) {
  using namespace m3::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) return cmd_version({});
  std::vector<std::string> args(argv + 2, argv + argc);
  for (const Command& c : kCommands) {
    if (std::strcmp(c.name, argv[1]) == 0) {
      try {
        return c.run(args);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "m3serve %s: error: %s\n", c.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "m3serve: unknown command '%s' (see 'm3serve --help')\n", argv[1]);
  return 2;
}

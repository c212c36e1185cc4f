#include "cli/model_command.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/minimax_m3/runner.h"

namespace m3::cli {

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

int check_model_command_flags(const char* command, const ModelCommandFlags& flags,
                              const char* usage, std::vector<int32_t>* ids) {
  if (flags.model_path.empty() || !flags.have_prompt) {
    std::fprintf(stderr, "m3serve %s: --model-path and --prompt-ids are required\n\n%s", command,
                 usage);
    return 2;
  }
  if (flags.format != "json") {
    std::fprintf(stderr, "m3serve %s: --output-format '%s' is not supported (use json)\n",
                 command, flags.format.c_str());
    return 2;
  }
  if (flags.device == "cuda") {
    std::fprintf(stderr, "m3serve %s: --device cuda: not built with the CUDA backend\n", command);
    return 1;
  }
  if (flags.device != "cpu") {
    std::fprintf(stderr, "m3serve %s: --device must be cpu or cuda, got '%s'\n", command,
                 flags.device.c_str());
    return 2;
  }
  auto parsed = minimax_m3::parse_token_ids(flags.prompt_ids);
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "m3serve %s: --prompt-ids: %s\n", command,
                 parsed.status().message().c_str());
    return 2;
  }
  *ids = std::move(parsed).value();
  return 0;
}

}  // namespace m3::cli

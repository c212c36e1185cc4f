#include "cli/model_command.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli/device.h"
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

bool take_load_flags(const char* command, const std::string& key, const std::string& value,
                     ModelCommandFlags* flags, int* rc) {
  if (key == "--load-format") {
    if (value != "auto" && value != "safetensors" && value != "dummy") {
      std::fprintf(stderr, "m3serve %s: --load-format must be auto, safetensors or dummy, got "
                   "'%s'\n", command, value.c_str());
      *rc = 2;
    }
    flags->load_format = value;
    return true;
  }
  if (key == "--num-layers") {
    int64_t n = 0;
    if (!parse_int(value, &n) || n <= 0) {
      std::fprintf(stderr, "m3serve %s: --num-layers expects a positive integer, got '%s'\n",
                   command, value.c_str());
      *rc = 2;
    }
    flags->num_layers = n;
    return true;
  }
  return false;
}

int check_model_command_flags(const char* command, const ModelCommandFlags& flags,
                              const char* usage, std::vector<int32_t>* ids) {
  const bool dummy = flags.load_format == "dummy";
  if ((flags.model_path.empty() && !dummy) || !flags.have_prompt) {
    std::fprintf(stderr, "m3serve %s: --model-path and --prompt-ids are required\n\n%s", command,
                 usage);
    return 2;
  }
  if (flags.num_layers > 0 && !dummy) {
    std::fprintf(stderr, "m3serve %s: --num-layers needs --load-format dummy\n", command);
    return 2;
  }
  if (flags.format != "json") {
    std::fprintf(stderr, "m3serve %s: --output-format '%s' is not supported (use json)\n",
                 command, flags.format.c_str());
    return 2;
  }
  if (flags.device == "cuda" && !cuda_built_in()) {
    std::fprintf(stderr,
                 "m3serve %s: --device cuda: this m3serve was not built with the CUDA backend "
                 "(configure with -DM3_CUDA=ON where nvcc is installed)\n",
                 command);
    return 1;
  }
  if (flags.device != "cpu" && flags.device != "cuda") {
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

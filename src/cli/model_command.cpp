#include "cli/model_command.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/devices.h"
#include "core/status.h"

namespace m3::cli {

namespace {

// "1,2,3" (spaces allowed around ids) -> non-negative int32 token ids; errors name the entry.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos
                                                                     : comma - start);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    bool ok = !item.empty() && item.size() <= 10 &&
              item.find_first_not_of("0123456789") == std::string::npos;
    long long v = ok ? std::stoll(item) : -1;
    if (!ok || v > INT32_MAX)
      return invalid_argument("entry " + std::to_string(ids.size() + 1) + " ('" + item +
                              "') is not a token id (a non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace

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

bool parse_model_command_args(
    const char* command, const std::vector<std::string>& args, const char* usage,
    const std::vector<std::string>& switches, const std::vector<std::string>& valued,
    const std::function<int(const std::string&, const std::string&)>& extra,
    ModelCommandFlags* flags, int* rc) {
  static const char* kShared[] = {"--model-path",  "--prompt-ids", "--output-format",
                                  "--device",      "--threads",    "--prefill-chunk",
                                  "--load-format", "--num-layers",  "--tp",
                                  "--ep"};
  auto is_one_of = [](const std::string& key, const auto& names) {
    for (const auto& k : names)
      if (key == k) return true;
    return false;
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      *rc = 0;
      return false;
    }
    if (a == "--enable-expert-parallel") {  // vLLM's switch: --ep = --tp
      flags->enable_expert_parallel = true;
      continue;
    }
    if (is_one_of(a, switches)) {
      if ((*rc = extra(a, "")) != 0) return false;
      continue;
    }
    std::string key = a, v;
    bool inline_value = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      key = a.substr(0, eq), v = a.substr(eq + 1), inline_value = true;
    }
    const bool own = is_one_of(key, valued);
    if (!own && !is_one_of(key, kShared)) {
      std::fprintf(stderr, "m3serve %s: unknown option '%s' (see 'm3serve %s --help')\n", command,
                   a.c_str(), command);
      *rc = 2;
      return false;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "m3serve %s: %s needs a value\n", command, key.c_str());
        *rc = 2;
        return false;
      }
      v = args[++i];
    }
    if (own) {
      if ((*rc = extra(key, v)) != 0) return false;
      continue;
    }
    if (key == "--model-path") flags->model_path = v;
    if (key == "--prompt-ids") flags->prompt_ids = v, flags->have_prompt = true;
    if (key == "--output-format") flags->format = v;
    if (key == "--device") flags->device = v;
    if (int load_rc = 0; take_load_flags(command, key, v, flags, &load_rc)) {
      if ((*rc = load_rc) != 0) return false;
      continue;
    }
    if (key == "--tp" || key == "--ep") {
      int64_t n;
      if (!parse_int(v, &n) || n < 1 || n > 64) {
        std::fprintf(stderr, "m3serve %s: %s expects 1 to 64 ranks, got '%s'\n", command,
                     key.c_str(), v.c_str());
        *rc = 2;
        return false;
      }
      (key == "--tp" ? flags->tp : flags->ep) = n;
      continue;
    }
    if (key == "--threads" || key == "--prefill-chunk") {
      int64_t n;
      if (!parse_int(v, &n) || n < 0) {
        std::fprintf(stderr, "m3serve %s: %s expects a non-negative integer, got '%s'\n", command,
                     key.c_str(), v.c_str());
        *rc = 2;
        return false;
      }
      (key == "--threads" ? flags->threads : flags->prefill_chunk) = n;
    }
  }
  *rc = 0;
  return true;
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
  if (flags.device == "cuda" && !app::cuda_built_in()) {
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
  auto parsed = parse_token_ids(flags.prompt_ids);
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "m3serve %s: --prompt-ids: %s\n", command,
                 parsed.status().message().c_str());
    return 2;
  }
  *ids = std::move(parsed).value();
  return 0;
}

}  // namespace m3::cli

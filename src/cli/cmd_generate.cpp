// m3serve generate: greedy (temperature 0) or sampled generation from prompt token ids; prints
// {"output_ids": [...]} as JSON.
//   m3serve generate --model-path DIR --prompt-ids 1,2,3 [--max-tokens 32] [--temperature 0]
//                    [--seed S] [--ignore-eos] [--output-format json] [--device cpu]
//                    [--threads N] [--prefill-chunk N] [--load-format dummy [--num-layers N]]
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device.h"
#include "cli/model_command.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/runner.h"

namespace m3::cli {
namespace {

constexpr const char* kGenerateUsage =
    "usage: m3serve generate --model-path DIR --prompt-ids 1,2,3 [options]\n\n"
    "Generates tokens after the prompt and prints {\"output_ids\": [...]}.\n\n"
    "options:\n" M3_CLI_MODEL_INPUT_OPTIONS
    "  --max-tokens N         tokens to generate (default 32)\n"
    "  --temperature T        0 = greedy (default); > 0 samples from softmax(logits / T)\n"
    "  --seed S               sampling seed (default 0)\n"
    "  --ignore-eos           do not stop at the end-of-sequence token\n"
    "                         (eos from generation_config.json, else "
    "config.json)\n" M3_CLI_MODEL_RUN_OPTIONS;

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  ModelCommandFlags flags;
  int64_t max_tokens = 32, seed = 0;
  double temperature = 0.0;
  bool ignore_eos = false;
  auto extra = [&](const std::string& key, const std::string& v) {
    if (key == "--ignore-eos") {
      ignore_eos = true;
      return 0;
    }
    if (key == "--max-tokens" || key == "--seed") {
      int64_t n;
      if (!parse_int(v, &n) || n < 0) {
        std::fprintf(stderr, "m3serve generate: %s expects a non-negative integer, got '%s'\n",
                     key.c_str(), v.c_str());
        return 2;
      }
      (key == "--max-tokens" ? max_tokens : seed) = n;
    }
    if (key == "--temperature" && (!parse_double(v, &temperature) || temperature < 0)) {
      std::fprintf(stderr, "m3serve generate: --temperature expects a number >= 0, got '%s'\n",
                   v.c_str());
      return 2;
    }
    return 0;
  };
  if (int rc = 0;
      !parse_model_command_args("generate", args, kGenerateUsage, {"--ignore-eos"},
                                {"--max-tokens", "--temperature", "--seed"}, extra, &flags, &rc))
    return rc;
  const std::string& model_path = flags.model_path;
  const std::string& device = flags.device;
  const int64_t threads = flags.threads, chunk = flags.prefill_chunk;
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("generate", flags, kGenerateUsage, &prompt); rc != 0) return rc;

  if (device == "cuda") {  // the real-shape kernels when the config fits them (else below)
    minimax_m3::GenerateOptions o;
    o.max_tokens = max_tokens;
    o.temperature = temperature;
    o.seed = static_cast<uint64_t>(seed);
    o.ignore_eos = ignore_eos;
    o.prefill_chunk = chunk;
    bool used = false;
    std::vector<int32_t> ids;
    Status st = real_shape_generate(model_path, flags.load_format, flags.num_layers, prompt, o,
                                    &used, &ids);
    if (!st.is_ok()) {
      std::fprintf(stderr, "m3serve generate: %s\n", st.to_string().c_str());
      return 1;
    }
    if (used) {
      std::string s = "{\"output_ids\": [";
      for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
      s += "]}\n";
      std::fwrite(s.data(), 1, s.size(), stdout);
      return 0;
    }
  }
  auto made = make_backend(device, static_cast<int>(threads));
  if (!made.is_ok()) {
    std::fprintf(stderr, "m3serve generate: %s\n", made.status().message().c_str());
    return 1;
  }
  Backend& backend = **made;
  auto loaded = load_model(model_path, flags.load_format, flags.num_layers, &backend);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "m3serve generate: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  const auto& cfg = loaded->config;
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_tokens;
  const int64_t pages = (total + cfg.index_block_size - 1) / cfg.index_block_size;
  minimax_m3::PagedKvCache cache(&backend, cfg, pages);
  minimax_m3::SimplePagePool pool(pages);
  minimax_m3::GenerateOptions opts;
  opts.max_tokens = max_tokens;
  opts.temperature = temperature;
  opts.seed = static_cast<uint64_t>(seed);
  opts.eos_token_ids = loaded->eos_token_ids;
  opts.ignore_eos = ignore_eos;
  opts.prefill_chunk = chunk;
  auto out = minimax_m3::generate(loaded->model.get(), &cache, &pool, prompt, opts);
  if (!out.is_ok()) {
    std::fprintf(stderr, "m3serve generate: %s\n", out.status().to_string().c_str());
    return 1;
  }
  std::string s = "{\"output_ids\": [";
  for (size_t i = 0; i < out->size(); ++i) s += (i ? ", " : "") + std::to_string((*out)[i]);
  s += "]}\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  return 0;
}

}  // namespace m3::cli

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
    "options:\n"
    "  --model-path DIR       Hugging Face model directory (config.json, *.safetensors)\n"
    "  --prompt-ids LIST      comma-separated token ids\n"
    "  --max-tokens N         tokens to generate (default 32)\n"
    "  --temperature T        0 = greedy (default); > 0 samples from softmax(logits / T)\n"
    "  --seed S               sampling seed (default 0)\n"
    "  --ignore-eos           do not stop at the end-of-sequence token\n"
    "                         (eos from generation_config.json, else config.json)\n"
    "  --output-format json   output format (only json)\n"
    "  --device cpu|cuda      compute device (default cpu)\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --prefill-chunk N      prefill in chunks of N tokens (default: one chunk)\n"
    "  --load-format FMT      auto | safetensors | dummy (random weights in the real storage\n"
    "                         formats; --model-path optional: built-in MiniMax-M3.1-Flash config)\n"
    "  --num-layers N         with dummy: keep the first N layers\n";



}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  ModelCommandFlags flags;
  std::string& model_path = flags.model_path;
  std::string& prompt_ids = flags.prompt_ids;
  std::string& format = flags.format;
  std::string& device = flags.device;
  bool& have_prompt = flags.have_prompt;
  int64_t threads = 0, chunk = 0, max_tokens = 32, seed = 0;
  double temperature = 0.0;
  bool ignore_eos = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kGenerateUsage);
      return 0;
    }
    if (a == "--ignore-eos") {
      ignore_eos = true;
      continue;
    }
    std::string key = a, v;
    bool inline_value = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      key = a.substr(0, eq), v = a.substr(eq + 1), inline_value = true;
    }
    static const char* kValued[] = {"--model-path", "--prompt-ids",  "--output-format",
                                    "--device",     "--threads",     "--prefill-chunk",
                                    "--max-tokens", "--temperature", "--seed",
                                    "--load-format", "--num-layers"};
    bool known = false;
    for (const char* k : kValued) known |= key == k;
    if (!known) {
      std::fprintf(stderr,
                   "m3serve generate: unknown option '%s' (see 'm3serve generate --help')\n",
                   a.c_str());
      return 2;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "m3serve generate: %s needs a value\n", key.c_str());
        return 2;
      }
      v = args[++i];
    }
    if (key == "--model-path") model_path = v;
    if (key == "--prompt-ids") prompt_ids = v, have_prompt = true;
    if (key == "--output-format") format = v;
    if (key == "--device") device = v;
    if (int rc = 0; take_load_flags("generate", key, v, &flags, &rc)) {
      if (rc != 0) return rc;
      continue;
    }
    if (key == "--threads" || key == "--prefill-chunk" || key == "--max-tokens" ||
        key == "--seed") {
      int64_t n;
      if (!parse_int(v, &n) || n < 0) {
        std::fprintf(stderr, "m3serve generate: %s expects a non-negative integer, got '%s'\n",
                     key.c_str(), v.c_str());
        return 2;
      }
      if (key == "--threads") threads = n;
      if (key == "--prefill-chunk") chunk = n;
      if (key == "--max-tokens") max_tokens = n;
      if (key == "--seed") seed = n;
    }
    if (key == "--temperature" && (!parse_double(v, &temperature) || temperature < 0)) {
      std::fprintf(stderr, "m3serve generate: --temperature expects a number >= 0, got '%s'\n",
                   v.c_str());
      return 2;
    }
  }
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("generate", flags, kGenerateUsage, &prompt); rc != 0) return rc;

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

// m3serve generate: greedy (temperature 0) or sampled generation from prompt token ids; prints
// {"output_ids": [...]} as JSON. It runs the engine `serve` runs (one sampler, one RNG): the same
// prompt ids, temperature and seed give the same tokens as a /v1/completions request.
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
#include "cli/model_command.h"
#include "cli/engine_run.h"

namespace m3::cli {
namespace {

constexpr const char* kGenerateUsage =
    "usage: m3serve generate --model-path DIR --prompt-ids 1,2,3 [options]\n\n"
    "Generates tokens after the prompt and prints {\"output_ids\": [...]}.\n\n"
    "options:\n" M3_CLI_MODEL_INPUT_OPTIONS
    "  --max-tokens N         tokens to generate (default 32)\n"
    "  --temperature T        0 = greedy (default); > 0 samples with generation_config.json's\n"
    "                         other defaults (top_p, top_k), as the server does\n"
    "  --seed S               sampling seed (default 0); the engine's counter-based RNG, as\n"
    "                         the server's 'seed'\n"
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
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("generate", flags, kGenerateUsage, &prompt); rc != 0) {
    return rc;
  }
  if (max_tokens == 0) {
    std::fputs("{\"output_ids\": []}\n", stdout);
    return 0;
  }

  // The engine `serve` runs, with a KV pool of exactly this one request.
  app::EngineStackOptions o = engine_options(flags);
  o.context_length = static_cast<int32_t>(
      std::min<int64_t>(INT32_MAX, static_cast<int64_t>(prompt.size()) + max_tokens));
  auto loaded = app::make_engine(flags.model_path, o);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "m3serve generate: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  Engine& engine = *loaded->engine;
  // The request a /v1/completions call with these fields makes: the fields left unset take
  // generation_config.json's defaults there and here alike.
  server::SamplingOptions sampling;
  sampling.temperature = temperature;
  sampling.seed = static_cast<uint64_t>(seed);
  sampling.max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, INT32_MAX));
  sampling.ignore_eos = ignore_eos;
  GenerateRequest req;
  req.prompt_tokens = std::move(prompt);
  req.params = serving::to_sampling_params(sampling, engine.default_sampling_params());
  req.tag = "generate";
  auto out = run_request(engine, std::move(req));
  if (!out.is_ok()) {
    std::fprintf(stderr, "m3serve generate: %s\n", out.status().to_string().c_str());
    return 1;
  }
  const std::vector<int32_t>& ids = out->tokens;
  std::string text = "{\"output_ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
  text += "]}\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace m3::cli

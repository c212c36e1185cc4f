// m3serve score: run a prompt (token ids) through the engine once and print, as JSON, the argmax
// of every position and the logits of the last position.
//   m3serve score --model-path DIR --prompt-ids 1,2,3 [--output-format json] [--device cpu]
//                 [--threads N] [--prefill-chunk N] [--load-format dummy [--num-layers N]]
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/model_command.h"
#include "cli/engine_run.h"

namespace m3::cli {
namespace {

constexpr const char* kScoreUsage =
    "usage: m3serve score --model-path DIR --prompt-ids 1,2,3 [options]\n\n"
    "Runs the prompt through the model and prints {\"argmax\": [...], \"last_logits\": [...]}.\n\n"
    "options:\n" M3_CLI_MODEL_INPUT_OPTIONS M3_CLI_MODEL_RUN_OPTIONS;

// The command's JSON: per-position argmax and the last position's logits.
int write_scores(const std::vector<float>& logits, int64_t n, int64_t vocab) {
  std::string out = "{\"argmax\": [";
  for (int64_t t = 0; t < n; ++t) {
    if (t) out += ", ";
    // Ties go to the lowest id, as torch.argmax returns the first maximum.
    const float* row = logits.data() + t * vocab;
    out += std::to_string(std::max_element(row, row + vocab) - row);
  }
  out += "], \"last_logits\": [";
  char buf[32];
  for (int64_t v = 0; v < vocab; ++v) {
    float x = logits[(n - 1) * vocab + v];
    if (std::isfinite(x)) {
      std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(x));
    } else {
      std::snprintf(buf, sizeof(buf), "null");  // JSON has no NaN/Inf
    }
    if (v) out += ", ";
    out += buf;
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int cmd_score(const std::vector<std::string>& args) {
  ModelCommandFlags flags;
  if (int rc = 0;
      !parse_model_command_args("score", args, kScoreUsage, {}, {}, nullptr, &flags, &rc))
    return rc;
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("score", flags, kScoreUsage, &prompt); rc != 0) return rc;

  // The engine `serve` runs; the request asks for the logits of every prompt position and one
  // greedy token (which is not printed).
  app::EngineStackOptions o = engine_options(flags);
  o.context_length = static_cast<int32_t>(
      std::min<int64_t>(INT32_MAX, static_cast<int64_t>(prompt.size()) + 1));
  auto loaded = app::make_engine(flags.model_path, o);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "m3serve score: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  Engine& engine = *loaded->engine;
  const int64_t n = static_cast<int64_t>(prompt.size());
  GenerateRequest req;
  req.prompt_tokens = std::move(prompt);
  req.params = engine.default_sampling_params();
  req.params.temperature = 0.0f;
  req.params.max_tokens = 1;
  req.params.ignore_eos = true;
  req.prompt_logits = true;
  req.tag = "score";
  auto out = run_request(engine, std::move(req));
  if (!out.is_ok()) {
    std::fprintf(stderr, "m3serve score: %s\n", out.status().to_string().c_str());
    return 1;
  }
  return write_scores(out->prompt_logits, n, engine.vocab_size());
}

}  // namespace m3::cli

// m3serve score: run a prompt (token ids) through the model once and print, as JSON, the argmax
// of every position and the logits of the last position.
//   m3serve score --model-path DIR --prompt-ids 1,2,3 [--output-format json] [--device cpu]
//                 [--threads N] [--prefill-chunk N] [--load-format dummy [--num-layers N]]
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/device.h"
#include "cli/model_command.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/runner.h"

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
    out += std::to_string(minimax_m3::argmax(std::span<const float>(logits.data() + t * vocab,
                                                                    static_cast<size_t>(vocab))));
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
  const std::string& model_path = flags.model_path;
  const std::string& device = flags.device;
  const int64_t threads = flags.threads, chunk = flags.prefill_chunk;
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("score", flags, kScoreUsage, &prompt); rc != 0) return rc;

  if (device == "cuda") {  // the real-shape kernels when the config fits them (else below)
    bool used = false;
    std::vector<float> logits;
    int64_t vocab = 0;
    Status st = real_shape_score(model_path, flags.load_format, flags.num_layers, prompt, chunk,
                                 &used, &logits, &vocab);
    if (!st.is_ok()) {
      std::fprintf(stderr, "m3serve score: %s\n", st.to_string().c_str());
      return 1;
    }
    if (used) return write_scores(logits, static_cast<int64_t>(prompt.size()), vocab);
  }
  auto made = make_backend(device, static_cast<int>(threads));
  if (!made.is_ok()) {
    std::fprintf(stderr, "m3serve score: %s\n", made.status().message().c_str());
    return 1;
  }
  Backend& backend = **made;
  auto loaded = load_model(model_path, flags.load_format, flags.num_layers, &backend);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "m3serve score: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  const auto& cfg = loaded->config;
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t pages = (n + cfg.index_block_size - 1) / cfg.index_block_size;
  minimax_m3::PagedKvCache cache(&backend, cfg, pages);
  minimax_m3::SimplePagePool pool(pages);
  minimax_m3::SequenceRunner seq(loaded->model.get(), &cache, &pool);
  std::vector<float> logits;
  Status st = seq.append(prompt, chunk, true, &logits);
  if (!st.is_ok()) {
    std::fprintf(stderr, "m3serve score: %s\n", st.to_string().c_str());
    return 1;
  }
  return write_scores(logits, n, cfg.vocab_size);
}

}  // namespace m3::cli

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
    "options:\n"
    "  --model-path DIR       Hugging Face model directory (config.json, *.safetensors)\n"
    "  --prompt-ids LIST      comma-separated token ids\n"
    "  --output-format json   output format (only json)\n"
    "  --device cpu|cuda      compute device (default cpu)\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --prefill-chunk N      prefill in chunks of N tokens (default: one chunk)\n"
    "  --load-format FMT      auto | safetensors | dummy (random weights in the real storage\n"
    "                         formats; --model-path optional: built-in MiniMax-M3.1-Flash config)\n"
    "  --num-layers N         with dummy: keep the first N layers\n";


}  // namespace

int cmd_score(const std::vector<std::string>& args) {
  ModelCommandFlags flags;
  std::string& model_path = flags.model_path;
  std::string& prompt_ids = flags.prompt_ids;
  std::string& format = flags.format;
  std::string& device = flags.device;
  bool& have_prompt = flags.have_prompt;
  int64_t threads = 0, chunk = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kScoreUsage);
      return 0;
    }
    std::string key = a, value;
    bool inline_value = false;
    if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      key = a.substr(0, eq), value = a.substr(eq + 1), inline_value = true;
    }
    auto take = [&](std::string* dst) {
      if (inline_value) {
        *dst = value;
        return true;
      }
      if (i + 1 >= args.size()) return false;
      *dst = args[++i];
      return true;
    };
    std::string v;
    if (key == "--model-path" || key == "--prompt-ids" || key == "--output-format" ||
        key == "--device" || key == "--threads" || key == "--prefill-chunk" ||
        key == "--load-format" || key == "--num-layers") {
      if (!take(&v)) {
        std::fprintf(stderr, "m3serve score: %s needs a value\n", key.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "m3serve score: unknown option '%s' (see 'm3serve score --help')\n",
                   a.c_str());
      return 2;
    }
    if (key == "--model-path") model_path = v;
    if (key == "--prompt-ids") prompt_ids = v, have_prompt = true;
    if (key == "--output-format") format = v;
    if (key == "--device") device = v;
    if (int rc = 0; take_load_flags("score", key, v, &flags, &rc)) {
      if (rc != 0) return rc;
      continue;
    }
    if ((key == "--threads" || key == "--prefill-chunk")) {
      int64_t n;
      if (!parse_int(v, &n) || n < 0) {
        std::fprintf(stderr, "m3serve score: %s expects a non-negative integer, got '%s'\n",
                     key.c_str(), v.c_str());
        return 2;
      }
      (key == "--threads" ? threads : chunk) = n;
    }
  }
  std::vector<int32_t> prompt;
  if (int rc = check_model_command_flags("score", flags, kScoreUsage, &prompt); rc != 0) return rc;

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
  const int64_t vocab = cfg.vocab_size;
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

}  // namespace m3::cli

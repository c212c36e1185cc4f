// Flag handling shared by the commands that run a model directly (score, generate).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

// Usage text of the shared flags: what the command reads (first in the options list) and how it
// runs (last), so that each command's usage string is one literal.
#define M3_CLI_MODEL_INPUT_OPTIONS                                                       \
  "  --model-path DIR       Hugging Face model directory (config.json, *.safetensors)\n" \
  "  --prompt-ids LIST      comma-separated token ids\n"
#define M3_CLI_MODEL_RUN_OPTIONS                                                              \
  "  --output-format json   output format (only json)\n"                                      \
  "  --device cpu|cuda      compute device (default cpu)\n"                                   \
  "  --threads N            CPU threads (default: all cores)\n"                               \
  "  --prefill-chunk N      prefill in chunks of N tokens (default: one chunk)\n"             \
  "  --tp N                 tensor-parallel ranks (CPU ranks in this process; default 1)\n"   \
  "  --ep N                 expert-parallel ranks among them (divides --tp; alone: --tp N)\n" \
  "  --enable-expert-parallel  experts placed whole over the --tp ranks (--ep = --tp)\n"     \
  "  --load-format FMT      auto | safetensors | dummy (random weights in the real storage\n" \
  "                         formats; --model-path optional: built-in MiniMax-M3.1-Flash "     \
  "config)\n"                                                                                 \
  "  --num-layers N         with dummy: keep the first N layers\n"

namespace m3::cli {

// Strict integer / finite-number parsing of a whole flag value.
bool parse_int(const std::string& s, int64_t* out);
bool parse_double(const std::string& s, double* out);

// The flags every model command takes.
struct ModelCommandFlags {
  std::string model_path, prompt_ids, format = "json", device = "cpu";
  std::string load_format = "auto";  // auto | safetensors | dummy
  int64_t num_layers = 0;            // --num-layers (dummy only); 0: the config's
  int64_t threads = 0;               // --threads; 0: all cores
  int64_t prefill_chunk = 0;         // --prefill-chunk; 0: one chunk
  int64_t tp = 1;                    // --tp: tensor-parallel ranks (CPU ranks with --device cpu)
  int64_t ep = 1;                    // --ep: expert-parallel ranks among the --tp ranks
  bool enable_expert_parallel = false;  // --enable-expert-parallel (vLLM): --ep = --tp
  bool have_prompt = false;
};

// Walks a model command's arguments: --help / -h prints `usage`; the shared flags (--model-path,
// --prompt-ids, --output-format, --device, --threads, --prefill-chunk, --tp, --ep,
// --enable-expert-parallel, --load-format,
// --num-layers; "--key value" or "--key=value") go into `flags`; the command's own `switches`
// (no value, exact match) and `valued` flags go to extra(key, value) (value "" for a switch),
// which returns 0 or, after printing its error, the exit code. Anything else is an error.
// Returns true when the command should run; otherwise *rc is the exit code (0 after --help,
// 2 for bad usage).
bool parse_model_command_args(
    const char* command, const std::vector<std::string>& args, const char* usage,
    const std::vector<std::string>& switches, const std::vector<std::string>& valued,
    const std::function<int(const std::string&, const std::string&)>& extra,
    ModelCommandFlags* flags, int* rc);

// Parses --load-format / --num-layers into `flags` when `key` is one of them (returns true; on a
// bad value prints the error and sets *rc = 2).
bool take_load_flags(const char* command, const std::string& key, const std::string& value,
                     ModelCommandFlags* flags, int* rc);

// Checks the shared flags and parses --prompt-ids into *ids. On a problem prints
// "m3serve <command>: ..." (and `usage` when a required flag is missing) to stderr and returns
// the exit code (2: bad usage, 1: a device this build cannot use); returns 0 when all is well.
// --model-path is optional with --load-format dummy (the built-in M3.1-Flash config).
int check_model_command_flags(const char* command, const ModelCommandFlags& flags,
                              const char* usage, std::vector<int32_t>* ids);

}  // namespace m3::cli

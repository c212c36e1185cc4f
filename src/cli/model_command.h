// Flag handling shared by the commands that run a model directly (score, generate).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace m3::cli {

// Strict integer / finite-number parsing of a whole flag value.
bool parse_int(const std::string& s, int64_t* out);
bool parse_double(const std::string& s, double* out);

// The flags every model command takes.
struct ModelCommandFlags {
  std::string model_path, prompt_ids, format = "json", device = "cpu";
  std::string load_format = "auto";  // auto | safetensors | dummy
  int64_t num_layers = 0;            // --num-layers (dummy only); 0: the config's
  bool have_prompt = false;
};

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

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
  bool have_prompt = false;
};

// Checks the shared flags and parses --prompt-ids into *ids. On a problem prints
// "m3serve <command>: ..." (and `usage` when a required flag is missing) to stderr and returns
// the exit code (2: bad usage, 1: a device this build cannot use); returns 0 when all is well.
int check_model_command_flags(const char* command, const ModelCommandFlags& flags,
                              const char* usage, std::vector<int32_t>* ids);

}  // namespace m3::cli

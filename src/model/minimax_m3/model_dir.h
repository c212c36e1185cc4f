// Opening a MiniMax-M3 model directory (config.json, generation_config.json, safetensors) into a
// ready Model on a backend. Used by the CLI commands and the golden tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/model.h"

namespace m3::minimax_m3 {

struct LoadedModel {
  MiniMaxM3Config config;
  std::unique_ptr<WeightSource> weights;  // the checkpoint (kept open: it may be memory-mapped)
  std::unique_ptr<Model> model;
  // Stop tokens: generation_config.json's eos_token_id when present, else config.json's.
  std::vector<int64_t> eos_token_ids;
};

// Every failure names the directory and the file or tensor at fault.
Result<LoadedModel> load_model_dir(const std::string& dir, Backend* backend);

// eos_token_id (an integer or a list) of <dir>/generation_config.json; an empty list when the
// file or the field is absent; an error when the file is unreadable or malformed.
Result<std::vector<int64_t>> read_generation_eos(const std::string& dir);

}  // namespace m3::minimax_m3

#include "model/minimax_m3/model_dir.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loader/checkpoint.h"

namespace m3::minimax_m3 {

Result<std::vector<int64_t>> read_generation_eos(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir) / "generation_config.json";
  std::vector<int64_t> ids;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ids;
  std::ifstream in(path);
  if (!in) return not_found("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument(path.string() + ": not a JSON object");
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  if (it->is_number_integer()) {
    ids.push_back(it->get<int64_t>());
  } else if (it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number_integer())
        return invalid_argument(path.string() + ": eos_token_id: expected integers, found " +
                                v.dump());
      ids.push_back(v.get<int64_t>());
    }
  } else {
    return invalid_argument(path.string() + ": eos_token_id: expected an integer or a list, found " +
                            it->dump());
  }
  return ids;
}

Result<LoadedModel> load_model_dir(const std::string& dir, Backend* backend) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return not_found("model path '" + dir + "' is not a directory");
  LoadedModel lm;
  M3_ASSIGN_OR_RETURN(lm.config, load_minimax_m3_config(dir));
  M3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  lm.weights = std::move(ckpt);
  M3_ASSIGN_OR_RETURN(lm.model, Model::load(lm.config, *lm.weights, backend));
  M3_ASSIGN_OR_RETURN(lm.eos_token_ids, read_generation_eos(dir));
  if (lm.eos_token_ids.empty()) lm.eos_token_ids = lm.config.eos_token_ids;
  return lm;
}

}  // namespace m3::minimax_m3

#include "loader/vision_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace m3 {

namespace {

using nlohmann::json;

Status read_int(const json& obj, const std::string& key, const std::string& where, int64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_number_integer()) {
    return invalid_argument(where + key + ": expected an integer, found " + it->dump());
  }
  *out = it->get<int64_t>();
  return Status::ok();
}

Status read_double(const json& obj, const std::string& key, const std::string& where, double* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return invalid_argument(where + key + ": expected a number, found " + it->dump());
  *out = it->get<double>();
  return Status::ok();
}

Status read_triple(const json& obj, const std::string& key, const std::string& where,
                   std::array<double, 3>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_array() || it->size() != 3) {
    return invalid_argument(where + key + ": expected 3 numbers, found " + it->dump());
  }
  for (size_t i = 0; i < 3; ++i) {
    if (!(*it)[i].is_number()) return invalid_argument(where + key + ": expected numbers");
    (*out)[i] = (*it)[i].get<double>();
  }
  return Status::ok();
}

// The only activation the tower and projector implement is exact (erf) GELU.
Status require_gelu(const json& obj, const std::string& key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return Status::ok();
  if (!it->is_string() || it->get<std::string>() != "gelu") {
    return invalid_argument(where + key + ": only \"gelu\" (exact) is supported, found " +
                            it->dump());
  }
  return Status::ok();
}

Result<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return not_found("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Status VisionConfig::validate() const {
  auto positive = [](int64_t v, const char* name) -> Status {
    if (v <= 0) return invalid_argument(std::string("vision_config.") + name + " must be positive");
    return Status::ok();
  };
  M3_RETURN_IF_ERROR(positive(hidden_size, "hidden_size"));
  M3_RETURN_IF_ERROR(positive(num_attention_heads, "num_attention_heads"));
  M3_RETURN_IF_ERROR(positive(num_hidden_layers, "num_hidden_layers"));
  M3_RETURN_IF_ERROR(positive(intermediate_size, "intermediate_size"));
  M3_RETURN_IF_ERROR(positive(patch_size, "patch_size"));
  M3_RETURN_IF_ERROR(positive(temporal_patch_size, "temporal_patch_size"));
  M3_RETURN_IF_ERROR(positive(spatial_merge_size, "spatial_merge_size"));
  M3_RETURN_IF_ERROR(positive(projector_hidden_size, "projector_hidden_size"));
  if (hidden_size % num_attention_heads != 0) {
    return invalid_argument("vision_config.hidden_size " + std::to_string(hidden_size) +
                            " is not a multiple of num_attention_heads " +
                            std::to_string(num_attention_heads));
  }
  if (rope_axis_dims() < 2) {
    return invalid_argument("vision_config: head_dim " + std::to_string(head_dim()) +
                            " leaves no room for 3-D RoPE (needs >= 6)");
  }
  if (num_channels != 3) return invalid_argument("vision_config.num_channels must be 3 (RGB)");
  if (min_pixels < 1 || max_pixels < min_pixels) {
    return invalid_argument("preprocessor_config.json: need 1 <= min_pixels <= max_pixels, found " +
                            std::to_string(min_pixels) + " and " + std::to_string(max_pixels));
  }
  for (double s : image_std) {
    if (!(s > 0)) return invalid_argument("preprocessor_config.json: image_std must be positive");
  }
  return Status::ok();
}

Result<std::optional<VisionConfig>> parse_vision_config(const std::string& config_json,
                                                        const std::string& preprocessor_json,
                                                        const std::string& source) {
  json top = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (top.is_discarded() || !top.is_object()) return invalid_argument(source + ": not a JSON object");
  auto vc = top.find("vision_config");
  if (vc == top.end() || vc->is_null()) return std::optional<VisionConfig>();
  if (!vc->is_object()) return invalid_argument(source + ": vision_config: expected an object");
  VisionConfig c;
  const std::string w = source + ": vision_config.";
  M3_RETURN_IF_ERROR(read_int(*vc, "hidden_size", w, &c.hidden_size));
  M3_RETURN_IF_ERROR(read_int(*vc, "num_attention_heads", w, &c.num_attention_heads));
  M3_RETURN_IF_ERROR(read_int(*vc, "num_hidden_layers", w, &c.num_hidden_layers));
  M3_RETURN_IF_ERROR(read_int(*vc, "intermediate_size", w, &c.intermediate_size));
  M3_RETURN_IF_ERROR(read_int(*vc, "patch_size", w, &c.patch_size));
  M3_RETURN_IF_ERROR(read_int(*vc, "temporal_patch_size", w, &c.temporal_patch_size));
  M3_RETURN_IF_ERROR(read_int(*vc, "spatial_merge_size", w, &c.spatial_merge_size));
  M3_RETURN_IF_ERROR(read_int(*vc, "num_channels", w, &c.num_channels));
  M3_RETURN_IF_ERROR(read_double(*vc, "layer_norm_eps", w, &c.layer_norm_eps));
  M3_RETURN_IF_ERROR(read_double(*vc, "rope_theta", w, &c.rope_theta));
  M3_RETURN_IF_ERROR(require_gelu(*vc, "hidden_act", w));
  const std::string t = source + ": ";
  M3_RETURN_IF_ERROR(read_int(top, "projector_hidden_size", t, &c.projector_hidden_size));
  M3_RETURN_IF_ERROR(require_gelu(top, "projector_hidden_act", t));
  auto text = top.find("text_config");
  const json& text_obj = (text != top.end() && text->is_object()) ? *text : top;
  M3_RETURN_IF_ERROR(read_int(text_obj, "hidden_size", t + "text_config.", &c.text_hidden_size));
  if (!preprocessor_json.empty()) {
    json pre = json::parse(preprocessor_json, nullptr, false);
    if (pre.is_discarded() || !pre.is_object()) {
      return invalid_argument("preprocessor_config.json: not a JSON object");
    }
    const std::string p = "preprocessor_config.json: ";
    M3_RETURN_IF_ERROR(read_int(pre, "min_pixels", p, &c.min_pixels));
    M3_RETURN_IF_ERROR(read_int(pre, "max_pixels", p, &c.max_pixels));
    M3_RETURN_IF_ERROR(read_triple(pre, "image_mean", p, &c.image_mean));
    M3_RETURN_IF_ERROR(read_triple(pre, "image_std", p, &c.image_std));
    // The processor's patch geometry must be the tower's.
    for (auto [key, value] : {std::pair{"patch_size", c.patch_size},
                              std::pair{"temporal_patch_size", c.temporal_patch_size},
                              std::pair{"merge_size", c.spatial_merge_size}}) {
      int64_t v = value;
      M3_RETURN_IF_ERROR(read_int(pre, key, p, &v));
      if (v != value) {
        return invalid_argument(p + key + " = " + std::to_string(v) +
                                " differs from config.json's vision_config (" +
                                std::to_string(value) + ")");
      }
    }
  }
  M3_RETURN_IF_ERROR(c.validate());
  return std::optional<VisionConfig>(c);
}

Result<std::optional<VisionConfig>> load_vision_config(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  auto config = read_file(dir / "config.json");
  if (!config.is_ok()) return config.status();
  std::string pre;
  if (std::filesystem::exists(dir / "preprocessor_config.json")) {
    auto p = read_file(dir / "preprocessor_config.json");
    if (!p.is_ok()) return p.status();
    pre = std::move(p).value();
  }
  return parse_vision_config(*config, pre, (dir / "config.json").string());
}

}  // namespace m3

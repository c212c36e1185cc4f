// Parses MiniMax-M3 config.json the way transformers' MiniMaxM3VLConfig / MiniMaxM3VLTextConfig
// (modular_minimax_m3_vl.py) reads it, including the legacy checkpoint spellings:
//  * `sparse_attention_config.{sparse_num_index_heads, sparse_index_dim, sparse_block_size,
//    sparse_topk_blocks, sparse_local_block}` OVERRIDE the flat `index_*` fields when present;
//  * `layer_types` wins over `sparse_attention_config.sparse_attention_freq`; with neither, every
//    layer is "full_attention". `use_sparse_attention` is not consulted (as in transformers);
//  * `mlp_layer_types` wins over `moe_layer_freq`; with neither, every layer is "sparse" (MoE);
//  * RoPE: `rope_parameters` (or legacy `rope_scaling`) first, then top-level `rope_theta` /
//    `partial_rotary_factor`; the rotated width is int(head_dim * partial_rotary_factor). Without a
//    partial_rotary_factor anywhere, the legacy `rotary_dim` field is used (transformers ignores
//    it, but legacy checkpoints carry only rotary_dim), and without either the whole head is
//    rotated (transformers' default factor 1.0).
// Extensions over transformers (which would raise on them): an integer `moe_layer_freq` /
// `sparse_attention_freq` k means "layer i when i % k == 0" (Megatron convention), and
// `sparse_init_block` (ignored by transformers) fills index_init_blocks.
#include "loader/model_config.h"

#include "core/json_depth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace m3 {

namespace {

using nlohmann::json;

// Reads typed fields of one JSON object; every message names the file and the field path.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool present(const std::string& key) const { return find(key) != nullptr; }

  Status error(const std::string& key, const std::string& what) const {
    return invalid_argument(source_ + ": " + prefix_ + key + ": " + what);
  }

  // Leaves *out unchanged when the key is absent or null.
  Status get(const std::string& key, int64_t* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_number_integer()) return error(key, "expected an integer, found " + v->dump());
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) {
      return error(key, "integer out of range: " + v->dump());
    }
    *out = v->get<int64_t>();
    return Status::ok();
  }
  Status get(const std::string& key, double* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_number()) return error(key, "expected a number, found " + v->dump());
    *out = v->get<double>();
    return Status::ok();
  }
  Status get(const std::string& key, bool* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_boolean()) return error(key, "expected true or false, found " + v->dump());
    *out = v->get<bool>();
    return Status::ok();
  }
  Status get(const std::string& key, std::string* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_string()) return error(key, "expected a string, found " + v->dump());
    *out = v->get<std::string>();
    return Status::ok();
  }
  // A list of 0/1 flags, or an integer k meaning "layer i when i % k == 0".
  Status get_flags(const std::string& key, int64_t num_layers, std::vector<bool>* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    out->clear();
    if (v->is_number_integer()) {
      const int64_t k = v->get<int64_t>();
      if (k < 1) return error(key, "an integer frequency must be >= 1, found " + v->dump());
      for (int64_t i = 0; i < num_layers; ++i) out->push_back(i % k == 0);
      return Status::ok();
    }
    if (!v->is_array()) {
      return error(key, "expected a list of 0/1 per layer or an integer, found " + v->dump());
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const json& f = (*v)[i];
      if (f.is_boolean()) {
        out->push_back(f.get<bool>());
      } else if (f.is_number_integer() && (f.get<int64_t>() == 0 || f.get<int64_t>() == 1)) {
        out->push_back(f.get<int64_t>() == 1);
      } else {
        return error(key + "[" + std::to_string(i) + "]", "expected 0 or 1, found " + f.dump());
      }
    }
    return Status::ok();
  }
  Status get_strings(const std::string& key, std::vector<std::string>* out, bool* found) const {
    const json* v = find(key);
    *found = v != nullptr;
    if (v == nullptr) return Status::ok();
    if (!v->is_array()) return error(key, "expected a list of strings, found " + v->dump());
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) {
        return error(key + "[" + std::to_string(i) + "]", "expected a string");
      }
      out->push_back((*v)[i].get<std::string>());
    }
    return Status::ok();
  }

  const std::string& prefix() const { return prefix_; }
  const std::string& source() const { return source_; }
  const json& obj() const { return obj_; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

bool looks_like_m3(const std::string& s) {
  return s.rfind("minimax_m3", 0) == 0 || s.find("MiniMaxM3") != std::string::npos;
}

Status parse_identity(const json& root, const std::string& source, MiniMaxM3Config* c) {
  Fields top(root, source, "");
  M3_RETURN_IF_ERROR(top.get("model_type", &c->model_type));
  if (!c->model_type.empty() && !looks_like_m3(c->model_type)) {
    return invalid_argument(source + ": model_type '" + c->model_type +
                            "' is not a MiniMax-M3 model (expected 'minimax_m3_vl')");
  }
  if (const json* a = top.find("architectures")) {
    if (!a->is_array()) return top.error("architectures", "expected a list of strings");
    bool any = false;
    std::string names;
    for (const json& n : *a) {
      if (!n.is_string()) return top.error("architectures", "expected a list of strings");
      names += (names.empty() ? "" : ", ") + n.get<std::string>();
      any = any || looks_like_m3(n.get<std::string>());
    }
    if (!any && !a->empty()) {
      return invalid_argument(source + ": architectures [" + names +
                              "] is not a MiniMax-M3 model (expected "
                              "'MiniMaxM3SparseForConditionalGeneration')");
    }
  }
  return Status::ok();
}

Status parse_rope(const Fields& t, MiniMaxM3Config* c) {
  const json* rp = t.find("rope_parameters");
  std::string rp_key = "rope_parameters";
  if (rp == nullptr) {
    rp = t.find("rope_scaling");  // transformers: rope_scaling or rope_parameters
    rp_key = "rope_scaling";
  }
  double factor = NAN;
  bool have_theta = false;
  if (rp != nullptr) {
    if (!rp->is_object()) return t.error(rp_key, "expected an object, found " + rp->dump());
    Fields r(*rp, t.source(), t.prefix() + rp_key + ".");
    std::string type = "default";
    M3_RETURN_IF_ERROR(r.get("type", &type));
    M3_RETURN_IF_ERROR(r.get("rope_type", &type));
    if (type != "default") {
      return unimplemented(t.source() + ": " + t.prefix() + rp_key + ".rope_type '" + type +
                           "' is not supported (only plain RoPE, 'default')");
    }
    have_theta = r.present("rope_theta");
    M3_RETURN_IF_ERROR(r.get("rope_theta", &c->rope_theta));
    if (r.present("partial_rotary_factor")) {
      M3_RETURN_IF_ERROR(r.get("partial_rotary_factor", &factor));
    }
  }
  if (!have_theta) M3_RETURN_IF_ERROR(t.get("rope_theta", &c->rope_theta));
  if (std::isnan(factor) && t.present("partial_rotary_factor")) {
    M3_RETURN_IF_ERROR(t.get("partial_rotary_factor", &factor));
  }
  if (!std::isnan(factor)) {
    if (!(factor > 0.0 && factor <= 1.0)) {
      return t.error("partial_rotary_factor", "must be in (0, 1], found " + std::to_string(factor));
    }
    // transformers rotates int(head_dim * factor) channels and never reads `rotary_dim` (its
    // save_pretrained even writes the default rotary_dim 64 next to the factor), so the factor wins.
    c->rotary_dim = int64_t(double(c->head_dim) * factor);  // python int() truncates
  } else if (t.present("rotary_dim")) {
    M3_RETURN_IF_ERROR(t.get("rotary_dim", &c->rotary_dim));
  } else {
    c->rotary_dim = c->head_dim;
  }
  return Status::ok();
}

Status parse_layer_kinds(const Fields& t, MiniMaxM3Config* c) {
  const json* sac = t.find("sparse_attention_config");
  if (sac != nullptr && !sac->is_object()) {
    return t.error("sparse_attention_config", "expected an object, found " + sac->dump());
  }
  static const json kEmpty = json::object();
  Fields s(sac ? *sac : kEmpty, t.source(), t.prefix() + "sparse_attention_config.");
  // Flat names first; legacy names override them (transformers' order).
  M3_RETURN_IF_ERROR(t.get("index_n_heads", &c->index_n_heads));
  M3_RETURN_IF_ERROR(t.get("index_head_dim", &c->index_head_dim));
  M3_RETURN_IF_ERROR(t.get("index_block_size", &c->index_block_size));
  M3_RETURN_IF_ERROR(t.get("index_topk_blocks", &c->index_topk_blocks));
  M3_RETURN_IF_ERROR(t.get("index_local_blocks", &c->index_local_blocks));
  M3_RETURN_IF_ERROR(t.get("index_init_blocks", &c->index_init_blocks));
  M3_RETURN_IF_ERROR(s.get("sparse_num_index_heads", &c->index_n_heads));
  M3_RETURN_IF_ERROR(s.get("sparse_index_dim", &c->index_head_dim));
  M3_RETURN_IF_ERROR(s.get("sparse_block_size", &c->index_block_size));
  M3_RETURN_IF_ERROR(s.get("sparse_topk_blocks", &c->index_topk_blocks));
  M3_RETURN_IF_ERROR(s.get("sparse_local_block", &c->index_local_blocks));
  M3_RETURN_IF_ERROR(s.get("sparse_init_block", &c->index_init_blocks));
  std::string score_type = "max";
  M3_RETURN_IF_ERROR(s.get("sparse_score_type", &score_type));
  if (score_type != "max") {
    return unimplemented(s.source() + ": " + s.prefix() + "sparse_score_type '" + score_type +
                         "' is not supported (only 'max')");
  }

  const int64_t n = c->num_hidden_layers;
  std::vector<std::string> names;
  bool found = false;
  M3_RETURN_IF_ERROR(t.get_strings("layer_types", &names, &found));
  c->layer_types.clear();
  if (found) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "full_attention") {
        c->layer_types.push_back(AttentionKind::kFull);
      } else if (names[i] == "minimax_m3_sparse") {
        c->layer_types.push_back(AttentionKind::kSparse);
      } else {
        return t.error("layer_types[" + std::to_string(i) + "]",
                       "unknown attention type '" + names[i] +
                           "' (expected 'full_attention' or 'minimax_m3_sparse')");
      }
    }
  } else if (s.present("sparse_attention_freq")) {
    std::vector<bool> flags;
    M3_RETURN_IF_ERROR(s.get_flags("sparse_attention_freq", n, &flags));
    for (bool f : flags) c->layer_types.push_back(f ? AttentionKind::kSparse : AttentionKind::kFull);
  } else {
    c->layer_types.assign(size_t(std::max<int64_t>(n, 0)), AttentionKind::kFull);
  }

  M3_RETURN_IF_ERROR(t.get_strings("mlp_layer_types", &names, &found));
  c->mlp_layer_types.clear();
  if (found) {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == "dense") {
        c->mlp_layer_types.push_back(MlpKind::kDense);
      } else if (names[i] == "sparse") {
        c->mlp_layer_types.push_back(MlpKind::kMoe);
      } else {
        return t.error("mlp_layer_types[" + std::to_string(i) + "]",
                       "unknown MLP type '" + names[i] + "' (expected 'dense' or 'sparse')");
      }
    }
  } else if (t.present("moe_layer_freq")) {
    std::vector<bool> flags;
    M3_RETURN_IF_ERROR(t.get_flags("moe_layer_freq", n, &flags));
    for (bool f : flags) c->mlp_layer_types.push_back(f ? MlpKind::kMoe : MlpKind::kDense);
  } else {
    c->mlp_layer_types.assign(size_t(std::max<int64_t>(n, 0)), MlpKind::kMoe);
  }
  return Status::ok();
}

Status parse_token_ids(const Fields& t, const Fields& top, MiniMaxM3Config* c) {
  // The text config's value wins; the wrapper's is the fallback.
  const Fields& b = t.obj().contains("bos_token_id") ? t : top;
  if (b.obj().contains("bos_token_id")) {
    if (b.obj().at("bos_token_id").is_null()) c->bos_token_id = -1;
    else M3_RETURN_IF_ERROR(b.get("bos_token_id", &c->bos_token_id));
  }
  const Fields& e = t.obj().contains("eos_token_id") ? t : top;
  if (e.obj().contains("eos_token_id")) {
    const json& v = e.obj().at("eos_token_id");
    c->eos_token_ids.clear();
    if (v.is_number_integer()) {
      c->eos_token_ids.push_back(v.get<int64_t>());
    } else if (v.is_array()) {
      for (const json& x : v) {
        if (!x.is_number_integer()) {
          return e.error("eos_token_id", "expected an integer or a list of integers");
        }
        c->eos_token_ids.push_back(x.get<int64_t>());
      }
    } else if (!v.is_null()) {
      return e.error("eos_token_id", "expected an integer or a list of integers, found " + v.dump());
    }
  }
  return Status::ok();
}

Status parse_quantization(const Fields& top, const Fields& t, MiniMaxM3Config* c) {
  const Fields& q = top.present("quantization_config") ? top : t;
  const json* v = q.find("quantization_config");
  if (v == nullptr) return Status::ok();
  if (!v->is_object()) return q.error("quantization_config", "expected an object");
  Fields f(*v, q.source(), q.prefix() + "quantization_config.");
  M3_RETURN_IF_ERROR(f.get("quant_method", &c->quantization.quant_method));
  M3_RETURN_IF_ERROR(f.get("moe_quant_algo", &c->quantization.moe_quant_algo));
  c->quantization.raw_json = v->dump();
  return Status::ok();
}

Status parse_into(const json& root, const std::string& source, MiniMaxM3Config* c) {
  if (!root.is_object()) return invalid_argument(source + ": not a JSON object");
  M3_RETURN_IF_ERROR(parse_identity(root, source, c));
  Fields top(root, source, "");
  const json* text = top.find("text_config");
  if (text != nullptr && !text->is_object()) {
    return top.error("text_config", "expected an object, found " + text->dump());
  }
  c->is_multimodal_wrapper = text != nullptr;
  c->field_prefix = text ? "text_config." : "";
  Fields t(text ? *text : root, source, c->field_prefix);

  M3_RETURN_IF_ERROR(t.get("hidden_size", &c->hidden_size));
  M3_RETURN_IF_ERROR(t.get("num_hidden_layers", &c->num_hidden_layers));
  M3_RETURN_IF_ERROR(t.get("num_attention_heads", &c->num_attention_heads));
  M3_RETURN_IF_ERROR(t.get("num_key_value_heads", &c->num_key_value_heads));
  M3_RETURN_IF_ERROR(t.get("head_dim", &c->head_dim));
  M3_RETURN_IF_ERROR(t.get("vocab_size", &c->vocab_size));
  M3_RETURN_IF_ERROR(t.get("max_position_embeddings", &c->max_position_embeddings));
  M3_RETURN_IF_ERROR(t.get("rms_norm_eps", &c->rms_norm_eps));
  M3_RETURN_IF_ERROR(t.get("intermediate_size", &c->intermediate_size));
  M3_RETURN_IF_ERROR(t.get("shared_intermediate_size", &c->shared_intermediate_size));
  M3_RETURN_IF_ERROR(t.get("dense_intermediate_size", &c->dense_intermediate_size));
  M3_RETURN_IF_ERROR(t.get("num_experts", &c->num_local_experts));  // attribute_map alias
  M3_RETURN_IF_ERROR(t.get("num_local_experts", &c->num_local_experts));
  M3_RETURN_IF_ERROR(t.get("num_experts_per_tok", &c->num_experts_per_tok));
  M3_RETURN_IF_ERROR(t.get("n_shared_experts", &c->n_shared_experts));
  M3_RETURN_IF_ERROR(t.get("routed_scaling_factor", &c->routed_scaling_factor));
  M3_RETURN_IF_ERROR(t.get("use_routing_bias", &c->use_routing_bias));
  M3_RETURN_IF_ERROR(t.get("swiglu_alpha", &c->swiglu_alpha));
  M3_RETURN_IF_ERROR(t.get("swiglu_limit", &c->swiglu_limit));
  std::string scoring = "sigmoid";
  M3_RETURN_IF_ERROR(t.get("scoring_func", &scoring));
  if (scoring != "sigmoid") {
    return unimplemented(source + ": " + c->field_prefix + "scoring_func '" + scoring +
                         "' is not supported (MiniMax-M3 routes with 'sigmoid')");
  }
  // hidden_act: the checkpoint says "swigluoai", transformers rewrites it to "silu"; either way the
  // MLP is SwiGLU-OAI with swiglu_alpha/limit, so the field is not used.
  M3_RETURN_IF_ERROR(parse_rope(t, c));
  M3_RETURN_IF_ERROR(parse_layer_kinds(t, c));
  M3_RETURN_IF_ERROR(parse_token_ids(t, top, c));

  // tie_word_embeddings: the wrapper's, or the text config's when that is true (transformers).
  bool tie_top = false, tie_text = false;
  M3_RETURN_IF_ERROR(top.get("tie_word_embeddings", &tie_top));
  if (text) M3_RETURN_IF_ERROR(t.get("tie_word_embeddings", &tie_text));
  c->tie_word_embeddings = tie_top || tie_text;

  M3_RETURN_IF_ERROR(top.get("image_token_id", &c->image_token_index));
  M3_RETURN_IF_ERROR(top.get("image_token_index", &c->image_token_index));
  M3_RETURN_IF_ERROR(top.get("video_token_id", &c->video_token_index));
  M3_RETURN_IF_ERROR(top.get("video_token_index", &c->video_token_index));
  M3_RETURN_IF_ERROR(parse_quantization(top, t, c));
  return Status::ok();
}

}  // namespace

Result<MiniMaxM3Config> parse_minimax_m3_config(const std::string& json_text,
                                                const std::string& source) {
  if (json_too_deep(json_text)) {
    return invalid_argument(source + ": nests more than " + std::to_string(kMaxJsonDepth) +
                            " levels deep");
  }
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not valid JSON");
  MiniMaxM3Config c;
  c.source = source;
  try {
    M3_RETURN_IF_ERROR(parse_into(root, source, &c));
  } catch (const json::exception& e) {
    // Every access above is type-checked first; this is a safety net, not a code path.
    return invalid_argument(source + ": unexpected JSON structure: " + e.what());
  }
  M3_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<MiniMaxM3Config> load_minimax_m3_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_minimax_m3_config(ss.str(), path);
}

Status MiniMaxM3Config::validate() const {
  auto fail = [&](const std::string& field, const std::string& what) {
    return invalid_argument(source + ": " + field_prefix + field + ": " + what);
  };
  auto positive = [&](const char* field, int64_t v) {
    return v > 0 ? Status::ok() : fail(field, "must be positive, found " + std::to_string(v));
  };
  M3_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  M3_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  M3_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  M3_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  M3_RETURN_IF_ERROR(positive("head_dim", head_dim));
  M3_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  M3_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  if (num_attention_heads % num_key_value_heads != 0) {
    return fail("num_key_value_heads", std::to_string(num_key_value_heads) +
                                           " does not divide num_attention_heads " +
                                           std::to_string(num_attention_heads));
  }
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return fail("rotary_dim", "must be even and in (0, head_dim = " + std::to_string(head_dim) +
                                  "], found " + std::to_string(rotary_dim));
  }
  if (!(rope_theta > 0.0)) return fail("rope_theta", "must be positive");
  if (!(rms_norm_eps > 0.0)) return fail("rms_norm_eps", "must be positive");
  const size_t n = size_t(num_hidden_layers);
  if (layer_types.size() != n) {
    return fail("layer_types", "has " + std::to_string(layer_types.size()) +
                                   " entries (from layer_types or "
                                   "sparse_attention_config.sparse_attention_freq), but "
                                   "num_hidden_layers is " + std::to_string(n));
  }
  if (mlp_layer_types.size() != n) {
    return fail("mlp_layer_types", "has " + std::to_string(mlp_layer_types.size()) +
                                       " entries (from mlp_layer_types or moe_layer_freq), but "
                                       "num_hidden_layers is " + std::to_string(n));
  }
  bool any_moe = false, any_dense = false, any_sparse = false;
  for (size_t i = 0; i < n; ++i) {
    any_moe = any_moe || mlp_layer_types[i] == MlpKind::kMoe;
    any_dense = any_dense || mlp_layer_types[i] == MlpKind::kDense;
    any_sparse = any_sparse || layer_types[i] == AttentionKind::kSparse;
  }
  if (any_dense) M3_RETURN_IF_ERROR(positive("dense_intermediate_size", dense_intermediate_size));
  if (any_moe) {
    M3_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
    M3_RETURN_IF_ERROR(positive("num_local_experts", num_local_experts));
    M3_RETURN_IF_ERROR(positive("num_experts_per_tok", num_experts_per_tok));
    if (num_experts_per_tok > num_local_experts) {
      return fail("num_experts_per_tok", std::to_string(num_experts_per_tok) +
                                             " exceeds num_local_experts " +
                                             std::to_string(num_local_experts));
    }
    if (n_shared_experts < 0) return fail("n_shared_experts", "must not be negative");
    if (n_shared_experts > 0) {
      M3_RETURN_IF_ERROR(positive("shared_intermediate_size", shared_intermediate_size));
    }
  }
  if (any_sparse) {
    if (index_n_heads != num_key_value_heads) {
      return fail("index_n_heads", std::to_string(index_n_heads) +
                                       " must equal num_key_value_heads " +
                                       std::to_string(num_key_value_heads) +
                                       " (one indexer head per KV group)");
    }
    M3_RETURN_IF_ERROR(positive("index_head_dim", index_head_dim));
    M3_RETURN_IF_ERROR(positive("index_block_size", index_block_size));
    M3_RETURN_IF_ERROR(positive("index_topk_blocks", index_topk_blocks));
    if (index_local_blocks < 0) return fail("index_local_blocks", "must not be negative");
    if (index_init_blocks < 0) return fail("index_init_blocks", "must not be negative");
    if (index_topk_blocks < index_local_blocks + index_init_blocks) {
      return fail("index_topk_blocks",
                  std::to_string(index_topk_blocks) + " is less than index_local_blocks (" +
                      std::to_string(index_local_blocks) + ") + index_init_blocks (" +
                      std::to_string(index_init_blocks) + "): the forced blocks would not fit");
    }
  }
  for (int64_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return fail("eos_token_id", std::to_string(id) + " is outside the vocabulary");
    }
  }
  if (bos_token_id >= vocab_size) {
    return fail("bos_token_id", std::to_string(bos_token_id) + " is outside the vocabulary");
  }
  return Status::ok();
}

}  // namespace m3

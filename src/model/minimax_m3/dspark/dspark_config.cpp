// Field names follow the released M3.1-Flash `dspark/config.json` (m3-architecture.md §5.2): a
// flat object whose text-model fields mirror the target's config, plus the dspark_* fields.
// Values the draft cannot run with are refused, never ignored: MoE or sparse (MSA) layers, full
// attention layers, Markov heads other than "vanilla", hybrid context fusion.
#include "model/minimax_m3/dspark/dspark_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_depth.h"

namespace m3::minimax_m3::dspark {
namespace {

using nlohmann::json;

// Typed reads of one JSON object; messages are "<file>: <prefix><key>: <what>".
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  Status error(const std::string& key, const std::string& what) const {
    return invalid_argument(source_ + ": " + prefix_ + key + ": " + what);
  }
  Status refuse(const std::string& key, const std::string& what) const {
    return unimplemented(source_ + ": " + prefix_ + key + ": " + what);
  }
  Status get(const std::string& key, int64_t* out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::ok();
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)))
      return error(key, "expected an integer, found " + v->dump());
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
  const std::string& source() const { return source_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& obj_;
  std::string source_, prefix_;
};

Status parse_architecture(const Reader& r) {
  const json* a = r.find("architectures");
  if (a == nullptr)
    return r.error("architectures", "missing (expected [\"DSparkMiniMaxDraftModel\"])");
  if (!a->is_array())
    return r.error("architectures", "expected a list of strings, found " + a->dump());
  for (const json& n : *a)
    if (n.is_string() && n.get<std::string>() == "DSparkMiniMaxDraftModel") return Status::ok();
  return r.error("architectures", a->dump() +
                                      " is not a DSpark draft of MiniMax-M3 (expected "
                                      "\"DSparkMiniMaxDraftModel\")");
}

// dense_intermediate_size and dspark_ffn_hidden_size name the same width; both may be present.
Status parse_ffn(const Reader& r, DSparkConfig* c) {
  int64_t dense = -1, ffn = -1;
  M3_RETURN_IF_ERROR(r.get("dense_intermediate_size", &dense));
  M3_RETURN_IF_ERROR(r.get("dspark_ffn_hidden_size", &ffn));
  if (dense >= 0 && ffn >= 0 && dense != ffn)
    return r.error(
        "dspark_ffn_hidden_size",
        std::to_string(ffn) + " differs from dense_intermediate_size " + std::to_string(dense));
  if (ffn >= 0)
    c->intermediate_size = ffn;
  else if (dense >= 0)
    c->intermediate_size = dense;
  bool dense_ffn = true;
  M3_RETURN_IF_ERROR(r.get("dspark_use_dense_ffn", &dense_ffn));
  if (!dense_ffn)
    return r.refuse("dspark_use_dense_ffn", "false (MoE draft layers) is not supported");
  if (const json* f = r.find("moe_layer_freq")) {
    bool any = f->is_number_integer() ? f->get<int64_t>() != 0 : !f->is_array();
    if (f->is_array())
      for (const json& x : *f) any = any || !(x.is_number_integer() && x.get<int64_t>() == 0);
    if (any)
      return r.refuse("moe_layer_freq", f->dump() +
                                            ": MoE draft layers are not supported "
                                            "(expected 0 for every layer)");
  }
  M3_RETURN_IF_ERROR(r.get("swiglu_alpha", &c->swiglu_alpha));
  M3_RETURN_IF_ERROR(r.get("swiglu_limit", &c->swiglu_limit));
  std::string act = "swigluoai";
  M3_RETURN_IF_ERROR(r.get("hidden_act", &act));
  if (act != "swigluoai" && act != "silu")  // transformers rewrites swigluoai to silu
    return r.refuse("hidden_act", "'" + act + "' is not supported (expected 'swigluoai')");
  return Status::ok();
}

Status parse_attention(const Reader& r, DSparkConfig* c) {
  if (r.find("sparse_attention_config") != nullptr)
    return r.refuse("sparse_attention_config",
                    "must be null: the draft has no sparse (MSA) layers");
  M3_RETURN_IF_ERROR(r.get("sliding_window", &c->sliding_window));
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array())
      return r.error("layer_types", "expected a list of strings, found " + lt->dump());
    if (int64_t(lt->size()) != c->num_hidden_layers)
      return r.error("layer_types", "has " + std::to_string(lt->size()) +
                                        " entries, but num_hidden_layers is " +
                                        std::to_string(c->num_hidden_layers));
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (!t.is_string() || t.get<std::string>() != "sliding_attention")
        return r.refuse(
            "layer_types[" + std::to_string(i) + "]",
            t.dump() + " is not supported (every draft layer is \"sliding_attention\")");
    }
  }
  return Status::ok();
}

// The RoPE rules of the target's parser (model_config.cpp): rope_parameters / rope_scaling first,
// then the top-level rope_theta / partial_rotary_factor / rotary_dim.
Status parse_rope(const Reader& r, DSparkConfig* c) {
  const char* rp_key = r.find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json* rp = r.find(rp_key);
  double factor = NAN;
  if (rp != nullptr) {
    if (!rp->is_object()) return r.error(rp_key, "expected an object, found " + rp->dump());
    Reader p(*rp, r.source(), std::string(rp_key) + ".");
    std::string type = "default";
    M3_RETURN_IF_ERROR(p.get("type", &type));
    M3_RETURN_IF_ERROR(p.get("rope_type", &type));
    if (type != "default")
      return p.refuse("rope_type", "'" + type + "' is not supported (only 'default')");
    if (p.find("rope_theta")) {
      double theta = 0;
      M3_RETURN_IF_ERROR(p.get("rope_theta", &theta));
      c->rope_theta = theta;
    }
    if (p.find("partial_rotary_factor"))
      M3_RETURN_IF_ERROR(p.get("partial_rotary_factor", &factor));
  }
  if (!c->rope_theta && r.find("rope_theta")) {
    double theta = 0;
    M3_RETURN_IF_ERROR(r.get("rope_theta", &theta));
    c->rope_theta = theta;
  }
  if (std::isnan(factor) && r.find("partial_rotary_factor"))
    M3_RETURN_IF_ERROR(r.get("partial_rotary_factor", &factor));
  if (!std::isnan(factor)) {
    if (!(factor > 0.0 && factor <= 1.0))
      return r.error("partial_rotary_factor", "must be in (0, 1], found " + std::to_string(factor));
    c->rotary_dim = int64_t(double(c->head_dim) * factor);
  } else if (r.find("rotary_dim")) {
    int64_t rd = 0;
    M3_RETURN_IF_ERROR(r.get("rotary_dim", &rd));
    c->rotary_dim = rd;
  }
  return Status::ok();
}

Status parse_dspark_fields(const Reader& r, DSparkConfig* c) {
  M3_RETURN_IF_ERROR(r.get("dspark_block_size", &c->block_size));
  M3_RETURN_IF_ERROR(r.get("dspark_noise_token_id", &c->noise_token_id));
  if (const json* ids = r.find("dspark_target_layer_ids")) {
    if (!ids->is_array() || ids->empty())
      return r.error("dspark_target_layer_ids",
                     "expected a non-empty list of layer ids, found " + ids->dump());
    c->target_layer_ids.clear();
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!(*ids)[i].is_number_integer())
        return r.error("dspark_target_layer_ids[" + std::to_string(i) + "]",
                       "expected an integer, found " + (*ids)[i].dump());
      c->target_layer_ids.push_back((*ids)[i].get<int64_t>());
    }
  }
  M3_RETURN_IF_ERROR(r.get("dspark_markov_rank", &c->markov_rank));
  std::string head = "vanilla";
  M3_RETURN_IF_ERROR(r.get("dspark_markov_head_type", &head));
  if (head != "vanilla")
    return r.refuse("dspark_markov_head_type", "'" + head + "' is not supported (only 'vanilla')");
  M3_RETURN_IF_ERROR(r.get("enable_confidence_head", &c->enable_confidence_head));
  M3_RETURN_IF_ERROR(r.get("confidence_head_with_markov", &c->confidence_head_with_markov));
  bool hybrid = false;
  M3_RETURN_IF_ERROR(r.get("dspark_hybrid_context_fusion", &hybrid));
  if (hybrid)
    return r.refuse(
        "dspark_hybrid_context_fusion",
        "true is not supported (the draft fuses target features with fc + hidden_norm only)");
  if (const json* dc = r.find("dspark_config")) {
    if (!dc->is_object())
      return r.error("dspark_config", "expected an object, found " + dc->dump());
    Reader d(*dc, r.source(), "dspark_config.");
    M3_RETURN_IF_ERROR(d.get("hybrid_context_fusion", &hybrid));
    if (hybrid)
      return d.refuse(
          "hybrid_context_fusion",
          "true is not supported (the draft fuses target features with fc + hidden_norm only)");
  }
  std::string conv = "layer_output";
  M3_RETURN_IF_ERROR(r.get("dspark_target_hidden_convention", &conv));
  if (conv == "layer_output")
    c->capture = CaptureConvention::kLayerOutput;
  else if (conv == "final_norm_last")
    c->capture = CaptureConvention::kFinalNormLast;
  else
    return r.error("dspark_target_hidden_convention",
                   "'" + conv + "' is not one of 'layer_output', 'final_norm_last'");
  return Status::ok();
}

Status parse_into(const json& root, DSparkConfig* c) {
  if (!root.is_object()) return invalid_argument(c->source + ": not a JSON object");
  Reader r(root, c->source);
  M3_RETURN_IF_ERROR(parse_architecture(r));
  M3_RETURN_IF_ERROR(r.get("num_hidden_layers", &c->num_hidden_layers));
  M3_RETURN_IF_ERROR(r.get("hidden_size", &c->hidden_size));
  M3_RETURN_IF_ERROR(r.get("num_attention_heads", &c->num_attention_heads));
  M3_RETURN_IF_ERROR(r.get("num_key_value_heads", &c->num_key_value_heads));
  M3_RETURN_IF_ERROR(r.get("head_dim", &c->head_dim));
  M3_RETURN_IF_ERROR(r.get("vocab_size", &c->vocab_size));
  M3_RETURN_IF_ERROR(r.get("rms_norm_eps", &c->rms_norm_eps));
  M3_RETURN_IF_ERROR(r.get("use_gemma_norm", &c->use_gemma_norm));
  M3_RETURN_IF_ERROR(parse_ffn(r, c));
  M3_RETURN_IF_ERROR(parse_attention(r, c));
  M3_RETURN_IF_ERROR(parse_rope(r, c));
  M3_RETURN_IF_ERROR(parse_dspark_fields(r, c));
  if (const json* q = r.find("quantization_config")) {
    if (!q->is_object())
      return r.error("quantization_config", "expected an object, found " + q->dump());
    Reader qr(*q, c->source, "quantization_config.");
    M3_RETURN_IF_ERROR(qr.get("quant_method", &c->quant_method));
    if (!c->quant_method.empty() && c->quant_method != "mxfp8")
      return qr.refuse("quant_method", "'" + c->quant_method +
                                           "' is not supported (the draft is "
                                           "BF16 or MXFP8)");
  }
  return Status::ok();
}

}  // namespace

const char* capture_convention_name(CaptureConvention c) {
  return c == CaptureConvention::kLayerOutput ? "layer_output" : "final_norm_last";
}

Status DSparkConfig::validate() const {
  auto fail = [&](const std::string& field, const std::string& what) {
    return invalid_argument(source + ": " + field + ": " + what);
  };
  auto positive = [&](const char* field, int64_t v) {
    return v > 0 ? Status::ok() : fail(field, "must be positive, found " + std::to_string(v));
  };
  M3_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  M3_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  M3_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  M3_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  M3_RETURN_IF_ERROR(positive("head_dim", head_dim));
  M3_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  M3_RETURN_IF_ERROR(positive("dspark_ffn_hidden_size", intermediate_size));
  M3_RETURN_IF_ERROR(positive("dspark_markov_rank", markov_rank));
  M3_RETURN_IF_ERROR(positive("dspark_block_size", block_size));
  if (num_attention_heads % num_key_value_heads != 0)
    return fail("num_key_value_heads", std::to_string(num_key_value_heads) +
                                           " does not divide num_attention_heads " +
                                           std::to_string(num_attention_heads));
  // The block attends to itself bidirectionally; its slots must lie inside every slot's window.
  if (sliding_window < block_size)
    return fail("sliding_window", std::to_string(sliding_window) +
                                      " is smaller than dspark_block_size " +
                                      std::to_string(block_size));
  if (noise_token_id < 0 || noise_token_id >= vocab_size)
    return fail("dspark_noise_token_id", std::to_string(noise_token_id) +
                                             " is outside the vocabulary [0, " +
                                             std::to_string(vocab_size) + ")");
  if (rotary_dim && (*rotary_dim <= 0 || *rotary_dim % 2 != 0 || *rotary_dim > head_dim))
    return fail("rotary_dim", "must be even and in (0, head_dim = " + std::to_string(head_dim) +
                                  "], found " + std::to_string(*rotary_dim));
  if (rope_theta && !(*rope_theta > 0.0)) return fail("rope_theta", "must be positive");
  if (!(rms_norm_eps > 0.0)) return fail("rms_norm_eps", "must be positive");
  if (!(swiglu_limit > 0.0)) return fail("swiglu_limit", "must be positive");
  for (size_t i = 0; i < target_layer_ids.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (target_layer_ids[i] == target_layer_ids[j])
        return fail("dspark_target_layer_ids",
                    "lists layer " + std::to_string(target_layer_ids[i]) + " twice");
  return Status::ok();
}

Status DSparkConfig::resolve_with_target(const MiniMaxM3Config& t) {
  auto fail = [&](const std::string& field, const std::string& what) {
    return invalid_argument(source + ": " + field + ": " + what + " (target " + t.source + ")");
  };
  // The draft shares the target's embedding table and lm_head.
  if (hidden_size != t.hidden_size)
    return fail("hidden_size", std::to_string(hidden_size) + " != the target's hidden_size " +
                                   std::to_string(t.hidden_size));
  if (vocab_size != t.vocab_size)
    return fail("vocab_size", std::to_string(vocab_size) + " != the target's vocab_size " +
                                  std::to_string(t.vocab_size));
  for (size_t i = 0; i < target_layer_ids.size(); ++i) {
    const int64_t id = target_layer_ids[i];
    if (id < 0 || id >= t.num_hidden_layers)
      return fail("dspark_target_layer_ids[" + std::to_string(i) + "]",
                  std::to_string(id) + " is not a target layer (the target has " +
                      std::to_string(t.num_hidden_layers) + " layers)");
  }
  if (!rope_theta) rope_theta = t.rope_theta;
  if (!rotary_dim) rotary_dim = std::min(t.rotary_dim, head_dim);
  return validate();
}

Result<DSparkConfig> parse_dspark_config(const std::string& json_text, const std::string& source) {
  if (json_too_deep(json_text))
    return invalid_argument(source + ": nests more than " + std::to_string(kMaxJsonDepth) +
                            " levels deep");
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not valid JSON");
  DSparkConfig c;
  c.source = source;
  try {
    M3_RETURN_IF_ERROR(parse_into(root, &c));
  } catch (const json::exception& e) {
    return invalid_argument(source + ": unexpected JSON structure: " + e.what());
  }
  M3_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<DSparkConfig> load_dspark_config(const std::string& dspark_dir) {
  const std::string path = (std::filesystem::path(dspark_dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_dspark_config(ss.str(), path);
}

}  // namespace m3::minimax_m3::dspark

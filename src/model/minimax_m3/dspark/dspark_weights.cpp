#include "model/minimax_m3/dspark/dspark_weights.h"

#include <algorithm>

namespace m3::minimax_m3::dspark {
namespace {

std::string layer_prefix(const std::string& prefix, int64_t i) {
  return prefix + "layers." + std::to_string(i) + ".decoder_layer.";
}

class Loader {
 public:
  Loader(const WeightSource& src, Backend* backend, std::string where)
      : src_(src), backend_(backend), where_(std::move(where)) {}

  Result<HostTensorF32> host(const std::string& name, const std::vector<int64_t>& shape) {
    if (!src_.has(name))
      return not_found("[model.minimax_m3.dspark] " + where_ + ": missing tensor '" + name + "'");
    Result<HostTensorF32> t = src_.load_f32(name, shape);
    if (!t.is_ok())
      return Status(t.status().code(), "[model.minimax_m3.dspark] " + where_ + ": tensor '" + name +
                                           "': " + t.status().message());
    return t;
  }
  Result<DeviceBuffer<float>> load(const std::string& name, const std::vector<int64_t>& shape) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, host(name, shape));
    return upload(t.data);
  }
  DeviceBuffer<float> upload(const std::vector<float>& v) {
    DeviceBuffer<float> b(backend_, static_cast<int64_t>(v.size()));
    if (!v.empty())
      backend_->copy_to_device(b.data(), v.data(), static_cast<int64_t>(v.size() * sizeof(float)));
    return b;
  }

 private:
  const WeightSource& src_;
  Backend* backend_;
  std::string where_;
};

}  // namespace

const std::vector<std::string>& dspark_prefixes() {
  static const std::vector<std::string> kPrefixes = {"language_model.model.dspark.",
                                                     "model.dspark.", "dspark.", ""};
  return kPrefixes;
}

std::vector<std::string> dspark_weight_names(const DSparkConfig& c, const std::string& prefix) {
  std::vector<std::string> n;
  for (const char* s : {"fc.weight", "hidden_norm.weight", "final_norm.weight",
                        "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"})
    n.push_back(prefix + s);
  if (c.enable_confidence_head) {
    n.push_back(prefix + "confidence_head.proj.weight");
    n.push_back(prefix + "confidence_head.proj.bias");
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(prefix, i);
    for (const char* s :
         {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
          "mlp.up_proj.weight", "mlp.down_proj.weight"})
      n.push_back(p + s);
  }
  std::sort(n.begin(), n.end());
  return n;
}

Result<DSparkWeights> load_dspark_weights(const WeightSource& src, const DSparkConfig& c,
                                          Backend* backend, const std::string& where) {
  M3_RETURN_IF_ERROR(c.validate());
  DSparkWeights w;
  bool found = false;
  std::string tried;
  for (const std::string& p : dspark_prefixes()) {
    tried += (tried.empty() ? "'" : ", '") + p + "fc.weight'";
    if (src.has(p + "fc.weight")) {
      w.prefix = p;
      found = true;
      break;
    }
  }
  if (!found)
    return not_found("[model.minimax_m3.dspark] " + where + ": no DSpark draft found: looked for " +
                     tried);
  Loader ld(src, backend, where);
  const int64_t hd = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, inter = c.intermediate_size, v = c.vocab_size,
                r = c.markov_rank;
  const std::string& p = w.prefix;
  M3_ASSIGN_OR_RETURN(w.fc, ld.load(p + "fc.weight", {hd, c.feature_width()}));
  M3_ASSIGN_OR_RETURN(w.hidden_norm, ld.load(p + "hidden_norm.weight", {hd}));
  M3_ASSIGN_OR_RETURN(w.final_norm, ld.load(p + "final_norm.weight", {hd}));
  M3_ASSIGN_OR_RETURN(w.markov_w1, ld.load(p + "markov_head.markov_w1.weight", {v, r}));
  M3_ASSIGN_OR_RETURN(w.markov_w2, ld.load(p + "markov_head.markov_w2.weight", {v, r}));
  if (c.enable_confidence_head) {
    const int64_t in = hd + (c.confidence_head_with_markov ? r : 0);
    M3_ASSIGN_OR_RETURN(w.confidence_w, ld.load(p + "confidence_head.proj.weight", {1, in}));
    M3_ASSIGN_OR_RETURN(w.confidence_b, ld.load(p + "confidence_head.proj.bias", {1}));
  }
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DSparkLayerWeights& lw = w.layers[static_cast<size_t>(i)];
    const std::string l = layer_prefix(p, i), a = l + "self_attn.", m = l + "mlp.";
    M3_ASSIGN_OR_RETURN(lw.input_norm, ld.load(l + "input_layernorm.weight", {hd}));
    M3_ASSIGN_OR_RETURN(lw.post_norm, ld.load(l + "post_attention_layernorm.weight", {hd}));
    M3_ASSIGN_OR_RETURN(lw.wq, ld.load(a + "q_proj.weight", {nh * d, hd}));
    M3_ASSIGN_OR_RETURN(lw.wk, ld.load(a + "k_proj.weight", {nkv * d, hd}));
    M3_ASSIGN_OR_RETURN(lw.wv, ld.load(a + "v_proj.weight", {nkv * d, hd}));
    M3_ASSIGN_OR_RETURN(lw.wo, ld.load(a + "o_proj.weight", {hd, nh * d}));
    M3_ASSIGN_OR_RETURN(lw.q_norm, ld.load(a + "q_norm.weight", {d}));
    M3_ASSIGN_OR_RETURN(lw.k_norm, ld.load(a + "k_norm.weight", {d}));
    M3_ASSIGN_OR_RETURN(HostTensorF32 gate, ld.host(m + "gate_proj.weight", {inter, hd}));
    M3_ASSIGN_OR_RETURN(HostTensorF32 up, ld.host(m + "up_proj.weight", {inter, hd}));
    gate.data.insert(gate.data.end(), up.data.begin(), up.data.end());
    lw.mlp_w13 = ld.upload(gate.data);
    M3_ASSIGN_OR_RETURN(lw.mlp_w2, ld.load(m + "down_proj.weight", {hd, inter}));
  }
  return w;
}

TargetSharedWeights TargetSharedWeights::view_of(const ModelWeights& w) {
  TargetSharedWeights t;
  t.embed = w.embed.data();
  t.lm_head = w.lm_head.data();
  t.final_norm = w.final_norm.data();
  return t;
}

Result<TargetSharedWeights> TargetSharedWeights::load(const WeightSource& src,
                                                      const MiniMaxM3Config& cfg,
                                                      Backend* backend) {
  M3_ASSIGN_OR_RETURN(WeightNaming naming, detect_naming(src, cfg));
  Loader ld(src, backend, "target");
  const int64_t v = cfg.vocab_size, hd = cfg.hidden_size;
  TargetSharedWeights t;
  const std::string embed = naming.model_prefix + "embed_tokens.weight";
  M3_ASSIGN_OR_RETURN(t.owned_embed, ld.load(embed, {v, hd}));
  M3_ASSIGN_OR_RETURN(t.owned_lm_head,
                      ld.load(naming.lm_head.empty() ? embed : naming.lm_head, {v, hd}));
  M3_ASSIGN_OR_RETURN(t.owned_final_norm, ld.load(naming.model_prefix + "norm.weight", {hd}));
  t.embed = t.owned_embed.data();
  t.lm_head = t.owned_lm_head.data();
  t.final_norm = t.owned_final_norm.data();
  return t;
}

}  // namespace m3::minimax_m3::dspark

#include "model/minimax_m3/weights.h"

#include <algorithm>
#include <cstring>

namespace m3::minimax_m3 {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
  return s;
}

// The first of `candidates` present in the checkpoint, or not_found naming them all.
Result<std::string> first_present(const WeightSource& src,
                                  const std::vector<std::string>& candidates) {
  for (const std::string& c : candidates)
    if (src.has(c)) return c;
  return not_found("[model.minimax_m3.weights] missing tensor: looked for " + join(candidates));
}

class Loader {
 public:
  Loader(const WeightSource& src, Backend* backend) : src_(src), backend_(backend) {}

  // Loads `name` with `shape` into a new device buffer.
  Result<DeviceBuffer<float>> load(const std::string& name, const std::vector<int64_t>& shape) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32(name, shape));
    return upload(t.data);
  }

  // Rows [begin, begin + count) of `name` [rows, cols]: only those rows are read.
  Result<DeviceBuffer<float>> load_rows(const std::string& name, int64_t rows, int64_t cols,
                                        int64_t begin, int64_t count) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32_window(
                                             name, {rows, cols},
                                             WeightWindow::row_range(begin, begin + count, cols)));
    return upload(t.data);
  }

  // Columns [begin, begin + count) of `name` [rows, cols]: only each row's sub-range is read.
  // A quantised weight is read by whole scale blocks (load_f32_window's rule); where the slice
  // does not fall on them (tiny test models: 32 inputs over 4 ranks of NVFP4), the covering blocks
  // are read and the slice cut from them: dequantisation is per element, so the values are exact,
  // and at most one block per row edge is read beyond the slice.
  Result<DeviceBuffer<float>> load_cols(const std::string& name, int64_t rows, int64_t cols,
                                        int64_t begin, int64_t count) {
    M3_ASSIGN_OR_RETURN(WeightFormat format, src_.format(name));
    const int64_t block = weight_format_block(format);
    const int64_t lo = begin / block * block;
    const int64_t hi = std::min(cols, (begin + count + block - 1) / block * block);
    const WeightWindow covering = WeightWindow::col_range(rows, lo, hi);
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32_window(name, {rows, cols}, covering));
    if (lo == begin && hi == begin + count) return upload(t.data);
    std::vector<float> out(static_cast<size_t>(rows * count));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(t.data.begin() + r * (hi - lo) + (begin - lo), count, out.begin() + r * count);
    return upload(out);
  }

  // Rows [begin, begin + count) of gate [I, Hd] and of up [I, Hd] into one [2·count, Hd] buffer
  // (gate rows first).
  Result<DeviceBuffer<float>> load_gate_up(const std::string& gate, const std::string& up,
                                           int64_t inter, int64_t hidden, int64_t begin,
                                           int64_t count) {
    const WeightWindow w = WeightWindow::row_range(begin, begin + count, hidden);
    M3_ASSIGN_OR_RETURN(HostTensorF32 g, src_.load_f32_window(gate, {inter, hidden}, w));
    M3_ASSIGN_OR_RETURN(HostTensorF32 u, src_.load_f32_window(up, {inter, hidden}, w));
    g.data.insert(g.data.end(), u.data.begin(), u.data.end());
    return upload(g.data);
  }

  // The same from a fused gate_up_proj [2·I, Hd]: the two row ranges of the one tensor.
  Result<DeviceBuffer<float>> load_fused_gate_up(const std::string& name, int64_t inter,
                                                 int64_t hidden, int64_t begin, int64_t count) {
    const WeightWindow gate = WeightWindow::row_range(begin, begin + count, hidden);
    const WeightWindow up = WeightWindow::row_range(inter + begin, inter + begin + count, hidden);
    M3_ASSIGN_OR_RETURN(HostTensorF32 g, src_.load_f32_window(name, {2 * inter, hidden}, gate));
    M3_ASSIGN_OR_RETURN(HostTensorF32 u, src_.load_f32_window(name, {2 * inter, hidden}, up));
    g.data.insert(g.data.end(), u.data.begin(), u.data.end());
    return upload(g.data);
  }

  DeviceBuffer<float> upload(const std::vector<float>& host) {
    DeviceBuffer<float> b(backend_, static_cast<int64_t>(host.size()));
    backend_->copy_to_device(b.data(), host.data(),
                             static_cast<int64_t>(host.size() * sizeof(float)));
    return b;
  }

 private:
  const WeightSource& src_;
  Backend* backend_;
};

// A dense SwiGLU MLP stored as gate/up/down projections under `base` ("...mlp." etc.), or with a
// fused gate_up_proj [2·I, Hd] (HF's in-memory layout); intermediate columns [begin, begin +
// count) of `inter`.
Status load_mlp(Loader& ld, const WeightSource& src, const std::string& base, int64_t inter,
                int64_t hidden, int64_t begin, int64_t count, DeviceBuffer<float>* w13,
                DeviceBuffer<float>* w2) {
  if (src.has(base + "gate_up_proj.weight")) {
    M3_ASSIGN_OR_RETURN(*w13, ld.load_fused_gate_up(base + "gate_up_proj.weight", inter, hidden,
                                                    begin, count));
  } else {
    M3_ASSIGN_OR_RETURN(*w13, ld.load_gate_up(base + "gate_proj.weight", base + "up_proj.weight",
                                              inter, hidden, begin, count));
  }
  M3_ASSIGN_OR_RETURN(*w2, ld.load_cols(base + "down_proj.weight", hidden, inter, begin, count));
  return Status::ok();
}

Status load_layer(Loader& ld, const WeightSource& src, const MiniMaxM3Config& c,
                  const RankSlices& rs, const WeightNaming& naming, int64_t i, LayerWeights* lw) {
  const std::string p = naming.layer(i);
  const int64_t hd = c.hidden_size, d = c.head_dim;
  lw->sparse = c.layer_types[i] == AttentionKind::kSparse;
  lw->moe = c.mlp_layer_types[i] == MlpKind::kMoe;
  M3_ASSIGN_OR_RETURN(lw->input_norm, ld.load(p + "input_layernorm.weight", {hd}));
  M3_ASSIGN_OR_RETURN(lw->post_norm, ld.load(p + "post_attention_layernorm.weight", {hd}));
  const std::string a = p + "self_attn.";
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  M3_ASSIGN_OR_RETURN(lw->wq, ld.load_rows(a + "q_proj.weight", nh * d, hd, rs.q_begin * d,
                                           rs.q_count * d));
  M3_ASSIGN_OR_RETURN(lw->wk, ld.load_rows(a + "k_proj.weight", nkv * d, hd, rs.kv_begin * d,
                                           rs.kv_count * d));
  M3_ASSIGN_OR_RETURN(lw->wv, ld.load_rows(a + "v_proj.weight", nkv * d, hd, rs.kv_begin * d,
                                           rs.kv_count * d));
  M3_ASSIGN_OR_RETURN(lw->wo, ld.load_cols(a + "o_proj.weight", hd, nh * d, rs.q_begin * d,
                                           rs.q_count * d));
  M3_ASSIGN_OR_RETURN(lw->q_norm, ld.load(a + "q_norm.weight", {d}));
  M3_ASSIGN_OR_RETURN(lw->k_norm, ld.load(a + "k_norm.weight", {d}));
  if (lw->sparse) {
    const int64_t dix = c.index_head_dim;
    // Original names (§3.1); HF's in-memory module path (self_attn.indexer.*) as a fallback.
    auto pick = [&](const std::string& orig, const std::string& hf) {
      return first_present(src, {a + orig, a + hf});
    };
    M3_ASSIGN_OR_RETURN(std::string iq, pick("index_q_proj.weight", "indexer.q_proj.weight"));
    M3_ASSIGN_OR_RETURN(std::string ik, pick("index_k_proj.weight", "indexer.k_proj.weight"));
    M3_ASSIGN_OR_RETURN(std::string iqn, pick("index_q_norm.weight", "indexer.q_norm.weight"));
    M3_ASSIGN_OR_RETURN(std::string ikn, pick("index_k_norm.weight", "indexer.k_norm.weight"));
    // Index head h selects the blocks of KV head h: the rank's KV heads' index heads.
    M3_ASSIGN_OR_RETURN(lw->wiq, ld.load_rows(iq, c.index_n_heads * dix, hd, rs.kv_begin * dix,
                                              rs.kv_count * dix));
    M3_ASSIGN_OR_RETURN(lw->wik, ld.load(ik, {dix, hd}));
    M3_ASSIGN_OR_RETURN(lw->iq_norm, ld.load(iqn, {dix}));
    M3_ASSIGN_OR_RETURN(lw->ik_norm, ld.load(ikn, {dix}));
  }
  const std::string m = p + "block_sparse_moe.";
  if (!lw->moe) {
    // The dense MLP appears as mlp.* (HF) or block_sparse_moe.*_proj (original checkpoint).
    std::string base;
    for (const std::string& b : {p + "mlp.", m}) {
      if (src.has(b + "gate_proj.weight") || src.has(b + "gate_up_proj.weight")) {
        base = b;
        break;
      }
    }
    if (base.empty())
      return not_found("[model.minimax_m3.weights] missing dense MLP of layer " +
                       std::to_string(i) + ": looked for '" + p + "mlp.gate_proj.weight' and '" +
                       m + "gate_proj.weight'");
    return load_mlp(ld, src, base, c.dense_intermediate_size, hd, rs.dense_begin, rs.dense_count,
                    &lw->mlp_w13, &lw->mlp_w2);
  }
  const int64_t ne = c.num_local_experts, inter = c.intermediate_size;
  M3_ASSIGN_OR_RETURN(lw->router, ld.load(m + "gate.weight", {ne, hd}));
  if (src.has(m + "e_score_correction_bias") || src.has(m + "gate.e_score_correction_bias")) {
    std::string bias_name = src.has(m + "e_score_correction_bias")
                                ? m + "e_score_correction_bias"
                                : m + "gate.e_score_correction_bias";
    M3_ASSIGN_OR_RETURN(lw->router_bias, ld.load(bias_name, {ne}));
  } else if (c.use_routing_bias) {
    return not_found("[model.minimax_m3.weights] missing tensor '" + m +
                     "e_score_correction_bias' (use_routing_bias is true)");
  } else {
    lw->router_bias = ld.upload(std::vector<float>(static_cast<size_t>(ne), 0.0f));
  }
  // Only the rank's experts are read: [expert_begin, expert_begin + expert_count), local index
  // e - expert_begin (all of them without expert parallelism).
  lw->expert_begin = rs.expert_begin;
  lw->expert_w13.resize(static_cast<size_t>(rs.expert_count));
  lw->expert_w2.resize(static_cast<size_t>(rs.expert_count));
  for (int64_t l = 0; l < rs.expert_count; ++l) {
    const std::string x = m + "experts." + std::to_string(rs.expert_begin + l) + ".";
    M3_ASSIGN_OR_RETURN(lw->expert_w13[l], ld.load_gate_up(x + "w1.weight", x + "w3.weight", inter,
                                                           hd, rs.inter_begin, rs.inter_count));
    M3_ASSIGN_OR_RETURN(lw->expert_w2[l],
                        ld.load_cols(x + "w2.weight", hd, inter, rs.inter_begin, rs.inter_count));
    lw->expert_w13_ptrs.push_back(lw->expert_w13[l].data());
    lw->expert_w2_ptrs.push_back(lw->expert_w2[l].data());
  }
  const int64_t shared = c.shared_intermediate_size * c.n_shared_experts;
  lw->shared_inter = rs.shared_count;
  if (shared > 0) {
    M3_RETURN_IF_ERROR(load_mlp(ld, src, m + "shared_experts.", shared, hd, rs.shared_begin,
                                rs.shared_count, &lw->shared_w13, &lw->shared_w2));
  }
  return Status::ok();
}

}  // namespace

Result<WeightNaming> detect_naming(const WeightSource& src, const MiniMaxM3Config& cfg) {
  struct Option {
    const char* prefix;
    const char* lm_head;
  };
  // Original multimodal checkpoint, bare text model, HF's in-memory VL layout.
  const Option options[] = {{"language_model.model.", "language_model.lm_head.weight"},
                            {"model.", "lm_head.weight"},
                            {"model.language_model.", "lm_head.weight"}};
  std::vector<std::string> tried;
  for (const Option& o : options) {
    std::string embed = std::string(o.prefix) + "embed_tokens.weight";
    tried.push_back(embed);
    if (!src.has(embed)) continue;
    WeightNaming n{o.prefix, o.lm_head};
    if (!src.has(n.lm_head)) {
      if (!cfg.tie_word_embeddings)
        return not_found("[model.minimax_m3.weights] missing tensor '" + n.lm_head +
                         "' (tie_word_embeddings is false)");
      n.lm_head.clear();
    }
    return n;
  }
  return not_found("[model.minimax_m3.weights] no text model found: looked for " + join(tried));
}

Result<ModelWeights> load_weights(const WeightSource& src, const MiniMaxM3Config& cfg,
                                  Backend* backend, const ParallelLayout& tp) {
  M3_RETURN_IF_ERROR(cfg.validate());
  M3_RETURN_IF_ERROR(check_tensor_parallel(cfg, tp.ranks, tp.ep, tp.dp));
  const RankSlices rs = rank_slices(cfg, tp.rank, tp.ranks, tp.ep, tp.dp);
  ModelWeights w;
  M3_ASSIGN_OR_RETURN(w.naming, detect_naming(src, cfg));
  Loader ld(src, backend);
  const int64_t v = cfg.vocab_size, hd = cfg.hidden_size;
  M3_ASSIGN_OR_RETURN(w.embed, ld.load(w.naming.model_prefix + "embed_tokens.weight", {v, hd}));
  M3_ASSIGN_OR_RETURN(w.final_norm, ld.load(w.naming.model_prefix + "norm.weight", {hd}));
  const std::string head =
      w.naming.lm_head.empty() ? w.naming.model_prefix + "embed_tokens.weight" : w.naming.lm_head;
  if (tp.ranks > 1 && !(tp.rank == 0 && tp.whole_lm_head_on_rank0)) {
    // Only the rank's vocabulary rows are read (tensor_parallel.h).
    w.lm_head_first_row = rs.vocab_begin;
    M3_ASSIGN_OR_RETURN(w.lm_head, ld.load_rows(head, v, hd, rs.vocab_begin, rs.vocab_count));
  } else {
    M3_ASSIGN_OR_RETURN(w.lm_head, ld.load(head, {v, hd}));
  }
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    M3_RETURN_IF_ERROR(load_layer(ld, src, cfg, rs, w.naming, i, &w.layers[i]));
  return w;
}

}  // namespace m3::minimax_m3

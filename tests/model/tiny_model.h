// Test helpers: an in-memory WeightSource, tiny MiniMax-M3-shaped configs with random weights
// under the original checkpoint names (m3-architecture.md §4.2), and an independent
// double-precision reference forward pass written from §2-§3 (dense masks, no paging, no reuse
// of model or backend code).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "loader/model_config.h"
#include "loader/weight_source.h"

namespace m3::testing {

class MemoryWeightSource : public WeightSource {
 public:
  std::map<std::string, HostTensorF32> tensors;

  bool has(const std::string& name) const override { return tensors.count(name) > 0; }
  Result<WeightFormat> format(const std::string& name) const override {
    if (!has(name)) return not_found("memory: no tensor '" + name + "'");
    return WeightFormat::kF32;
  }
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& shape) const override {
    auto it = tensors.find(name);
    if (it == tensors.end()) return not_found("memory: no tensor '" + name + "'");
    if (it->second.shape != shape) return invalid_argument("memory: '" + name + "' has another shape");
    return it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : tensors) n.push_back(k);
    return n;
  }
  const std::vector<float>& get(const std::string& name) const { return tensors.at(name).data; }
};

// A tiny config: 3 layers (sparse + dense MLP, full + MoE, sparse + MoE), blocks of 4 tokens,
// top-3 blocks, so sequences of a few dozen tokens exercise real block selection.
// `n` token ids in [0, vocab), reproducible from `seed`.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

inline MiniMaxM3Config tiny_config() {
  MiniMaxM3Config c;
  c.model_type = "minimax_m3_vl";
  c.hidden_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 300;
  c.max_position_embeddings = 4096;
  c.rope_theta = 10000.0;
  c.rotary_dim = 8;
  c.rms_norm_eps = 1e-6;
  c.intermediate_size = 32;
  c.shared_intermediate_size = 24;
  c.dense_intermediate_size = 48;
  c.num_local_experts = 6;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.routed_scaling_factor = 2.0;
  c.use_routing_bias = true;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_block_size = 4;
  c.index_topk_blocks = 3;
  c.index_local_blocks = 1;
  c.index_init_blocks = 0;
  c.layer_types = {AttentionKind::kSparse, AttentionKind::kFull, AttentionKind::kSparse};
  c.mlp_layer_types = {MlpKind::kDense, MlpKind::kMoe, MlpKind::kMoe};
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

struct NamingStyle {
  std::string model_prefix = "language_model.model.";
  std::string lm_head = "language_model.lm_head.weight";
  bool dense_under_moe = false;  // dense MLP as block_sparse_moe.{gate,up,down}_proj
};

// Random weights. Linear weights ~ N(0, 1/in) keep activations O(1); norm weights are offsets
// from 1 (N(0, 0.2)); the router bias is N(0, 0.3) so it changes selections.
inline MemoryWeightSource random_weights(const MiniMaxM3Config& c, uint32_t seed,
                                         const NamingStyle& style = {}) {
  MemoryWeightSource src;
  std::mt19937 rng(seed);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float stddev) {
    HostTensorF32 t;
    t.shape = shape;
    std::normal_distribution<float> dist(0.0f, stddev);
    t.data.resize(static_cast<size_t>(t.numel()));
    for (float& x : t.data) x = dist(rng);
    src.tensors[name] = std::move(t);
  };
  auto lin = [&](const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
  };
  const int64_t hd = c.hidden_size, d = c.head_dim;
  const std::string& mp = style.model_prefix;
  add(mp + "embed_tokens.weight", {c.vocab_size, hd}, 1.0f);
  add(mp + "norm.weight", {hd}, 0.2f);
  lin(style.lm_head, c.vocab_size, hd);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = mp + "layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {hd}, 0.2f);
    add(p + "post_attention_layernorm.weight", {hd}, 0.2f);
    lin(p + "self_attn.q_proj.weight", c.num_attention_heads * d, hd);
    lin(p + "self_attn.k_proj.weight", c.num_key_value_heads * d, hd);
    lin(p + "self_attn.v_proj.weight", c.num_key_value_heads * d, hd);
    lin(p + "self_attn.o_proj.weight", hd, c.num_attention_heads * d);
    add(p + "self_attn.q_norm.weight", {d}, 0.2f);
    add(p + "self_attn.k_norm.weight", {d}, 0.2f);
    if (c.layer_types[i] == AttentionKind::kSparse) {
      lin(p + "self_attn.index_q_proj.weight", c.index_n_heads * c.index_head_dim, hd);
      lin(p + "self_attn.index_k_proj.weight", c.index_head_dim, hd);
      add(p + "self_attn.index_q_norm.weight", {c.index_head_dim}, 0.2f);
      add(p + "self_attn.index_k_norm.weight", {c.index_head_dim}, 0.2f);
    }
    std::string m = p + "block_sparse_moe.";
    if (c.mlp_layer_types[i] == MlpKind::kDense) {
      std::string b = style.dense_under_moe ? m : p + "mlp.";
      lin(b + "gate_proj.weight", c.dense_intermediate_size, hd);
      lin(b + "up_proj.weight", c.dense_intermediate_size, hd);
      lin(b + "down_proj.weight", hd, c.dense_intermediate_size);
    } else {
      lin(m + "gate.weight", c.num_local_experts, hd);
      add(m + "e_score_correction_bias", {c.num_local_experts}, 0.3f);
      for (int64_t e = 0; e < c.num_local_experts; ++e) {
        std::string x = m + "experts." + std::to_string(e) + ".";
        lin(x + "w1.weight", c.intermediate_size, hd);
        lin(x + "w3.weight", c.intermediate_size, hd);
        lin(x + "w2.weight", hd, c.intermediate_size);
      }
      int64_t si = c.shared_intermediate_size * c.n_shared_experts;
      if (si > 0) {
        lin(m + "shared_experts.gate_proj.weight", si, hd);
        lin(m + "shared_experts.up_proj.weight", si, hd);
        lin(m + "shared_experts.down_proj.weight", hd, si);
      }
    }
  }
  return src;
}

// ---------------------------------------------------------------------------------------------
// Reference forward (double precision), straight from m3-architecture.md §2-§3 and HF semantics.
// ---------------------------------------------------------------------------------------------

namespace ref {

using Vec = std::vector<double>;

inline Vec matvec(const std::vector<float>& w, const Vec& x, int64_t out, int64_t in) {
  Vec y(static_cast<size_t>(out), 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) y[o] += static_cast<double>(w[o * in + i]) * x[i];
  return y;
}

// Gemma RMSNorm of x[off, off + n).
inline void gemma_norm(Vec& x, int64_t off, int64_t n, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) x[off + i] = x[off + i] * inv * (1.0 + w[i]);
}

// HF rotate_half RoPE on x[off, off + width) with the table emb = cat(f, f), f of rotary_dim / 2.
inline void rope(Vec& x, int64_t off, int64_t width, int64_t rotary_dim, double theta, int64_t pos) {
  Vec out(static_cast<size_t>(width));
  for (int64_t dd = 0; dd < width; ++dd) {
    int64_t f = dd % (rotary_dim / 2);
    double a = pos * std::pow(theta, -2.0 * f / rotary_dim);
    double partner = dd < width / 2 ? -x[off + dd + width / 2] : x[off + dd - width / 2];
    out[dd] = x[off + dd] * std::cos(a) + partner * std::sin(a);
  }
  for (int64_t dd = 0; dd < width; ++dd) x[off + dd] = out[dd];
}

inline double swiglu(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return g / (1.0 + std::exp(-alpha * g)) * (u + 1.0);
}

inline Vec mlp(const MemoryWeightSource& s, const std::string& gate, const std::string& up,
               const std::string& down, const Vec& h, int64_t inter, int64_t hd,
               const MiniMaxM3Config& c) {
  Vec g = matvec(s.get(gate), h, inter, hd), u = matvec(s.get(up), h, inter, hd);
  for (int64_t i = 0; i < inter; ++i) g[i] = swiglu(g[i], u[i], c.swiglu_alpha, c.swiglu_limit);
  return matvec(s.get(down), g, hd, inter);
}

// Logits [T][V] for every position of `tokens` (positions 0..T-1).
inline std::vector<Vec> forward(const MiniMaxM3Config& c, const MemoryWeightSource& s,
                                const std::vector<int32_t>& tokens, const NamingStyle& style = {}) {
  const int64_t T = static_cast<int64_t>(tokens.size()), hd = c.hidden_size, d = c.head_dim;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, bs = c.index_block_size;
  const int64_t Hix = c.index_n_heads, Dix = c.index_head_dim;
  const std::string& mp = style.model_prefix;
  std::vector<Vec> x(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const auto& e = s.get(mp + "embed_tokens.weight");
    x[t].assign(e.begin() + tokens[t] * hd, e.begin() + (tokens[t] + 1) * hd);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string p = mp + "layers." + std::to_string(l) + ".", a = p + "self_attn.";
    bool sparse = c.layer_types[l] == AttentionKind::kSparse;
    std::vector<Vec> q(T), k(T), v(T), iq(T), ik(T), hs(T);
    for (int64_t t = 0; t < T; ++t) {
      Vec h = x[t];
      gemma_norm(h, 0, hd, s.get(p + "input_layernorm.weight"), c.rms_norm_eps);
      hs[t] = h;
      q[t] = matvec(s.get(a + "q_proj.weight"), h, H * d, hd);
      k[t] = matvec(s.get(a + "k_proj.weight"), h, Hkv * d, hd);
      v[t] = matvec(s.get(a + "v_proj.weight"), h, Hkv * d, hd);
      for (int64_t n = 0; n < H; ++n) {
        gemma_norm(q[t], n * d, d, s.get(a + "q_norm.weight"), c.rms_norm_eps);
        rope(q[t], n * d, c.rotary_dim, c.rotary_dim, c.rope_theta, t);
      }
      for (int64_t n = 0; n < Hkv; ++n) {
        gemma_norm(k[t], n * d, d, s.get(a + "k_norm.weight"), c.rms_norm_eps);
        rope(k[t], n * d, c.rotary_dim, c.rotary_dim, c.rope_theta, t);
      }
      if (sparse) {
        int64_t w = std::min(c.rotary_dim, Dix);
        iq[t] = matvec(s.get(a + "index_q_proj.weight"), h, Hix * Dix, hd);
        ik[t] = matvec(s.get(a + "index_k_proj.weight"), h, Dix, hd);
        for (int64_t n = 0; n < Hix; ++n) {
          gemma_norm(iq[t], n * Dix, Dix, s.get(a + "index_q_norm.weight"), c.rms_norm_eps);
          rope(iq[t], n * Dix, w, c.rotary_dim, c.rope_theta, t);
        }
        gemma_norm(ik[t], 0, Dix, s.get(a + "index_k_norm.weight"), c.rms_norm_eps);
        rope(ik[t], 0, w, c.rotary_dim, c.rope_theta, t);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      // keep[g][j]: may query t attend key j in KV group g.
      std::vector<std::vector<bool>> keep(Hkv, std::vector<bool>(T, false));
      for (int64_t g = 0; g < Hkv; ++g) {
        for (int64_t j = 0; j <= t; ++j) keep[g][j] = true;
        if (!sparse) continue;
        int64_t nb = (t / bs) + 1;  // blocks after the query's own block are never eligible
        Vec score(nb, -INFINITY);
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < Dix; ++i) dot += iq[t][g * Dix + i] * ik[j][i];
          score[j / bs] = std::max(score[j / bs], dot);
        }
        for (int64_t i = 0; i < c.index_local_blocks; ++i)
          score[std::max<int64_t>(0, t / bs - i)] = INFINITY;
        for (int64_t b = 0; b < std::min(c.index_init_blocks, nb); ++b) score[b] = INFINITY;
        std::vector<int64_t> order(nb);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t x1, int64_t x2) { return score[x1] > score[x2]; });
        std::vector<bool> chosen(nb, false);
        for (int64_t i = 0; i < std::min(c.index_topk_blocks, nb); ++i) chosen[order[i]] = true;
        for (int64_t j = 0; j <= t; ++j) keep[g][j] = chosen[j / bs];
      }
      Vec attn(static_cast<size_t>(H * d), 0.0);
      for (int64_t n = 0; n < H; ++n) {
        int64_t g = n / (H / Hkv);
        Vec sc(static_cast<size_t>(t + 1), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          if (!keep[g][j]) continue;
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[t][n * d + i] * k[j][g * d + i];
          sc[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (double& z : sc) sum += (z = std::exp(z - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i) attn[n * d + i] += sc[j] / sum * v[j][g * d + i];
      }
      Vec o = matvec(s.get(a + "o_proj.weight"), attn, hd, H * d);
      for (int64_t i = 0; i < hd; ++i) hs[t][i] = x[t][i] + o[i];  // hs[t] = new residual
    }
    for (int64_t t = 0; t < T; ++t) {
      x[t] = hs[t];
      Vec h = x[t];
      gemma_norm(h, 0, hd, s.get(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
      std::string m = p + "block_sparse_moe.";
      Vec y;
      if (c.mlp_layer_types[l] == MlpKind::kDense) {
        std::string b = style.dense_under_moe ? m : p + "mlp.";
        y = mlp(s, b + "gate_proj.weight", b + "up_proj.weight", b + "down_proj.weight", h,
                c.dense_intermediate_size, hd, c);
      } else {
        const int64_t E = c.num_local_experts;
        Vec r = matvec(s.get(m + "gate.weight"), h, E, hd), sig(E), choice(E);
        const auto& bias = s.get(m + "e_score_correction_bias");
        for (int64_t e = 0; e < E; ++e) {
          sig[e] = 1.0 / (1.0 + std::exp(-r[e]));
          choice[e] = sig[e] + bias[e];
        }
        std::vector<int64_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t e1, int64_t e2) { return choice[e1] > choice[e2]; });
        double denom = 0;
        for (int64_t i = 0; i < c.num_experts_per_tok; ++i) denom += sig[order[i]];
        y.assign(static_cast<size_t>(hd), 0.0);
        for (int64_t i = 0; i < c.num_experts_per_tok; ++i) {
          int64_t e = order[i];
          std::string xp = m + "experts." + std::to_string(e) + ".";
          Vec ye = mlp(s, xp + "w1.weight", xp + "w3.weight", xp + "w2.weight", h,
                       c.intermediate_size, hd, c);
          double wgt = sig[e] / denom * c.routed_scaling_factor;
          for (int64_t j = 0; j < hd; ++j) y[j] += wgt * ye[j];
        }
        int64_t si = c.shared_intermediate_size * c.n_shared_experts;
        if (si > 0) {
          Vec ys = mlp(s, m + "shared_experts.gate_proj.weight", m + "shared_experts.up_proj.weight",
                       m + "shared_experts.down_proj.weight", h, si, hd, c);
          for (int64_t j = 0; j < hd; ++j) y[j] += ys[j];
        }
      }
      for (int64_t j = 0; j < hd; ++j) x[t][j] += y[j];
    }
  }
  std::vector<Vec> logits(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    Vec h = x[t];
    gemma_norm(h, 0, hd, s.get(mp + "norm.weight"), c.rms_norm_eps);
    logits[t] = matvec(s.get(style.lm_head), h, c.vocab_size, hd);
  }
  return logits;
}

}  // namespace ref
}  // namespace m3::testing

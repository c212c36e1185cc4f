// Test helpers for the DSpark draft: a tiny draft config for tiny_model.h's target, random draft
// weights under the released checkpoint's names, and an independent double-precision reference of
// m3-architecture.md §5.2 steps 1-6 (dense loops over explicit context lists, no paging, no reuse
// of the model's or the backend's code).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/minimax_m3/dspark/dspark_config.h"
#include "tiny_model.h"

namespace m3::testing {

// tiny_config() with the bundled model's vocabulary size (4096), so the lm_head and Markov
// tables are the size of a real small draft's.
inline MiniMaxM3Config dspark_target_config() {
  MiniMaxM3Config c = tiny_config();
  c.vocab_size = 4096;
  return c;
}

// Hidden 64 (the target's), 2 layers, 4 heads / 2 KV heads of 16, RoPE on 8 dims, a 16-position
// window (so a few dozen context positions exercise it), block 7, all three target layers.
inline minimax_m3::dspark::DSparkConfig tiny_dspark_config() {
  minimax_m3::dspark::DSparkConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 4096;
  c.intermediate_size = 96;
  c.sliding_window = 16;
  c.block_size = 7;
  c.noise_token_id = 4090;
  c.target_layer_ids = {0, 1, 2};
  c.markov_rank = 8;
  c.rope_theta = 10000.0;
  c.rotary_dim = 8;
  c.source = "test dspark config";
  return c;
}

// Linear weights N(0, 1/in) keep activations O(1); norm offsets N(0, 0.2); the Markov tables are
// scaled so the correction moves logits by O(1) and changes argmaxes.
inline MemoryWeightSource random_dspark_weights(
    const minimax_m3::dspark::DSparkConfig& c, uint32_t seed,
    const std::string& prefix = "language_model.model.dspark.") {
  MemoryWeightSource src;
  std::mt19937 rng(seed);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float stddev) {
    HostTensorF32 t;
    t.shape = shape;
    std::normal_distribution<float> dist(0.0f, stddev);
    t.data.resize(static_cast<size_t>(t.numel()));
    for (float& x : t.data) x = dist(rng);
    src.tensors[prefix + name] = std::move(t);
  };
  auto lin = [&](const std::string& name, int64_t out, int64_t in) {
    add(name, {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
  };
  const int64_t hd = c.hidden_size, d = c.head_dim, r = c.markov_rank;
  lin("fc.weight", hd, c.feature_width());
  add("hidden_norm.weight", {hd}, 0.2f);
  add("final_norm.weight", {hd}, 0.2f);
  add("markov_head.markov_w1.weight", {c.vocab_size, r}, 1.0f);
  lin("markov_head.markov_w2.weight", c.vocab_size, r);
  if (c.enable_confidence_head) {
    lin("confidence_head.proj.weight", 1, hd + (c.confidence_head_with_markov ? r : 0));
    add("confidence_head.proj.bias", {1}, 0.1f);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".decoder_layer.";
    add(p + "input_layernorm.weight", {hd}, 0.2f);
    add(p + "post_attention_layernorm.weight", {hd}, 0.2f);
    lin(p + "self_attn.q_proj.weight", c.num_attention_heads * d, hd);
    lin(p + "self_attn.k_proj.weight", c.num_key_value_heads * d, hd);
    lin(p + "self_attn.v_proj.weight", c.num_key_value_heads * d, hd);
    lin(p + "self_attn.o_proj.weight", hd, c.num_attention_heads * d);
    add(p + "self_attn.q_norm.weight", {d}, 0.2f);
    add(p + "self_attn.k_norm.weight", {d}, 0.2f);
    lin(p + "mlp.gate_proj.weight", c.intermediate_size, hd);
    lin(p + "mlp.up_proj.weight", c.intermediate_size, hd);
    lin(p + "mlp.down_proj.weight", hd, c.intermediate_size);
  }
  return src;
}

// Random target features [n, width], O(1) like residual streams.
inline std::vector<float> random_features(int64_t n, int64_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(n * width));
  for (float& x : f) x = dist(rng);
  return f;
}

// The DSpark draft shape of the bundled m3-tiny (models/m3-tiny/dspark, as
// tools/train_tiny/train_dspark.py trains it), for tests that build one without reading it.
// Hidden 256, 8 / 2 heads of 32, FFN 1024, window 512, noise token 4090, target layers 1..5,
// Markov rank 64; RoPE left unset (taken from the target).
inline minimax_m3::dspark::DSparkConfig m3_tiny_draft_config() {
  minimax_m3::dspark::DSparkConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 256;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 4096;
  c.intermediate_size = 1024;
  c.sliding_window = 512;
  c.noise_token_id = 4090;
  c.target_layer_ids = {1, 2, 3, 4, 5};
  c.markov_rank = 64;
  c.source = "m3-tiny draft config";
  return c;
}

namespace dspark_ref {

using ref::Vec;

struct ContextKv {
  std::vector<std::vector<Vec>> k, v;  // [layer][position] -> [Hkv·D]
};

// §5.2 steps 1-2 for positions 0..n-1 of `features` [n, width].
inline ContextKv context_kv(const minimax_m3::dspark::DSparkConfig& c, const MemoryWeightSource& s,
                            const std::string& prefix, const std::vector<float>& features,
                            int64_t n) {
  const int64_t hd = c.hidden_size, d = c.head_dim, nkv = c.num_key_value_heads,
                width = c.feature_width();
  ContextKv kv;
  kv.k.resize(static_cast<size_t>(c.num_hidden_layers));
  kv.v.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t j = 0; j < n; ++j) {
    Vec f(features.begin() + j * width, features.begin() + (j + 1) * width);
    Vec ctx = ref::matvec(s.get(prefix + "fc.weight"), f, hd, width);
    ref::gemma_norm(ctx, 0, hd, s.get(prefix + "hidden_norm.weight"), c.rms_norm_eps);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string a = prefix + "layers." + std::to_string(l) + ".decoder_layer.self_attn.";
      Vec k = ref::matvec(s.get(a + "k_proj.weight"), ctx, nkv * d, hd);
      for (int64_t g = 0; g < nkv; ++g) {
        ref::gemma_norm(k, g * d, d, s.get(a + "k_norm.weight"), c.rms_norm_eps);
        ref::rope(k, g * d, c.rot_dim(), c.rot_dim(), c.theta(), j);
      }
      kv.k[static_cast<size_t>(l)].push_back(k);
      kv.v[static_cast<size_t>(l)].push_back(
          ref::matvec(s.get(a + "v_proj.weight"), ctx, nkv * d, hd));
    }
  }
  return kv;
}

struct Block {
  std::vector<Vec> base;    // [B][V]
  std::vector<Vec> logits;  // [B][V] corrected
};

// §5.2 steps 3-6 for the anchor at position p over the context positions [0, p) of `kv`; the
// Markov chain follows `prev_tokens` (the draft's own choices, so a near-tie cannot fork it).
inline Block propose(const minimax_m3::dspark::DSparkConfig& c, const MemoryWeightSource& s,
                     const std::string& prefix, const MemoryWeightSource& target,
                     const std::string& embed_name, const std::string& lm_head_name,
                     const ContextKv& kv, int64_t p, int32_t anchor,
                     const std::vector<int32_t>& prev_tokens) {
  const int64_t b = c.block_size, hd = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, v = c.vocab_size, r = c.markov_rank,
                inter = c.intermediate_size, group = nh / nkv;
  const double eps = c.rms_norm_eps;
  std::vector<Vec> x(static_cast<size_t>(b));
  const std::vector<float>& embed = target.get(embed_name);
  for (int64_t k = 0; k < b; ++k) {
    const int64_t id = k == 0 ? anchor : c.noise_token_id;
    x[k] = Vec(embed.begin() + id * hd, embed.begin() + (id + 1) * hd);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string lp = prefix + "layers." + std::to_string(l) + ".decoder_layer.";
    const std::string a = lp + "self_attn.";
    std::vector<Vec> q(b), bk(b), bv(b);
    for (int64_t k = 0; k < b; ++k) {
      Vec h = x[k];
      ref::gemma_norm(h, 0, hd, s.get(lp + "input_layernorm.weight"), eps);
      q[k] = ref::matvec(s.get(a + "q_proj.weight"), h, nh * d, hd);
      bk[k] = ref::matvec(s.get(a + "k_proj.weight"), h, nkv * d, hd);
      bv[k] = ref::matvec(s.get(a + "v_proj.weight"), h, nkv * d, hd);
      for (int64_t n = 0; n < nh; ++n) {
        ref::gemma_norm(q[k], n * d, d, s.get(a + "q_norm.weight"), eps);
        ref::rope(q[k], n * d, c.rot_dim(), c.rot_dim(), c.theta(), p + k);
      }
      for (int64_t g = 0; g < nkv; ++g) {
        ref::gemma_norm(bk[k], g * d, d, s.get(a + "k_norm.weight"), eps);
        ref::rope(bk[k], g * d, c.rot_dim(), c.rot_dim(), c.theta(), p + k);
      }
    }
    for (int64_t k = 0; k < b; ++k) {
      Vec attn(static_cast<size_t>(nh * d), 0.0);
      for (int64_t n = 0; n < nh; ++n) {
        const int64_t g = n / group;
        // Keys: context j < p within [p + k - W + 1, p + k], then every block slot.
        std::vector<const Vec*> keys, vals;
        for (int64_t j = std::max<int64_t>(0, p + k - c.sliding_window + 1); j < p; ++j) {
          keys.push_back(&kv.k[l][j]);
          vals.push_back(&kv.v[l][j]);
        }
        for (int64_t j = 0; j < b; ++j) {
          keys.push_back(&bk[j]);
          vals.push_back(&bv[j]);
        }
        Vec sc(keys.size());
        double mx = -1e300;
        for (size_t j = 0; j < keys.size(); ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += q[k][n * d + i] * (*keys[j])[g * d + i];
          sc[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (double& e : sc) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j < keys.size(); ++j)
          for (int64_t i = 0; i < d; ++i) attn[n * d + i] += sc[j] / sum * (*vals[j])[g * d + i];
      }
      Vec o = ref::matvec(s.get(a + "o_proj.weight"), attn, hd, nh * d);
      for (int64_t i = 0; i < hd; ++i) x[k][i] += o[i];
    }
    for (int64_t k = 0; k < b; ++k) {
      Vec h = x[k];
      ref::gemma_norm(h, 0, hd, s.get(lp + "post_attention_layernorm.weight"), eps);
      Vec g = ref::matvec(s.get(lp + "mlp.gate_proj.weight"), h, inter, hd);
      Vec u = ref::matvec(s.get(lp + "mlp.up_proj.weight"), h, inter, hd);
      for (int64_t i = 0; i < inter; ++i)
        g[i] = ref::swiglu(g[i], u[i], c.swiglu_alpha, c.swiglu_limit);
      Vec y = ref::matvec(s.get(lp + "mlp.down_proj.weight"), g, hd, inter);
      for (int64_t i = 0; i < hd; ++i) x[k][i] += y[i];
    }
  }
  Block out;
  const std::vector<float>& w1 = s.get(prefix + "markov_head.markov_w1.weight");
  int32_t prev = anchor;
  for (int64_t k = 0; k < b; ++k) {
    Vec y = x[k];
    ref::gemma_norm(y, 0, hd, s.get(prefix + "final_norm.weight"), eps);
    out.base.push_back(ref::matvec(target.get(lm_head_name), y, v, hd));
    Vec e(w1.begin() + prev * r, w1.begin() + (prev + 1) * r);
    Vec bias = ref::matvec(s.get(prefix + "markov_head.markov_w2.weight"), e, v, r);
    Vec logits = out.base.back();
    for (int64_t i = 0; i < v; ++i) logits[i] += bias[i];
    out.logits.push_back(logits);
    prev = prev_tokens[static_cast<size_t>(k)];
  }
  return out;
}

}  // namespace dspark_ref
}  // namespace m3::testing

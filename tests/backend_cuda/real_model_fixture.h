// The weights and the comparison of the real-shape CUDA model tests (cuda_real_model_test,
// cuda_tensor_parallel_test) against the float32 CPU model; the weight shaping and the error
// model are explained at the top of cuda_real_model_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../model/single_sequence.h"
#include "../model_cuda/small_real_shape_config.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/model.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3::real_model_fixture {

using minimax_m3::DummyWeightSource;

inline MiniMaxM3Config test_config() {
  MiniMaxM3Config c = small_real_shape_config(2048);
  c.index_init_blocks = 1;
  c.index_local_blocks = 1;
  c.layer_types.assign(3, AttentionKind::kSparse);
  return c;
}

// test_config with layer 1 full_attention (MiniMax-M3's dense attention layers: no indexer
// weights, every causal block attended), between the sparse layers 0 and 2.
inline MiniMaxM3Config full_attention_test_config() {
  MiniMaxM3Config c = test_config();
  c.layer_types[1] = AttentionKind::kFull;
  return c;
}

inline std::vector<float> normal(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

// DummyWeightSource with the indexer projections, routing biases and expert gate/up replaced
// (see the file comment), exact in their stored formats.
class TestSource final : public WeightSource {
 public:
  explicit TestSource(const MiniMaxM3Config& c) : base_(c) {
    const int64_t hd = c.hidden_size;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const uint32_t s = static_cast<uint32_t>(1000 + 100 * i);
      if (c.is_sparse_layer(i)) put_indexer(p, c, s);
      if (!c.is_moe_layer(i)) continue;
      const std::string m = p + "block_sparse_moe.";
      const int64_t ne = c.num_local_experts, inter = c.intermediate_size;
      Stored bias{WeightFormat::kF32, {ne}, {}, {}, 1.0f};
      bias.data.resize(static_cast<size_t>(ne) * 4);
      for (int64_t e = 0; e < ne; ++e) {
        const float b = 2.0f * static_cast<float>(i % 2 == 1 ? e : ne - 1 - e);
        std::memcpy(bias.data.data() + 4 * e, &b, 4);
      }
      ov_[m + "e_score_correction_bias"] = bias;
      for (int64_t e = 0; e < ne; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        const std::vector<float> gu =
            normal(2 * inter * hd, s + 7 + static_cast<uint32_t>(e), 0.02f);
        Nvfp4Tensor q = *quantize_nvfp4(gu.data(), 2 * inter, hd, Nvfp4GlobalScale::kDivide);
        const size_t pb = static_cast<size_t>(inter * hd / 2),
                     sb = static_cast<size_t>(inter * hd / 16);
        for (int half = 0; half < 2; ++half) {
          Stored st{WeightFormat::kNvfp4Compressed, {inter, hd}, {}, {}, q.global_scale};
          st.data.assign(q.packed.begin() + half * pb, q.packed.begin() + (half + 1) * pb);
          st.scale.assign(q.scales.begin() + half * sb, q.scales.begin() + (half + 1) * sb);
          ov_[x + (half == 0 ? "w1.weight" : "w3.weight")] = std::move(st);
        }
      }
    }
  }

  // The indexer projections of a sparse layer under prefix p (see the file comment).
  void put_indexer(const std::string& p, const MiniMaxM3Config& c, uint32_t s) {
    const int64_t hd = c.hidden_size, dix = c.index_head_dim, hix = c.index_n_heads;
    std::vector<float> iq(static_cast<size_t>(hix * dix * hd), 0.0f);
    for (int64_t h = 0; h < hix; ++h) {
      const int64_t row = h * dix + (h % 2 == 0 ? 12 : 45);
      const std::vector<float> u = normal(hd, s + static_cast<uint32_t>(h), 0.02f);
      std::copy(u.begin(), u.end(), iq.begin() + row * hd);
    }
    put_mxfp8(p + "self_attn.index_q_proj.weight", iq, hix * dix, hd);
    std::vector<float> ik(static_cast<size_t>(dix * hd), 0.0f);
    const std::vector<float> u = normal(hd, s + 50, 0.02f);
    for (int64_t row : {12, 13}) std::copy(u.begin(), u.end(), ik.begin() + row * hd);
    put_mxfp8(p + "self_attn.index_k_proj.weight", ik, dix, hd);
  }

  bool has(const std::string& name) const override { return base_.has(name); }
  std::vector<std::string> names() const override { return base_.names(); }
  Result<WeightFormat> format(const std::string& name) const override {
    auto it = ov_.find(name);
    return it == ov_.end() ? base_.format(name) : Result<WeightFormat>(it->second.format);
  }
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& shape) const override {
    auto it = ov_.find(name);
    if (it == ov_.end()) return base_.load_f32(name, shape);
    const Stored& s = it->second;
    if (s.shape != shape) return invalid_argument("[test source] shape of " + name);
    HostTensorF32 t;
    t.shape = shape;
    t.data.resize(static_cast<size_t>(t.numel()));
    const int64_t cols = shape.back(), rows = t.numel() / cols;
    if (s.format == WeightFormat::kF32) {
      std::memcpy(t.data.data(), s.data.data(), s.data.size());
    } else if (s.format == WeightFormat::kMxfp8) {
      M3_RETURN_IF_ERROR(
          dequantize_mxfp8(s.data.data(), s.scale.data(), rows, cols, t.data.data()));
    } else {
      M3_RETURN_IF_ERROR(dequantize_nvfp4(s.data.data(), s.scale.data(), s.global,
                                          Nvfp4GlobalScale::kDivide, rows, cols, t.data.data()));
    }
    return t;
  }
  Result<RawWeight> load_raw(const std::string& name,
                             const std::vector<int64_t>& shape) const override {
    auto it = ov_.find(name);
    if (it == ov_.end()) return base_.load_raw(name, shape);
    const Stored& s = it->second;
    if (s.shape != shape) return invalid_argument("[test source] shape of " + name);
    RawWeight r;
    r.format = s.format;
    r.shape = s.shape;
    r.data = s.data.data();
    r.data_bytes = s.data.size();
    r.scale = s.scale.empty() ? nullptr : s.scale.data();
    r.scale_bytes = s.scale.size();
    r.global_scale = s.global;
    return r;
  }

 private:
  struct Stored {
    WeightFormat format;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data, scale;
    float global = 1.0f;
  };
  void put_mxfp8(const std::string& name, const std::vector<float>& w, int64_t rows, int64_t cols) {
    Mxfp8Tensor q = *quantize_mxfp8(w.data(), rows, cols);
    ov_[name] =
        Stored{WeightFormat::kMxfp8, {rows, cols}, std::move(q.codes), std::move(q.scales), 1.0f};
  }

  DummyWeightSource base_;
  std::map<std::string, Stored> ov_;
};

// ---- Comparison.

struct Compare {
  double rel_bound = 0;  // bound = rel_bound · rms(cpu row)
  double worst = 0;      // worst |gpu - cpu| / bound
  int64_t rows = 0, argmax_checked = 0, argmax_bad = 0, nonfinite = 0;

  void rows_of(const float* gpu, const float* cpu, int64_t n, int64_t v) {
    for (int64_t r = 0; r < n; ++r) {
      const float* g = gpu + r * v;
      const float* c = cpu + r * v;
      double ss = 0;
      for (int64_t i = 0; i < v; ++i) ss += double(c[i]) * c[i];
      const double bound = rel_bound * std::sqrt(ss / double(v)) + 1e-6;
      int64_t best = 0;
      for (int64_t i = 0; i < v; ++i) {
        if (!std::isfinite(g[i])) {
          ++nonfinite;
          continue;
        }
        worst = std::max(worst, std::abs(double(g[i]) - c[i]) / bound);
        if (c[i] > c[best]) best = i;
      }
      double second = -INFINITY;
      for (int64_t i = 0; i < v; ++i)
        if (i != best) second = std::max(second, double(c[i]));
      if (c[best] - second > 2 * bound) {
        ++argmax_checked;
        if (testing::argmax(std::span<const float>(g, static_cast<size_t>(v))) != best)
          ++argmax_bad;
      }
      ++rows;
    }
  }
  bool ok() const { return rows > 0 && worst <= 1.0 && argmax_bad == 0 && nonfinite == 0; }
  void report(const std::string& what) const {
    std::printf(
        "[cuda_real_model] %-44s rows %5lld  worst |gpu-cpu|/bound %.3f  argmax checked "
        "%lld/%lld, mismatches %lld, non-finite %lld  -> %s\n",
        what.c_str(), (long long)rows, worst, (long long)argmax_checked, (long long)rows,
        (long long)argmax_bad, (long long)nonfinite, ok() ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
};

inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

inline int32_t last_argmax(const std::vector<float>& logits, int64_t v) {
  return testing::argmax(std::span<const float>(
      logits.data() + logits.size() - static_cast<size_t>(v), static_cast<size_t>(v)));
}


// A sequence's pages and how many of its positions the caches hold.
struct Seq {
  std::vector<int32_t> table;  // page ids
  int64_t cached = 0;          // positions in the caches
};

// Page ids handed out in a shuffled order (non-identity block tables).
class PageIds {
 public:
  PageIds(int64_t pages, uint32_t seed) : pages_(static_cast<size_t>(pages)) {
    for (int64_t i = 0; i < pages; ++i) pages_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(pages_.begin(), pages_.end(), std::mt19937(seed));
  }
  Seq new_seq(int64_t max_tokens) {
    Seq s;
    const int64_t pages = static_cast<int64_t>(pages_.size());
    for (int64_t i = 0; i < (max_tokens + 127) / 128; ++i) {
      EXPECT_LT(next_, pages);
      s.table.push_back(pages_[static_cast<size_t>(next_++ % pages)]);
    }
    return s;
  }
  void reset() { next_ = 0; }

 private:
  std::vector<int32_t> pages_;
  int64_t next_ = 0;
};

// The error bound relative to the rms of the CPU's logits (cuda_real_model_test.cpp's model).
inline double rel_bound(const MiniMaxM3Config& c) {
  return std::ldexp(1.0, -9) * double(4 + 10 * c.num_hidden_layers);
}

// One step's inputs: tokens[i] appended to seqs[i], logits for all of its rows when all_rows, else
// its last. The slices point into `seqs` and `tokens`.
inline std::vector<minimax_m3::SequenceInput> step_inputs(
    const std::vector<Seq*>& seqs, const std::vector<std::vector<int32_t>>& tokens,
    bool all_rows) {
  std::vector<minimax_m3::SequenceInput> in(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    in[i].tokens = tokens[i];
    in[i].start_pos = seqs[i]->cached;
    in[i].block_table = seqs[i]->table;
    const int32_t n = static_cast<int32_t>(tokens[i].size());
    if (all_rows) {
      for (int32_t r = 0; r < n; ++r) in[i].logits_rows.push_back(r);
    } else {
      in[i].logits_rows = {n - 1};
    }
  }
  return in;
}

}  // namespace m3::real_model_fixture

#include "model/minimax_m3/vision_tower.h"

#include <algorithm>
#include <cmath>

namespace m3 {

namespace {

constexpr const char* kPreNorm = "vision_tower.vision_model.pre_layrnorm.weight";

std::string layer_name(const std::string& prefix, int64_t i, const std::string& leaf) {
  return prefix + "vision_tower.vision_model.encoder.layers." + std::to_string(i) + "." + leaf;
}

Result<std::vector<float>> load(const WeightSource& s, const std::string& name,
                                std::vector<int64_t> shape) {
  auto t = s.load_f32(name, shape);
  if (!t.is_ok()) return t.status();
  return std::move(t).value().data;
}

Result<VisionLinear> load_linear(const WeightSource& s, const std::string& base, int64_t out,
                                 int64_t in, bool bias) {
  VisionLinear l;
  l.out = out;
  l.in = in;
  M3_ASSIGN_OR_RETURN(l.weight, load(s, base + ".weight", {out, in}));
  if (bias) {
    M3_ASSIGN_OR_RETURN(l.bias, load(s, base + ".bias", {out}));
  }
  return l;
}

template <typename T>
T gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x / std::sqrt(T(2))));
}

template <typename T>
void layer_norm(std::vector<T>& x, int64_t rows, int64_t dim, const std::vector<float>& w,
                const std::vector<float>& b, double eps, std::vector<T>& y) {
  y.resize(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = &x[size_t(r * dim)];
    T mean = 0;
    for (int64_t i = 0; i < dim; ++i) mean += in[i];
    mean /= T(dim);
    T var = 0;
    for (int64_t i = 0; i < dim; ++i) var += (in[i] - mean) * (in[i] - mean);
    var /= T(dim);
    const T inv = T(1) / std::sqrt(var + T(eps));
    T* out = &y[size_t(r * dim)];
    for (int64_t i = 0; i < dim; ++i) out[i] = (in[i] - mean) * inv * T(w[size_t(i)]) + T(b[size_t(i)]);
  }
}

}  // namespace

std::vector<std::string> vision_weight_names(const VisionConfig& c, const std::string& prefix) {
  std::vector<std::string> n = {
      prefix + "vision_tower.vision_model.embeddings.patch_embedding.weight",
      prefix + "vision_tower.vision_model.pre_layrnorm.weight",
      prefix + "vision_tower.vision_model.pre_layrnorm.bias"};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (const char* leaf : {"layer_norm1", "layer_norm2", "self_attn.q_proj", "self_attn.k_proj",
                             "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"}) {
      n.push_back(layer_name(prefix, i, std::string(leaf) + ".weight"));
      n.push_back(layer_name(prefix, i, std::string(leaf) + ".bias"));
    }
  }
  for (const char* l : {"multi_modal_projector.linear_1", "multi_modal_projector.linear_2",
                        "patch_merge_mlp.linear_1", "patch_merge_mlp.linear_2"}) {
    n.push_back(prefix + l + ".weight");
    n.push_back(prefix + l + ".bias");
  }
  return n;
}

Result<std::string> find_vision_prefix(const WeightSource& source) {
  if (source.has(kPreNorm)) return std::string();
  const std::string suffix = kPreNorm;
  for (const std::string& name : source.names()) {
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return name.substr(0, name.size() - suffix.size());
    }
  }
  return not_found("the checkpoint has no vision tower weights (no '" + suffix + "')");
}

Result<VisionWeights> load_vision_weights(const WeightSource& s, const VisionConfig& c) {
  M3_ASSIGN_OR_RETURN(const std::string prefix, find_vision_prefix(s));
  const std::string vm = prefix + "vision_tower.vision_model.";
  const int64_t H = c.hidden_size, F = c.intermediate_size, P = c.projector_hidden_size;
  const int64_t merge = c.spatial_merge_size * c.spatial_merge_size;
  VisionWeights w;
  w.patch_embed.out = H;
  w.patch_embed.in = c.patch_values();
  M3_ASSIGN_OR_RETURN(w.patch_embed.weight,
                      load(s, vm + "embeddings.patch_embedding.weight",
                           {H, c.num_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  M3_ASSIGN_OR_RETURN(w.pre_ln_weight, load(s, vm + "pre_layrnorm.weight", {H}));
  M3_ASSIGN_OR_RETURN(w.pre_ln_bias, load(s, vm + "pre_layrnorm.bias", {H}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    VisionLayerWeights l;
    M3_ASSIGN_OR_RETURN(l.ln1_weight, load(s, layer_name(prefix, i, "layer_norm1.weight"), {H}));
    M3_ASSIGN_OR_RETURN(l.ln1_bias, load(s, layer_name(prefix, i, "layer_norm1.bias"), {H}));
    M3_ASSIGN_OR_RETURN(l.ln2_weight, load(s, layer_name(prefix, i, "layer_norm2.weight"), {H}));
    M3_ASSIGN_OR_RETURN(l.ln2_bias, load(s, layer_name(prefix, i, "layer_norm2.bias"), {H}));
    M3_ASSIGN_OR_RETURN(l.q, load_linear(s, layer_name(prefix, i, "self_attn.q_proj"), H, H, true));
    M3_ASSIGN_OR_RETURN(l.k, load_linear(s, layer_name(prefix, i, "self_attn.k_proj"), H, H, true));
    M3_ASSIGN_OR_RETURN(l.v, load_linear(s, layer_name(prefix, i, "self_attn.v_proj"), H, H, true));
    M3_ASSIGN_OR_RETURN(l.out, load_linear(s, layer_name(prefix, i, "self_attn.out_proj"), H, H, true));
    M3_ASSIGN_OR_RETURN(l.fc1, load_linear(s, layer_name(prefix, i, "mlp.fc1"), F, H, true));
    M3_ASSIGN_OR_RETURN(l.fc2, load_linear(s, layer_name(prefix, i, "mlp.fc2"), H, F, true));
    w.layers.push_back(std::move(l));
  }
  M3_ASSIGN_OR_RETURN(w.proj1, load_linear(s, prefix + "multi_modal_projector.linear_1", P, H, true));
  M3_ASSIGN_OR_RETURN(w.proj2, load_linear(s, prefix + "multi_modal_projector.linear_2", P, P, true));
  M3_ASSIGN_OR_RETURN(w.merge1, load_linear(s, prefix + "patch_merge_mlp.linear_1",
                                            c.text_hidden_size, merge * P, true));
  M3_ASSIGN_OR_RETURN(w.merge2, load_linear(s, prefix + "patch_merge_mlp.linear_2",
                                            c.text_hidden_size, c.text_hidden_size, true));
  return w;
}

VisionTower::VisionTower(VisionConfig config, VisionWeights weights, Backend* backend)
    : config_(std::move(config)), w_(std::move(weights)), backend_(backend) {}

int64_t VisionTower::num_outputs(int32_t grid_t, int32_t grid_h, int32_t grid_w) const {
  const int64_t m = config_.spatial_merge_size;
  return int64_t(grid_t) * grid_h * grid_w / (m * m);
}

Status VisionTower::check(std::span<const float> patches, int32_t grid_t, int32_t grid_h,
                          int32_t grid_w) const {
  const int64_t m = config_.spatial_merge_size;
  if (grid_t < 1 || grid_h < 1 || grid_w < 1 || grid_h % m != 0 || grid_w % m != 0) {
    return invalid_argument("[vision] grid (" + std::to_string(grid_t) + ", " +
                            std::to_string(grid_h) + ", " + std::to_string(grid_w) +
                            ") is not whole merge windows of " + std::to_string(m));
  }
  const int64_t n = int64_t(grid_t) * grid_h * grid_w;
  if (int64_t(patches.size()) != n * config_.patch_values()) {
    return invalid_argument("[vision] " + std::to_string(patches.size()) + " patch values for " +
                            std::to_string(n) + " patches of " +
                            std::to_string(config_.patch_values()));
  }
  return Status::ok();
}

template <typename T>
void VisionTower::linear(const std::vector<T>& x, int64_t rows, const VisionLinear& l,
                         std::vector<T>& y) const {
  y.assign(size_t(rows * l.out), T(0));
  if constexpr (std::is_same_v<T, float>) {
    if (backend_ != nullptr) {
      LinearParams p;
      p.x = x.data();
      p.w = l.weight.data();
      p.y = y.data();
      p.m = rows;
      p.n = l.out;
      p.k = l.in;
      backend_->linear(p);
      if (!l.bias.empty()) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < l.out; ++o) y[size_t(r * l.out + o)] += l.bias[size_t(o)];
      }
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = &x[size_t(r * l.in)];
    for (int64_t o = 0; o < l.out; ++o) {
      const float* wr = &l.weight[size_t(o * l.in)];
      T acc = 0;
      for (int64_t i = 0; i < l.in; ++i) acc += in[i] * T(wr[i]);
      y[size_t(r * l.out + o)] = acc + (l.bias.empty() ? T(0) : T(l.bias[size_t(o)]));
    }
  }
}

template <typename T>
std::vector<T> VisionTower::forward(std::span<const float> patches, int32_t grid_t,
                                    int32_t grid_h, int32_t grid_w,
                                    std::vector<T>* tower_out) const {
  const VisionConfig& c = config_;
  const int64_t n = int64_t(grid_t) * grid_h * grid_w;
  const int64_t H = c.hidden_size, heads = c.num_attention_heads, D = c.head_dim();
  const int64_t M = c.spatial_merge_size;

  // Each patch's (t, h, w) from its merge-window-order index.
  std::vector<int64_t> pos_t(static_cast<size_t>(n)), pos_h(static_cast<size_t>(n)),
      pos_w(static_cast<size_t>(n));
  const int64_t windows_w = grid_w / M, per_frame = int64_t(grid_h) * grid_w;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t in_frame = p % per_frame;
    const int64_t window = in_frame / (M * M), within = in_frame % (M * M);
    pos_t[size_t(p)] = p / per_frame;
    pos_h[size_t(p)] = (window / windows_w) * M + within / M;
    pos_w[size_t(p)] = (window % windows_w) * M + within % M;
  }
  // 3-D RoPE tables: per patch, half = 3 * axis/2 angles (t, h, w frequencies in turn).
  const int64_t axis = c.rope_axis_dims(), freqs = axis / 2, half = 3 * freqs;
  std::vector<T> cos_t(static_cast<size_t>(n * half)), sin_t(static_cast<size_t>(n * half));
  for (int64_t p = 0; p < n; ++p) {
    const int64_t pos[3] = {pos_t[size_t(p)], pos_h[size_t(p)], pos_w[size_t(p)]};
    for (int64_t a = 0; a < 3; ++a) {
      for (int64_t j = 0; j < freqs; ++j) {
        const T inv_freq = T(1) / std::pow(T(c.rope_theta), T(2 * j) / T(axis));
        const T angle = T(pos[a]) * inv_freq;
        cos_t[size_t(p * half + a * freqs + j)] = std::cos(angle);
        sin_t[size_t(p * half + a * freqs + j)] = std::sin(angle);
      }
    }
  }
  auto rope = [&](std::vector<T>& x) {  // [n, heads, D] in place
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t h = 0; h < heads; ++h) {
        T* v = &x[size_t((p * heads + h) * D)];
        for (int64_t i = 0; i < half; ++i) {
          const T co = cos_t[size_t(p * half + i)], si = sin_t[size_t(p * half + i)];
          const T a = v[i], b = v[i + half];
          v[i] = a * co - b * si;
          v[i + half] = b * co + a * si;
        }
      }
    }
  };

  std::vector<T> in(patches.begin(), patches.end()), x, h, q, k, v, att, tmp, f;
  linear(in, n, w_.patch_embed, tmp);
  layer_norm(tmp, n, H, w_.pre_ln_weight, w_.pre_ln_bias, c.layer_norm_eps, x);
  const T scale = T(1) / std::sqrt(T(D));
  std::vector<T> scores(static_cast<size_t>(n));
  for (const VisionLayerWeights& l : w_.layers) {
    layer_norm(x, n, H, l.ln1_weight, l.ln1_bias, c.layer_norm_eps, h);
    linear(h, n, l.q, q);
    linear(h, n, l.k, k);
    linear(h, n, l.v, v);
    rope(q);
    rope(k);
    att.assign(size_t(n * H), T(0));
    for (int64_t hd = 0; hd < heads; ++hd) {
      for (int64_t i = 0; i < n; ++i) {
        const T* qi = &q[size_t((i * heads + hd) * D)];
        T mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const T* kj = &k[size_t((j * heads + hd) * D)];
          T s = 0;
          for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
          scores[size_t(j)] = s * scale;
          mx = std::max(mx, scores[size_t(j)]);
        }
        T sum = 0;
        for (int64_t j = 0; j < n; ++j) {
          scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
          sum += scores[size_t(j)];
        }
        T* out = &att[size_t((i * heads + hd) * D)];
        for (int64_t j = 0; j < n; ++j) {
          const T pj = scores[size_t(j)] / sum;
          const T* vj = &v[size_t((j * heads + hd) * D)];
          for (int64_t d = 0; d < D; ++d) out[d] += pj * vj[d];
        }
      }
    }
    linear(att, n, l.out, tmp);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    layer_norm(x, n, H, l.ln2_weight, l.ln2_bias, c.layer_norm_eps, h);
    linear(h, n, l.fc1, f);
    for (T& e : f) e = gelu(e);
    linear(f, n, l.fc2, tmp);
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
  if (tower_out != nullptr) *tower_out = x;
  // Project every patch, then merge each window's consecutive patches.
  linear(x, n, w_.proj1, f);
  for (T& e : f) e = gelu(e);
  linear(f, n, w_.proj2, tmp);  // [n, P] == [n / M^2, M^2 * P] row-major
  const int64_t windows = n / (M * M);
  linear(tmp, windows, w_.merge1, f);
  for (T& e : f) e = gelu(e);
  std::vector<T> out;
  linear(f, windows, w_.merge2, out);
  return out;
}

Result<std::vector<float>> VisionTower::encode(std::span<const float> patches, int32_t grid_t,
                                               int32_t grid_h, int32_t grid_w) const {
  M3_RETURN_IF_ERROR(check(patches, grid_t, grid_h, grid_w));
  return forward<float>(patches, grid_t, grid_h, grid_w);
}

Result<VisionTower::Stages> VisionTower::encode_stages(std::span<const float> patches,
                                                       int32_t grid_t, int32_t grid_h,
                                                       int32_t grid_w) const {
  M3_RETURN_IF_ERROR(check(patches, grid_t, grid_h, grid_w));
  Stages s;
  s.output = forward<float>(patches, grid_t, grid_h, grid_w, &s.tower);
  return s;
}

Result<std::vector<double>> VisionTower::encode_reference(std::span<const float> patches,
                                                          int32_t grid_t, int32_t grid_h,
                                                          int32_t grid_w) const {
  M3_RETURN_IF_ERROR(check(patches, grid_t, grid_h, grid_w));
  return forward<double>(patches, grid_t, grid_h, grid_w);
}

}  // namespace m3

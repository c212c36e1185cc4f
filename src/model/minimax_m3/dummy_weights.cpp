#include "model/minimax_m3/dummy_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/dtype.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3::minimax_m3 {

uint64_t dummy_splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t dummy_name_seed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

float dummy_normal_at(uint64_t seed, float sigma, int64_t i) {
  const float k = sigma * std::sqrt(3.0f) / 65536.0f;
  const uint64_t h = dummy_splitmix(seed ^ dummy_splitmix(static_cast<uint64_t>(i)));
  const int32_t s = static_cast<int32_t>(h & 0xFFFF) + static_cast<int32_t>((h >> 16) & 0xFFFF) +
                    static_cast<int32_t>((h >> 32) & 0xFFFF) + static_cast<int32_t>(h >> 48) -
                    2 * 65535;
  return static_cast<float>(s) * k;
}

namespace {

const std::string kPrefix = "model.";

// The largest |dummy_normal_at| can return: the NVFP4 amax of every dummy tensor of that sigma, so the
// global scale depends on no value and a rank's slice quantises like the whole tensor.
float normal_bound(float sigma) { return 2.0f * 65535.0f * (sigma * std::sqrt(3.0f) / 65536.0f); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

MiniMaxM3Config builtin_m3_flash_config(int64_t num_layers) {
  MiniMaxM3Config c;  // the struct's defaults are the M3 / M3.1-Flash values (§1.2)
  c.model_type = "minimax_m3_vl";
  c.num_hidden_layers = num_layers > 0 ? num_layers : 60;
  c.index_init_blocks = 1;  // RTP's M3.1 test config (§1.3)
  c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), AttentionKind::kSparse);
  c.mlp_layer_types.assign(static_cast<size_t>(c.num_hidden_layers), MlpKind::kMoe);
  for (int64_t i = 0; i < std::min<int64_t>(3, c.num_hidden_layers); ++i)
    c.mlp_layer_types[static_cast<size_t>(i)] = MlpKind::kDense;
  c.source = "built-in MiniMax-M3.1-Flash config";
  return c;
}

MiniMaxM3Config builtin_m3_config(int64_t num_layers) {
  MiniMaxM3Config c = builtin_m3_flash_config(num_layers);
  c.index_init_blocks = 0;
  for (int64_t i = 0; i < std::min<int64_t>(3, c.num_hidden_layers); ++i)
    c.layer_types[static_cast<size_t>(i)] = AttentionKind::kFull;
  c.source = "built-in MiniMax-M3 config";
  return c;
}

DummyWeightSource::DummyWeightSource(const MiniMaxM3Config& c) {
  auto add = [&](const std::string& n) { names_.push_back(n); };
  add(kPrefix + "embed_tokens.weight");
  add(kPrefix + "norm.weight");
  if (!c.tie_word_embeddings) add("lm_head.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = kPrefix + "layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight",
                          "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                          "self_attn.q_norm.weight", "self_attn.k_norm.weight"})
      add(p + n);
    if (c.layer_types[static_cast<size_t>(i)] == AttentionKind::kSparse)
      for (const char* n : {"self_attn.index_q_proj.weight", "self_attn.index_k_proj.weight",
                            "self_attn.index_q_norm.weight", "self_attn.index_k_norm.weight"})
        add(p + n);
    if (c.mlp_layer_types[static_cast<size_t>(i)] == MlpKind::kDense) {
      for (const char* n : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
        add(p + n);
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    add(m + "gate.weight");
    if (c.use_routing_bias) add(m + "e_score_correction_bias");
    for (int64_t e = 0; e < c.num_local_experts; ++e)
      for (const char* w : {"w1.weight", "w2.weight", "w3.weight"})
        add(m + "experts." + std::to_string(e) + "." + w);
    if (c.shared_intermediate_size * c.n_shared_experts > 0)
      for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"})
        add(m + "shared_experts." + n);
  }
  std::sort(names_.begin(), names_.end());
}

bool DummyWeightSource::has(const std::string& name) const {
  return std::binary_search(names_.begin(), names_.end(), name);
}

Result<WeightFormat> DummyWeightSource::format(const std::string& name) const {
  if (!has(name)) return not_found("[dummy weights] no tensor '" + name + "'");
  if (name.find(".experts.") != std::string::npos) return WeightFormat::kNvfp4Compressed;
  if (ends_with(name, "_proj.weight")) return WeightFormat::kMxfp8;
  if (ends_with(name, "e_score_correction_bias")) return WeightFormat::kF32;
  return WeightFormat::kBF16;
}

namespace {

// What a dummy tensor of format `f` and logical shape `shape` is stored as: the format's
// quantisation needs a 2-D tensor whose rows split into whole blocks; otherwise BF16.
WeightFormat stored_format(WeightFormat f, const std::vector<int64_t>& shape) {
  const int64_t cols = shape.empty() ? 1 : shape.back();
  if (f == WeightFormat::kMxfp8 && shape.size() == 2 && cols % 32 == 0) return f;
  if (f == WeightFormat::kNvfp4Compressed && shape.size() == 2 && cols % 16 == 0) return f;
  if (f == WeightFormat::kF32) return f;
  return WeightFormat::kBF16;
}

// The drawn (unquantised) values of window `w` of a tensor with `cols` columns. Element (r, c)
// is draw r·cols + c, whatever the window.
std::vector<float> draw_window(const std::string& name, int64_t cols, const WeightWindow& w) {
  const bool small = ends_with(name, "norm.weight") || ends_with(name, "correction_bias");
  const float sigma = small ? 0.01f : 0.02f;
  const uint64_t seed = dummy_name_seed(name);
  std::vector<float> v(static_cast<size_t>(w.rows() * w.cols()));
  for (int64_t r = 0; r < w.rows(); ++r)
    for (int64_t c = 0; c < w.cols(); ++c)
      v[static_cast<size_t>(r * w.cols() + c)] =
          dummy_normal_at(seed, sigma, (w.row_begin + r) * cols + w.col_begin + c);
  return v;
}

// The NVFP4 global scale of every dummy expert weight (they are drawn with sigma 0.02).
float dummy_nvfp4_global_scale() {
  return nvfp4_global_scale_for_amax(normal_bound(0.02f), Nvfp4GlobalScale::kDivide);
}

// Window `w` of a tensor [rows, cols] viewed as 2-D (1-D tensors: one row), quantised to `stored`
// and dequantised. MXFP8 and NVFP4 blocks depend only on their own values (the NVFP4 global scale
// is fixed), so a window equals the same window of the whole tensor bit for bit.
Result<std::vector<float>> window_values(const std::string& name, WeightFormat stored,
                                         int64_t cols, const WeightWindow& w) {
  std::vector<float> v = draw_window(name, cols, w);
  const int64_t rows = w.rows(), n = w.rows() * w.cols();
  if (n == 0) return v;
  std::vector<float> out(v.size());
  switch (stored) {
    case WeightFormat::kMxfp8: {
      M3_ASSIGN_OR_RETURN(Mxfp8Tensor q, quantize_mxfp8(v.data(), rows, w.cols()));
      M3_RETURN_IF_ERROR(
          dequantize_mxfp8(q.codes.data(), q.scales.data(), rows, w.cols(), out.data()));
      return out;
    }
    case WeightFormat::kNvfp4Compressed: {
      M3_ASSIGN_OR_RETURN(Nvfp4Tensor q,
                          quantize_nvfp4_with_global_scale(v.data(), rows, w.cols(),
                                                           Nvfp4GlobalScale::kDivide,
                                                           dummy_nvfp4_global_scale()));
      M3_RETURN_IF_ERROR(dequantize_nvfp4(q.packed.data(), q.scales.data(), q.global_scale,
                                          Nvfp4GlobalScale::kDivide, rows, w.cols(), out.data()));
      return out;
    }
    case WeightFormat::kF32: return v;
    default:
      for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(f32_to_bf16(v[i]));
      return out;
  }
}

}  // namespace

Result<HostTensorF32> DummyWeightSource::load_f32(const std::string& name,
                                                  const std::vector<int64_t>& shape) const {
  M3_ASSIGN_OR_RETURN(WeightFormat f, format(name));
  HostTensorF32 t;
  t.shape = shape;
  const int64_t n = t.numel();
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = cols > 0 ? n / cols : 0;
  M3_ASSIGN_OR_RETURN(t.data, window_values(name, stored_format(f, shape), cols,
                                            WeightWindow::all(rows, cols)));
  return t;
}

Result<HostTensorF32> DummyWeightSource::load_f32_window(const std::string& name,
                                                         const std::vector<int64_t>& shape,
                                                         const WeightWindow& w) const {
  M3_ASSIGN_OR_RETURN(WeightFormat f, format(name));
  const WeightFormat stored = stored_format(f, shape);
  M3_RETURN_IF_ERROR(check_weight_window(name, stored, shape, w));
  HostTensorF32 t;
  t.shape = {w.rows(), w.cols()};
  M3_ASSIGN_OR_RETURN(t.data, window_values(name, stored, shape[1], w));
  return t;
}

Result<RawWeight> DummyWeightSource::load_raw(const std::string& name,
                                             const std::vector<int64_t>& shape) const {
  M3_ASSIGN_OR_RETURN(WeightFormat f, format(name));
  struct Owned {
    std::vector<uint8_t> data, scale;
  };
  auto owned = std::make_shared<Owned>();
  RawWeight r;
  r.shape = shape;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = cols > 0 ? n / cols : 0;
  // The draw and the formats are window_values' (load_f32 is exactly their dequantisation).
  r.format = stored_format(f, shape);
  std::vector<float> w = draw_window(name, cols, WeightWindow::all(rows, cols));
  if (r.format == WeightFormat::kMxfp8) {
    M3_ASSIGN_OR_RETURN(Mxfp8Tensor q, quantize_mxfp8(w.data(), rows, cols));
    owned->data = std::move(q.codes);
    owned->scale = std::move(q.scales);
  } else if (r.format == WeightFormat::kNvfp4Compressed) {
    M3_ASSIGN_OR_RETURN(Nvfp4Tensor q,
                        quantize_nvfp4_with_global_scale(w.data(), rows, cols,
                                                         Nvfp4GlobalScale::kDivide,
                                                         dummy_nvfp4_global_scale()));
    owned->data = std::move(q.packed);
    owned->scale = std::move(q.scales);
    r.global_scale = q.global_scale;
  } else if (r.format == WeightFormat::kF32) {
    owned->data.resize(static_cast<size_t>(n) * 4);
    std::memcpy(owned->data.data(), w.data(), owned->data.size());
  } else {
    owned->data.resize(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = f32_to_bf16(w[static_cast<size_t>(i)]);
      std::memcpy(owned->data.data() + 2 * i, &b, 2);
    }
  }
  r.data = owned->data.data();
  r.data_bytes = owned->data.size();
  if (!owned->scale.empty()) {
    r.scale = owned->scale.data();
    r.scale_bytes = owned->scale.size();
  }
  r.keep_alive = owned;
  return r;
}

Result<LoadedModel> load_dummy_model(const std::string& dir, int64_t num_layers,
                                     Backend* backend) {
  LoadedModel lm;
  if (dir.empty()) {
    lm.config = builtin_m3_flash_config(num_layers);
  } else {
    M3_ASSIGN_OR_RETURN(lm.config, load_minimax_m3_config(dir));
    if (num_layers > 0 && num_layers < lm.config.num_hidden_layers) {
      lm.config.num_hidden_layers = num_layers;
      lm.config.layer_types.resize(static_cast<size_t>(num_layers));
      lm.config.mlp_layer_types.resize(static_cast<size_t>(num_layers));
    }
  }
  auto src = std::make_unique<DummyWeightSource>(lm.config);
  M3_ASSIGN_OR_RETURN(lm.model, Model::load(lm.config, *src, backend));
  lm.weights = std::move(src);
  if (!dir.empty()) {
    M3_ASSIGN_OR_RETURN(lm.eos_token_ids, read_generation_eos(dir));
  }
  if (lm.eos_token_ids.empty()) lm.eos_token_ids = lm.config.eos_token_ids;
  return lm;
}

}  // namespace m3::minimax_m3

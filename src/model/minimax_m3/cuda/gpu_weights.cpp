#include "model/minimax_m3/cuda/gpu_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/runtime/device_memory.h"
#include "core/dtype.h"
#include "loader/raw_slice.h"
#include "model/minimax_m3/weights.h"

namespace m3::minimax_m3 {
namespace {

using cuda::QuantFormat;

// One tensor's share of a fused matrix: rows [row_begin, row_begin + count()) of the tensor
// [rows, cols.full] (a tensor-parallel rank's heads or intermediate rows; all rows by default).
struct Part {
  std::string name;
  int64_t rows = 0;
  int64_t row_begin = 0, row_count = -1;  // -1: every row
  int64_t count() const { return row_count < 0 ? rows : row_count; }
};

// The column window every part of a fused matrix shares: columns [begin, begin + count) of
// `full` (a row-parallel linear's input slice: o_proj by heads, the down projections by
// intermediate columns).
struct Cols {
  int64_t full = 0, begin = 0, count = 0;
  static Cols all(int64_t k) { return {k, 0, k}; }
  bool whole() const { return begin == 0 && count == full; }
};

// A fused matrix [Σ rows, K] on the host, in one format.
struct HostMatrix {
  QuantFormat format = QuantFormat::kBf16;
  std::vector<uint8_t> w, s;
  float mult = 1.0f;  // NVFP4 multiplier
  int64_t n = 0, k = 0;
};

bool is_nvfp4(WeightFormat f) {
  return f == WeightFormat::kNvfp4Compressed || f == WeightFormat::kNvfp4ModelOpt;
}

// The multiplier the GEMV applies: compressed-tensors' global scale divides, ModelOpt's multiplies.
float nvfp4_multiplier(const RawWeight& r) {
  return r.format == WeightFormat::kNvfp4Compressed ? 1.0f / r.global_scale : r.global_scale;
}

void append(std::vector<uint8_t>* dst, const uint8_t* src, size_t bytes) {
  if (bytes) dst->insert(dst->end(), src, src + bytes);
}

// A part's window of the tensor dequantised to float32 [count, cols.count]. A quantised tensor is
// read by whole scale blocks (load_f32_window's rule): where the window's columns do not fall on
// them (tiny test models split over several ranks), the covering blocks are read and the window
// cut from them; dequantisation is per element, so the values are exact.
Result<HostTensorF32> load_part_f32(const WeightSource& src, const Part& p, const Cols& cols) {
  M3_ASSIGN_OR_RETURN(WeightFormat format, src.format(p.name));
  const int64_t block = weight_format_block(format);
  const int64_t lo = cols.begin / block * block;
  const int64_t hi = std::min(cols.full, (cols.begin + cols.count + block - 1) / block * block);
  const WeightWindow win{p.row_begin, p.row_begin + p.count(), lo, hi};
  M3_ASSIGN_OR_RETURN(HostTensorF32 t, src.load_f32_window(p.name, {p.rows, cols.full}, win));
  if (lo == cols.begin && hi == cols.begin + cols.count) return t;
  HostTensorF32 out;
  out.shape = {p.count(), cols.count};
  out.data.resize(static_cast<size_t>(p.count() * cols.count));
  for (int64_t r = 0; r < p.count(); ++r)
    std::copy_n(t.data.begin() + r * (hi - lo) + (cols.begin - lo), cols.count,
                out.data.begin() + r * cols.count);
  return out;
}

// Loads the windows of `parts` as one matrix [Σ count, cols.count], in their common quantised
// format when `allow_quant` and they agree (and the columns fall on their scale blocks), else
// BF16. Only the windows' bytes of the mapped checkpoint are read.
Result<HostMatrix> load_fused(const WeightSource& src, const std::vector<Part>& parts,
                              const Cols& cols, bool allow_quant) {
  HostMatrix m;
  const int64_t k = cols.count;
  m.k = k;
  for (const Part& p : parts) m.n += p.count();
  std::vector<RawWeight> raws;
  bool have_raw = true;
  for (const Part& p : parts) {
    Result<RawWeight> r = src.load_raw(p.name, {p.rows, cols.full});
    if (!r.is_ok()) {
      if (r.status().code() == StatusCode::kUnimplemented) {
        have_raw = false;
        break;
      }
      return r.status();
    }
    RawWeight raw = std::move(r).value();
    if (p.row_begin != 0 || p.count() != p.rows || !cols.whole()) {
      Result<RawWeight> window =
          slice_raw(raw, p.row_begin, p.row_begin + p.count(), cols.begin, cols.begin + cols.count);
      if (!window.is_ok()) {  // columns off the scale blocks: BF16 through float32 below
        have_raw = false;
        break;
      }
      raw = std::move(window).value();
    }
    raws.push_back(std::move(raw));
  }
  if (have_raw && allow_quant) {
    bool all_mx = k % 32 == 0, all_fp4 = k % 16 == 0;
    for (const RawWeight& r : raws) {
      all_mx &= r.format == WeightFormat::kMxfp8;
      all_fp4 &= is_nvfp4(r.format) && std::isfinite(nvfp4_multiplier(r)) &&
                 nvfp4_multiplier(r) == nvfp4_multiplier(raws[0]);
    }
    if (all_mx || all_fp4) {
      m.format = all_mx ? QuantFormat::kMxfp8 : QuantFormat::kNvfp4;
      m.mult = all_fp4 ? nvfp4_multiplier(raws[0]) : 1.0f;
      for (size_t i = 0; i < raws.size(); ++i) {
        const int64_t n = parts[i].count() * k;
        const size_t want_w = static_cast<size_t>(all_mx ? n : n / 2);
        const size_t want_s = static_cast<size_t>(all_mx ? n / 32 : n / 16);
        if (raws[i].data_bytes != want_w || raws[i].scale_bytes != want_s)
          return invalid_argument("[model.minimax_m3.cuda] tensor '" + parts[i].name +
                                  "': stored bytes do not match its format and shape");
        append(&m.w, raws[i].data, want_w);
        append(&m.s, raws[i].scale, want_s);
      }
      return m;
    }
  }
  // BF16: stored BF16 bytes as they are, anything else through float32.
  m.format = QuantFormat::kBf16;
  m.w.resize(static_cast<size_t>(m.n * k) * 2);
  size_t off = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const size_t bytes = static_cast<size_t>(parts[i].count() * k) * 2;
    if (have_raw && raws[i].format == WeightFormat::kBF16 && raws[i].data_bytes == bytes) {
      std::memcpy(m.w.data() + off, raws[i].data, bytes);
    } else {
      M3_ASSIGN_OR_RETURN(HostTensorF32 t, load_part_f32(src, parts[i], cols));
      for (size_t j = 0; j < t.data.size(); ++j) {
        const uint16_t b = f32_to_bf16(t.data[j]);
        std::memcpy(m.w.data() + off + 2 * j, &b, 2);
      }
    }
    off += bytes;
  }
  return m;
}

Status upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return cuda::copy_to_device(dst, src, bytes);
}

class Loader {
 public:
  Loader(const WeightSource& src, cuda::DeviceArena* arena, DevWeights* out)
      : src_(src), arena_(arena), out_(out) {}

  // A [Hd]-style vector as bf16.
  Result<uint16_t*> vec_bf16(const std::string& name, int64_t n) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32(name, {n}));
    std::vector<uint16_t> b(t.data.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(t.data[i]);
    M3_ASSIGN_OR_RETURN(uint16_t * d, arena_->alloc<uint16_t>(n, name));
    M3_RETURN_IF_ERROR(upload(d, b.data(), b.size() * 2));
    return d;
  }

  Result<float*> mat_f32(const std::string& name, int64_t rows, int64_t cols) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32(name, {rows, cols}));
    M3_ASSIGN_OR_RETURN(float* d, arena_->alloc<float>(rows * cols, name));
    M3_RETURN_IF_ERROR(upload(d, t.data.data(), t.data.size() * 4));
    return d;
  }

  Result<float*> vec_f32(const std::string& name, int64_t n) {
    M3_ASSIGN_OR_RETURN(HostTensorF32 t, src_.load_f32(name, {n}));
    M3_ASSIGN_OR_RETURN(float* d, arena_->alloc<float>(n, name));
    M3_RETURN_IF_ERROR(upload(d, t.data.data(), t.data.size() * 4));
    return d;
  }

  // One fused matrix.
  Result<DevMatrix> matrix(const std::vector<Part>& parts, const Cols& cols,
                           bool allow_quant = true) {
    M3_ASSIGN_OR_RETURN(HostMatrix h, load_fused(src_, parts, cols, allow_quant));
    M3_ASSIGN_OR_RETURN(DevMatrix d, alloc_like(h, 1, parts[0].name));
    M3_RETURN_IF_ERROR(put(d, 0, h));
    count(parts, h.format);
    return d;
  }

  // E fused matrices of one shape (routed experts), all in one format: the first expert's, or
  // BF16 for all when any expert disagrees.
  Result<DevMatrix> experts(const std::vector<std::vector<Part>>& per_expert, const Cols& k) {
    for (bool allow_quant : {true, false}) {
      M3_ASSIGN_OR_RETURN(HostMatrix first, load_fused(src_, per_expert[0], k, allow_quant));
      const int64_t g = static_cast<int64_t>(per_expert.size());
      M3_ASSIGN_OR_RETURN(DevMatrix d, alloc_like(first, g, per_expert[0][0].name));
      M3_RETURN_IF_ERROR(put(d, 0, first));
      bool uniform = true;
      for (int64_t e = 1; e < g && uniform; ++e) {
        M3_ASSIGN_OR_RETURN(HostMatrix h, load_fused(src_, per_expert[e], k, allow_quant));
        if (h.format != first.format || h.w.size() != first.w.size() ||
            h.s.size() != first.s.size()) {
          uniform = false;  // (the memory of this attempt stays in the arena until unload)
          break;
        }
        M3_RETURN_IF_ERROR(put(d, e, h));
      }
      if (uniform) {
        count(per_expert[0], first.format);
        return d;
      }
    }
    return internal_error("[model.minimax_m3.cuda] experts of '" + per_expert[0][0].name +
                          "' did not load as BF16");
  }

 private:
  Result<DevMatrix> alloc_like(const HostMatrix& h, int64_t g, const std::string& what) {
    DevMatrix d;
    d.format = h.format;
    d.n = h.n;
    d.k = h.k;
    d.groups = g;
    M3_ASSIGN_OR_RETURN(d.w, arena_->alloc<uint8_t>(g * static_cast<int64_t>(h.w.size()), what));
    const int64_t sbytes =
        h.format == QuantFormat::kBf16 ? 16 : g * static_cast<int64_t>(h.s.size());
    M3_ASSIGN_OR_RETURN(d.scale, arena_->alloc<uint8_t>(sbytes, what + " (scales)"));
    if (h.format == QuantFormat::kNvfp4) {
      M3_ASSIGN_OR_RETURN(d.global, arena_->alloc<float>(g, what + " (global)"));
    }
    return d;
  }

  Status put(const DevMatrix& d, int64_t e, const HostMatrix& h) {
    M3_RETURN_IF_ERROR(
        upload(d.w + e * static_cast<int64_t>(h.w.size()), h.w.data(), h.w.size()));
    if (h.format != QuantFormat::kBf16)
      M3_RETURN_IF_ERROR(
          upload(d.scale + e * static_cast<int64_t>(h.s.size()), h.s.data(), h.s.size()));
    if (d.global) M3_RETURN_IF_ERROR(upload(d.global + e, &h.mult, sizeof(float)));
    return Status::ok();
  }

  // A fused matrix counts as a fallback when its checkpoint format was quantised.
  void count(const std::vector<Part>& parts, QuantFormat got) {
    if (got != QuantFormat::kBf16) {
      ++out_->quantised_matrices;
      return;
    }
    for (const Part& p : parts) {
      Result<WeightFormat> f = src_.format(p.name);
      if (f.is_ok() && (*f == WeightFormat::kMxfp8 || is_nvfp4(*f))) {
        ++out_->bf16_fallbacks;
        return;
      }
    }
  }

  const WeightSource& src_;
  cuda::DeviceArena* arena_;
  DevWeights* out_;
};

Result<std::string> pick(const WeightSource& src, const std::string& a, const std::string& b) {
  if (src.has(a)) return a;
  if (src.has(b)) return b;
  return not_found("[model.minimax_m3.cuda] missing tensor: looked for '" + a + "', '" + b + "'");
}

// Gate and up of a SwiGLU MLP under `base` as parts (fused gate_up_proj or separate): the
// intermediate rows [begin, begin + count) of each.
std::vector<Part> gate_up_parts(const WeightSource& src, const std::string& base, int64_t inter,
                                int64_t begin, int64_t count) {
  if (src.has(base + "gate_up_proj.weight"))
    return {{base + "gate_up_proj.weight", 2 * inter, begin, count},
            {base + "gate_up_proj.weight", 2 * inter, inter + begin, count}};
  return {{base + "gate_proj.weight", inter, begin, count},
          {base + "up_proj.weight", inter, begin, count}};
}

// Layer i's weights as rank `rs` holds them (tensor_parallel.h): its query heads with their KV and
// index heads, its intermediate slices of the dense MLP, the shared expert and every routed
// expert it holds; the norms, the router and the index key projection whole.
Status load_layer(Loader& ld, const WeightSource& src, const MiniMaxM3Config& c,
                  const RankSlices& rs, const WeightNaming& naming, int64_t i, DevLayer* L) {
  const std::string p = naming.layer(i), a = p + "self_attn.";
  const int64_t hd = c.hidden_size, d = c.head_dim, h = c.num_attention_heads,
                hkv = c.num_key_value_heads, hix = c.index_n_heads, dix = c.index_head_dim;
  L->moe = c.is_moe_layer(i);
  M3_ASSIGN_OR_RETURN(L->in_norm, ld.vec_bf16(p + "input_layernorm.weight", hd));
  M3_ASSIGN_OR_RETURN(L->post_norm, ld.vec_bf16(p + "post_attention_layernorm.weight", hd));
  M3_ASSIGN_OR_RETURN(L->q_norm, ld.vec_bf16(a + "q_norm.weight", d));
  M3_ASSIGN_OR_RETURN(L->k_norm, ld.vec_bf16(a + "k_norm.weight", d));
  L->sparse = c.is_sparse_layer(i);
  // Index head j selects the blocks of KV head j: the rank's index heads are its KV heads'.
  std::vector<Part> qkv = {{a + "q_proj.weight", h * d, rs.q_begin * d, rs.q_count * d},
                           {a + "k_proj.weight", hkv * d, rs.kv_begin * d, rs.kv_count * d},
                           {a + "v_proj.weight", hkv * d, rs.kv_begin * d, rs.kv_count * d}};
  if (L->sparse) {  // a full_attention layer has no indexer: q | k | v only
    M3_ASSIGN_OR_RETURN(std::string iq,
                        pick(src, a + "index_q_proj.weight", a + "indexer.q_proj.weight"));
    M3_ASSIGN_OR_RETURN(std::string ik,
                        pick(src, a + "index_k_proj.weight", a + "indexer.k_proj.weight"));
    M3_ASSIGN_OR_RETURN(std::string iqn,
                        pick(src, a + "index_q_norm.weight", a + "indexer.q_norm.weight"));
    M3_ASSIGN_OR_RETURN(std::string ikn,
                        pick(src, a + "index_k_norm.weight", a + "indexer.k_norm.weight"));
    M3_ASSIGN_OR_RETURN(L->iq_norm, ld.vec_bf16(iqn, dix));
    M3_ASSIGN_OR_RETURN(L->ik_norm, ld.vec_bf16(ikn, dix));
    qkv.push_back({iq, hix * dix, rs.kv_begin * dix, rs.kv_count * dix});
    qkv.push_back({ik, dix});
  }
  M3_ASSIGN_OR_RETURN(L->qkv, ld.matrix(qkv, Cols::all(hd)));
  M3_ASSIGN_OR_RETURN(L->o, ld.matrix({{a + "o_proj.weight", hd}},
                                      Cols{h * d, rs.q_begin * d, rs.q_count * d}));
  const std::string m = p + "block_sparse_moe.";
  if (!L->moe) {
    std::string base;
    for (const std::string& b : {p + "mlp.", m})
      if (src.has(b + "gate_proj.weight") || src.has(b + "gate_up_proj.weight")) {
        base = b;
        break;
      }
    if (base.empty())
      return not_found("[model.minimax_m3.cuda] missing dense MLP of layer " + std::to_string(i) +
                       ": looked for '" + p + "mlp.gate_proj.weight' and '" + m +
                       "gate_proj.weight'");
    const int64_t inter = c.dense_intermediate_size;
    M3_ASSIGN_OR_RETURN(L->mlp_gu, ld.matrix(gate_up_parts(src, base, inter, rs.dense_begin,
                                                           rs.dense_count),
                                             Cols::all(hd)));
    M3_ASSIGN_OR_RETURN(L->mlp_down, ld.matrix({{base + "down_proj.weight", hd}},
                                               Cols{inter, rs.dense_begin, rs.dense_count}));
    return Status::ok();
  }
  const int64_t ne = c.num_local_experts, inter = c.intermediate_size;
  // The router in float32, as the checkpoint stores it (moe_route.h, router_logits.h).
  M3_ASSIGN_OR_RETURN(L->router, ld.mat_f32(m + "gate.weight", ne, hd));
  const std::string bias = src.has(m + "e_score_correction_bias")
                               ? m + "e_score_correction_bias"
                               : m + "gate.e_score_correction_bias";
  if (src.has(bias)) {
    M3_ASSIGN_OR_RETURN(L->router_bias, ld.vec_f32(bias, ne));
  } else if (c.use_routing_bias) {
    return not_found("[model.minimax_m3.cuda] missing tensor '" + m +
                     "e_score_correction_bias' (use_routing_bias is true)");
  }
  // The rank's experts [expert_begin, expert_begin + expert_count) (all without expert
  // parallelism), each at its intermediate slice.
  const size_t held = static_cast<size_t>(rs.expert_count);
  std::vector<std::vector<Part>> gu(held), down(held);
  for (size_t e = 0; e < held; ++e) {
    const std::string x = m + "experts." + std::to_string(rs.expert_begin + static_cast<int64_t>(e)) + ".";
    gu[e] = {{x + "w1.weight", inter, rs.inter_begin, rs.inter_count},
             {x + "w3.weight", inter, rs.inter_begin, rs.inter_count}};
    down[e] = {{x + "w2.weight", hd}};
  }
  M3_ASSIGN_OR_RETURN(L->experts_gu, ld.experts(gu, Cols::all(hd)));
  M3_ASSIGN_OR_RETURN(L->experts_down,
                      ld.experts(down, Cols{inter, rs.inter_begin, rs.inter_count}));
  const int64_t shared = c.shared_intermediate_size * c.n_shared_experts;
  if (shared > 0) {
    const std::string s = m + "shared_experts.";
    M3_ASSIGN_OR_RETURN(L->shared_gu, ld.matrix(gate_up_parts(src, s, shared, rs.shared_begin,
                                                              rs.shared_count),
                                                Cols::all(hd)));
    M3_ASSIGN_OR_RETURN(L->shared_down, ld.matrix({{s + "down_proj.weight", hd}},
                                                  Cols{shared, rs.shared_begin, rs.shared_count}));
  }
  return Status::ok();
}

// Random weights on the GPU (make_dummy_dev_weights).
class DummyMaker {
 public:
  DummyMaker(uint64_t seed, cuda::DeviceArena* arena) : seed_(seed), arena_(arena) {}

  Result<DevMatrix> matrix(QuantFormat f, int64_t n, int64_t k, int64_t g = 1) {
    DevMatrix d;
    d.format = f;
    d.n = n;
    d.k = k;
    d.groups = g;
    const int64_t e = g * n * k;
    const std::string what = "dummy weights";
    if (f == QuantFormat::kMxfp8) {
      M3_ASSIGN_OR_RETURN(d.w, arena_->alloc<uint8_t>(e, what));
      M3_ASSIGN_OR_RETURN(d.scale, arena_->alloc<uint8_t>(e / 32, what));
      M3_RETURN_IF_ERROR(fill(d.w, e, cuda::DummyKind::kE4m3Codes, 1.0f));
      M3_RETURN_IF_ERROR(fill(d.scale, e / 32, cuda::DummyKind::kE8m0Scales, 1.0f));
    } else if (f == QuantFormat::kNvfp4) {
      M3_ASSIGN_OR_RETURN(d.w, arena_->alloc<uint8_t>(e / 2, what));
      M3_ASSIGN_OR_RETURN(d.scale, arena_->alloc<uint8_t>(e / 16, what));
      M3_ASSIGN_OR_RETURN(d.global, arena_->alloc<float>(g, what));
      M3_RETURN_IF_ERROR(fill(d.w, e / 2, cuda::DummyKind::kE2m1Packed, 1.0f));
      M3_RETURN_IF_ERROR(fill(d.scale, e / 16, cuda::DummyKind::kE4m3Scales, 1.0f));
      // e2m1 (<= 6) x e4m3 scale (0.5 .. 120) x 2e-4: weights of magnitude ~0.01-0.1.
      const std::vector<float> mult(static_cast<size_t>(g), 2e-4f);
      M3_RETURN_IF_ERROR(upload(d.global, mult.data(), mult.size() * sizeof(float)));
    } else {
      M3_ASSIGN_OR_RETURN(d.w, arena_->alloc<uint8_t>(2 * e, what));
      M3_ASSIGN_OR_RETURN(d.scale, arena_->alloc<uint8_t>(16, what));
      M3_RETURN_IF_ERROR(fill(d.w, e, cuda::DummyKind::kBf16Normal, 0.02f));
    }
    return d;
  }

  Result<uint16_t*> vec_bf16(int64_t n, float scale) {
    M3_ASSIGN_OR_RETURN(uint16_t * d, arena_->alloc<uint16_t>(n, "dummy weights"));
    M3_RETURN_IF_ERROR(fill(d, n, cuda::DummyKind::kBf16Normal, scale));
    return d;
  }

  Result<float*> vec_f32(int64_t n, float scale) {
    M3_ASSIGN_OR_RETURN(float* d, arena_->alloc<float>(n, "dummy weights"));
    M3_RETURN_IF_ERROR(fill(d, n, cuda::DummyKind::kF32Normal, scale));
    return d;
  }

 private:
  Status fill(void* dst, int64_t count, cuda::DummyKind kind, float scale) {
    return cuda::fill_dummy(dst, count, kind, seed_ + 0x9E3779B97F4A7C15ull * ++tensor_, scale,
                            nullptr);
  }

  uint64_t seed_;
  uint64_t tensor_ = 0;
  cuda::DeviceArena* arena_;
};

}  // namespace

Result<DevWeights> make_dummy_dev_weights(const MiniMaxM3Config& c, uint64_t seed,
                                          cuda::DeviceArena* arena, int64_t experts_held,
                                          int64_t vocab_first, int64_t vocab_rows) {
  DevWeights w;
  DummyMaker mk(seed, arena);
  const int64_t hd = c.hidden_size, d = c.head_dim;
  const int64_t v = vocab_rows > 0 ? vocab_rows : c.vocab_size;
  w.vocab_first = vocab_rows > 0 ? vocab_first : 0;
  w.vocab_rows = v;
  const int64_t nqkv_full = c.num_attention_heads * d + 2 * c.num_key_value_heads * d;
  const int64_t nqkv_sparse = nqkv_full + c.index_n_heads * c.index_head_dim + c.index_head_dim;
  M3_ASSIGN_OR_RETURN(DevMatrix e, mk.matrix(QuantFormat::kBf16, v, hd));
  w.embed = reinterpret_cast<uint16_t*>(e.w);
  M3_ASSIGN_OR_RETURN(w.final_norm, mk.vec_bf16(hd, 0.01f));
  if (c.tie_word_embeddings) {
    w.lm_head = e;
  } else {
    M3_ASSIGN_OR_RETURN(w.lm_head, mk.matrix(QuantFormat::kBf16, v, hd));
  }
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DevLayer& L = w.layers[static_cast<size_t>(i)];
    L.moe = c.is_moe_layer(i);
    L.sparse = c.is_sparse_layer(i);
    M3_ASSIGN_OR_RETURN(L.in_norm, mk.vec_bf16(hd, 0.01f));
    M3_ASSIGN_OR_RETURN(L.post_norm, mk.vec_bf16(hd, 0.01f));
    M3_ASSIGN_OR_RETURN(L.q_norm, mk.vec_bf16(d, 0.01f));
    M3_ASSIGN_OR_RETURN(L.k_norm, mk.vec_bf16(d, 0.01f));
    if (L.sparse) {
      M3_ASSIGN_OR_RETURN(L.iq_norm, mk.vec_bf16(c.index_head_dim, 0.01f));
      M3_ASSIGN_OR_RETURN(L.ik_norm, mk.vec_bf16(c.index_head_dim, 0.01f));
    }
    M3_ASSIGN_OR_RETURN(L.qkv,
                        mk.matrix(QuantFormat::kMxfp8, L.sparse ? nqkv_sparse : nqkv_full, hd));
    M3_ASSIGN_OR_RETURN(L.o, mk.matrix(QuantFormat::kMxfp8, hd, c.num_attention_heads * d));
    w.quantised_matrices += 2;
    if (!L.moe) {
      const int64_t in = c.dense_intermediate_size;
      M3_ASSIGN_OR_RETURN(L.mlp_gu, mk.matrix(QuantFormat::kMxfp8, 2 * in, hd));
      M3_ASSIGN_OR_RETURN(L.mlp_down, mk.matrix(QuantFormat::kMxfp8, hd, in));
      w.quantised_matrices += 2;
      continue;
    }
    const int64_t ne = c.num_local_experts, in = c.intermediate_size;
    M3_ASSIGN_OR_RETURN(L.router, mk.vec_f32(ne * hd, 0.02f));
    M3_ASSIGN_OR_RETURN(L.router_bias, mk.vec_f32(ne, 0.01f));
    const int64_t held = experts_held > 0 ? experts_held : ne;
    M3_ASSIGN_OR_RETURN(L.experts_gu, mk.matrix(QuantFormat::kNvfp4, 2 * in, hd, held));
    M3_ASSIGN_OR_RETURN(L.experts_down, mk.matrix(QuantFormat::kNvfp4, hd, in, held));
    w.quantised_matrices += 2;
    const int64_t shared = c.shared_intermediate_size * c.n_shared_experts;
    if (shared > 0) {
      M3_ASSIGN_OR_RETURN(L.shared_gu, mk.matrix(QuantFormat::kMxfp8, 2 * shared, hd));
      M3_ASSIGN_OR_RETURN(L.shared_down, mk.matrix(QuantFormat::kMxfp8, hd, shared));
      w.quantised_matrices += 2;
    }
  }
  return w;
}

Result<DevWeights> load_dev_weights(const MiniMaxM3Config& cfg, const WeightSource& src,
                                    const RankSlices& rs, cuda::DeviceArena* arena) {
  DevWeights w;
  M3_ASSIGN_OR_RETURN(WeightNaming naming, detect_naming(src, cfg));
  Loader ld(src, arena, &w);
  const int64_t v = cfg.vocab_size, hd = cfg.hidden_size;
  if (rs.vocab_begin < 0 || rs.vocab_count < 1 || rs.vocab_begin + rs.vocab_count > v)
    return invalid_argument("[model.minimax_m3.cuda] vocabulary rows " +
                            std::to_string(rs.vocab_begin) + " + " +
                            std::to_string(rs.vocab_count) + " outside the vocabulary of " +
                            std::to_string(v));
  // The rank's vocabulary rows only.
  w.vocab_first = rs.vocab_begin;
  w.vocab_rows = rs.vocab_count;
  const auto rows = [&](const std::string& name) {
    return Part{name, v, rs.vocab_begin, rs.vocab_count};
  };
  const std::string embed = naming.model_prefix + "embed_tokens.weight";
  M3_ASSIGN_OR_RETURN(DevMatrix e, ld.matrix({rows(embed)}, Cols::all(hd), /*allow_quant=*/false));
  w.embed = reinterpret_cast<uint16_t*>(e.w);
  M3_ASSIGN_OR_RETURN(w.final_norm, ld.vec_bf16(naming.model_prefix + "norm.weight", hd));
  if (naming.lm_head.empty()) {
    w.lm_head = e;  // tied
  } else {
    M3_ASSIGN_OR_RETURN(w.lm_head,
                        ld.matrix({rows(naming.lm_head)}, Cols::all(hd), /*allow_quant=*/false));
  }
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
    M3_RETURN_IF_ERROR(
        load_layer(ld, src, cfg, rs, naming, i, &w.layers[static_cast<size_t>(i)]));
  return w;
}

Result<DevMatrix> load_dev_matrix(const WeightSource& src,
                                  const std::vector<std::pair<std::string, int64_t>>& parts,
                                  int64_t k, cuda::DeviceArena* arena) {
  DevWeights counts;  // the loader's format counters, unused here
  Loader ld(src, arena, &counts);
  std::vector<Part> ps;
  for (const auto& [name, rows] : parts) ps.push_back(Part{name, rows});
  return ld.matrix(ps, Cols::all(k));
}

Result<uint16_t*> load_dev_vec_bf16(const WeightSource& src, const std::string& name, int64_t n,
                                    cuda::DeviceArena* arena) {
  DevWeights counts;
  Loader ld(src, arena, &counts);
  return ld.vec_bf16(name, n);
}

Result<DevMatrix> make_dummy_dev_matrix(QuantFormat format, int64_t n, int64_t k, uint64_t seed,
                                        cuda::DeviceArena* arena) {
  DummyMaker mk(seed, arena);
  return mk.matrix(format, n, k);
}

Result<uint16_t*> make_dummy_dev_vec_bf16(int64_t n, float scale, uint64_t seed,
                                          cuda::DeviceArena* arena) {
  DummyMaker mk(seed, arena);
  return mk.vec_bf16(n, scale);
}

}  // namespace m3::minimax_m3

// The backend seam: device memory plus the op table the model calls. The CPU backend
// (backend/cpu) implements it in float32; a CUDA backend will implement the same calls.
//
// Conventions for every op:
//  * Ops are eager: the call returns when the result is written (a CUDA backend may enqueue on
//    its stream and synchronise in `synchronize()`).
//  * Pointers are device memory of this backend (host memory for the CPU backend). Shapes are
//    written outermost first, e.g. [T, H, D]; everything is row-major and contiguous unless a
//    stride field says otherwise. Strides are in elements.
//  * Letters: T tokens, H query heads, Hkv KV heads, D head dim, K reduction dim / top-k,
//    E experts, V vocab, P pages, S page size (tokens per page == sparse block size).
//  * Ops validate nothing that the model already guarantees; shape errors are internal
//    invariants (M3_CHECK), never user input.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/status.h"
#include "quant/kv_quant.h"

namespace m3 {

enum class DeviceKind { kCpu, kCuda };

// ---------------------------------------------------------------------------------------------
// Op parameter structs
// ---------------------------------------------------------------------------------------------

// y = x · W^T  (+ y when accumulate). Each output element is a length-K dot product whose
// summation order depends only on K (never on M, N or the thread count), so a row's result does
// not depend on which other rows are in the batch.
struct LinearParams {
  const float* x = nullptr;  // [M, K]
  const float* w = nullptr;  // [N, K] (PyTorch nn.Linear layout)
  float* y = nullptr;        // [M, N]; must not alias x or w
  int64_t m = 0, n = 0, k = 0;
  bool accumulate = false;   // y += x·W^T instead of y = x·W^T
};

// Gemma RMSNorm over the last dim: y = x / sqrt(mean(x²) + eps) · (1 + w). Also the per-head
// QK-norm: view [T, H, D] as rows = T·H, dim = D with one shared weight [D].
struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  const float* w = nullptr;  // [dim]
  float* y = nullptr;        // [rows, dim]; may alias x
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  bool unit_offset = true;   // true: scale by (1 + w) (Gemma); false: by w
};

// Partial half-split ("rotate_half", NeoX) RoPE, in place, on the first `rot_width` dims of
// every head; the rest pass through. Frequencies follow HF's table emb = cat(f, f) with
// f[i] = theta^(-2i/rotary_dim), i < rotary_dim/2, so dim d < rot_width uses f[d mod
// (rotary_dim/2)] and pairs with dim d ± rot_width/2. For the attention heads
// rot_width == rotary_dim; the indexer uses rot_width = min(rotary_dim, index_head_dim).
// Angles and cos/sin are float32, like HF.
struct RopeParams {
  float* x = nullptr;                 // [T, H, D], in place
  const int32_t* positions = nullptr; // [T]
  int64_t t = 0, h = 0, d = 0;
  int64_t rotary_dim = 0;             // frequency table width (even)
  int64_t rot_width = 0;              // rotated dims per head (even, <= d)
  double theta = 1e4;
};

// SwiGLU-OAI: g' = min(g, limit), u' = clamp(u, -limit, limit), out = g'·σ(alpha·g')·(u' + 1).
// Gate and up are the two halves of each input row (not interleaved).
struct SwigluOaiParams {
  const float* gate_up = nullptr;  // [M, 2·I]: gate = [:, :I], up = [:, I:]
  float* out = nullptr;            // [M, I]
  int64_t m = 0, inter = 0;
  float alpha = 1.702f;
  float limit = 7.0f;
};

// Sigmoid top-k router (MiniMax-M2/M3): s = σ(logits); choose the top-k experts by s + bias
// (ties: lower expert id first); weight_i = s_i / Σ_chosen s · scaling (unbiased scores).
// Output slots are sorted by expert id ascending.
struct RouterTopkParams {
  const float* logits = nullptr;  // [M, E] router logits (fp32)
  const float* bias = nullptr;    // [E] e_score_correction_bias; may be null (= 0)
  int32_t* topk_ids = nullptr;    // [M, K] chosen expert ids
  float* topk_weights = nullptr;  // [M, K]
  int64_t m = 0, num_experts = 0, top_k = 0;
  float scaling = 1.0f;           // routed_scaling_factor
};

// Routed experts: out[t] = Σ_slots weight[t,s] · (SwiGLU-OAI(x[t]·W13[e]^T) · W2[e]^T), summed in
// ascending slot order (slots come from RouterTopkParams, sorted by expert id). `out` is
// overwritten.
struct MoeExpertsParams {
  const float* x = nullptr;               // [M, Hd]
  // Host arrays of E device pointers (the backend may stage them).
  const float* const* w13 = nullptr;      // [E] pointers, each [2·I, Hd] (gate rows then up rows)
  const float* const* w2 = nullptr;       // [E] pointers, each [Hd, I]
  const int32_t* topk_ids = nullptr;      // [M, K]
  const float* topk_weights = nullptr;    // [M, K]
  float* out = nullptr;                   // [M, Hd]
  int64_t m = 0, hidden = 0, inter = 0, num_experts = 0, top_k = 0;
  float alpha = 1.702f;
  float limit = 7.0f;
};

// One layer of the paged KV cache. Page p holds tokens [p_logical·S, p_logical·S + S) of the
// sequence whose block table maps logical block p_logical to physical page p.
struct KvLayerView {
  float* k = nullptr;      // [P, S, Hkv, D] (after k_norm + RoPE)
  float* v = nullptr;      // [P, S, Hkv, D]
  float* idx_k = nullptr;  // [P, S, Dix] index keys (after index_k_norm + RoPE); null on
                           // layers without an indexer
  int64_t num_pages = 0, page_size = 0, num_kv_heads = 0, head_dim = 0, index_head_dim = 0;
  // --kv-cache-dtype: float32 uses k, v, idx_k above; any other dtype leaves them null and keeps
  // the same tensors in kq, vq, iq (quant/kv_quant.h; iq.codes null on layers without an
  // indexer). Ops quantise on kv_write and dequantise inside the indexer and attention.
  KvCacheDtype dtype = KvCacheDtype::kFloat32;
  KvQuantStore kq = {}, vq = {}, iq = {};

  bool quantised() const { return dtype != KvCacheDtype::kFloat32; }
  bool has_index_keys() const { return quantised() ? iq.codes != nullptr : idx_k != nullptr; }
};

// Write T new tokens of one sequence into the cache: token i goes to logical slot
// positions[i], i.e. page block_table[pos / S], row pos % S.
struct KvWriteParams {
  KvLayerView cache;
  const float* k = nullptr;           // [T, Hkv, D]
  const float* v = nullptr;           // [T, Hkv, D]
  const float* idx_k = nullptr;       // [T, Dix]; may be null (no indexer)
  const int32_t* positions = nullptr; // [T]
  const int32_t* block_table = nullptr;  // [num_blocks] physical page ids
  int64_t t = 0, num_blocks = 0;
};

// Lightning-indexer block selection for T query tokens of one sequence (§3.2-§3.3):
//   S_h(t, j) = <iq[t, h], idx_k[j]> for cached keys j <= positions[t] (others -inf),
//   B_h(t, b) = max_{j in block b} S_h(t, j),
//   forced blocks (local: b_q, b_q-1, ..., b_q-local+1 clamped at 0; init: 0..init-1) get +inf,
//   selection = the top min(top_k, b_q + 1) blocks among 0..b_q (ties: lower block id first),
//   written in descending score order, right-padded with -1 to top_k.
// Blocks after b_q = positions[t] / S are never selected (their score is -inf in HF too).
struct IndexerTopkParams {
  const float* iq = nullptr;             // [T, Hix, Dix] index queries (normed + roped)
  KvLayerView cache;                     // idx_k must hold every position <= max(positions)
  const int32_t* positions = nullptr;    // [T]
  const int32_t* block_table = nullptr;  // [num_blocks]
  int32_t* selected = nullptr;           // [T, Hix, top_k] block ids, -1 = empty slot
  int64_t t = 0, num_index_heads = 0, num_blocks = 0;
  int64_t top_k = 0, local_blocks = 1, init_blocks = 0;
};

// Causal GQA attention of T query tokens of one sequence over the paged cache. Query head n uses
// KV head n / (H / Hkv). Allowed keys for token t: j <= positions[t] and, when `selected` is not
// null, j / S in selected[t, n / (H / Hix)] (block-sparse MSA; Hix == Hkv). Softmax in float32
// with max subtraction. The cache must already hold every allowed key (write first).
struct PagedAttentionParams {
  const float* q = nullptr;              // [T, H, D] (normed + roped)
  KvLayerView cache;
  const int32_t* positions = nullptr;    // [T]
  const int32_t* block_table = nullptr;  // [num_blocks]
  const int32_t* selected = nullptr;     // [T, Hix, top_k] or null (dense causal)
  float* out = nullptr;                  // [T, H, D]
  int64_t t = 0, num_heads = 0, num_blocks = 0;
  int64_t num_index_heads = 0, top_k = 0;  // used when selected != null
  float scale = 1.0f;
};

// out[i] = table[ids[i]] (rows of `dim` floats).
struct EmbeddingParams {
  const float* table = nullptr;  // [V, dim]
  const int32_t* ids = nullptr;  // [T], each in [0, V)
  float* out = nullptr;          // [T, dim]
  int64_t t = 0, vocab = 0, dim = 0;
};

// y[i] = a[i] + b[i].
struct AddParams {
  const float* a = nullptr;  // [n]
  const float* b = nullptr;  // [n]
  float* y = nullptr;        // [n]; may alias a or b
  int64_t n = 0;
};

// out[r] = x[rows[r]] (row gather, rows of `dim` floats).
struct GatherRowsParams {
  const float* x = nullptr;       // [M, dim]
  const int32_t* rows = nullptr;  // [R]
  float* out = nullptr;           // [R, dim]
  int64_t num_rows = 0, dim = 0;
};

// ---------------------------------------------------------------------------------------------
// Backend
// ---------------------------------------------------------------------------------------------

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Device memory. alloc returns null when out of memory; free(nullptr) is a no-op.
  virtual void* alloc(int64_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src_host, int64_t bytes) = 0;
  virtual void copy_to_host(void* dst_host, const void* src, int64_t bytes) = 0;
  virtual void fill_zero(void* p, int64_t bytes) = 0;
  virtual void synchronize() = 0;

  // Ops (see the parameter structs above).
  virtual void linear(const LinearParams& p) = 0;
  virtual void rms_norm(const RmsNormParams& p) = 0;
  virtual void rope(const RopeParams& p) = 0;
  virtual void swiglu_oai(const SwigluOaiParams& p) = 0;
  virtual void router_topk(const RouterTopkParams& p) = 0;
  virtual void moe_experts(const MoeExpertsParams& p) = 0;
  virtual void kv_write(const KvWriteParams& p) = 0;
  virtual void indexer_topk(const IndexerTopkParams& p) = 0;
  virtual void paged_attention(const PagedAttentionParams& p) = 0;
  virtual void embedding(const EmbeddingParams& p) = 0;
  virtual void add(const AddParams& p) = 0;
  virtual void gather_rows(const GatherRowsParams& p) = 0;
};

// An owned, typed device allocation of `size` elements. Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* backend, int64_t size) : backend_(backend), size_(size) {
    if (size > 0) {
      ptr_ = static_cast<T*>(backend->alloc(size * static_cast<int64_t>(sizeof(T))));
      M3_CHECK(ptr_ != nullptr, "[backend.alloc] out of device memory for " +
                                    std::to_string(size * sizeof(T)) + " bytes");
    }
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = std::exchange(o.backend_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (ptr_ != nullptr) backend_->free(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  Backend* backend_ = nullptr;
  T* ptr_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace m3

#include "model/minimax_m3/cuda/cuda_dspark_draft.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/dspark/block_attention.h"
#include "backend/cuda/dspark/markov.h"
#include "backend/cuda/embed/embed_bf16.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/norm/add_rms_norm.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/rope/attention_inputs.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/device_memory.h"
#include "backend/cuda/runtime/graph.h"
#include "core/dtype.h"
#include "model/minimax_m3/cuda/gpu_weights.h"
#include "model/minimax_m3/dspark/dspark_kv_cache.h"
#include "model/minimax_m3/dspark/dspark_weights.h"
#include "model/minimax_m3/dspark/target_features.h"

namespace m3::minimax_m3 {
namespace {

using cuda::QuantFormat;

const std::string kWho = "[model.minimax_m3.cuda.dspark] ";

struct DraftLayer {
  uint16_t *in_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  DevMatrix qkv;     // [H·D + 2·Hkv·D, Hd]: q | k | v
  DevMatrix kv;      // a view of qkv's k | v rows (the context projection)
  DevMatrix o;       // [Hd, H·D]
  DevMatrix gu;      // [2·I, Hd]: gate | up
  DevMatrix down;    // [Hd, I]
};

// Rows [row0, row0 + rows) of a row-major matrix, as a matrix of its own (no copy).
DevMatrix row_view(const DevMatrix& m, int64_t row0, int64_t rows) {
  DevMatrix v = m;
  v.n = rows;
  if (m.format == QuantFormat::kBf16) {
    v.w = m.w + row0 * m.k * 2;
  } else if (m.format == QuantFormat::kMxfp8) {
    v.w = m.w + row0 * m.k;
    v.scale = m.scale + row0 * (m.k / 32);
  } else {  // NVFP4
    v.w = m.w + row0 * m.k / 2;
    v.scale = m.scale + row0 * (m.k / 16);
  }
  return v;
}

// CUDA events between a propose's phases (set_phase_timing): mark(phase) records the end of
// `phase` on the stream; finish() waits for the last event and adds each interval to the phase
// it ended. Off: every call is a no-op.
class PhaseTimer {
 public:
  enum Phase { kUploadEmbed, kQkvRope, kAttention, kOMlp, kLmHead, kChain, kStart };
  PhaseTimer() = default;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  ~PhaseTimer() = default;
  bool on = false;
  Status start(CUstream_st* st) {
    marks_.clear();
    return mark(st, kStart);
  }
  Status mark(CUstream_st* st, Phase ended) {
    if (!on) return Status::ok();
    if (marks_.size() == events_.size()) {
      M3_ASSIGN_OR_RETURN(cuda::Event e, cuda::Event::create_timed());
      events_.push_back(std::move(e));
    }
    M3_RETURN_IF_ERROR(events_[marks_.size()].record(st));
    marks_.push_back(ended);
    return Status::ok();
  }
  Status finish(CudaDSparkPhaseTimes* t) {
    if (!on || marks_.empty()) return Status::ok();
    M3_RETURN_IF_ERROR(events_[marks_.size() - 1].synchronize());
    *t = CudaDSparkPhaseTimes{};
    double* of[] = {&t->upload_embed_ms, &t->qkv_rope_ms, &t->attention_ms,
                    &t->o_mlp_ms,        &t->lm_head_ms,  &t->chain_ms};
    for (size_t i = 1; i < marks_.size(); ++i) {
      M3_ASSIGN_OR_RETURN(const float ms, cuda::Event::elapsed_ms(events_[i - 1], events_[i]));
      if (marks_[i] != kStart) *of[marks_[i]] += ms;
    }
    return Status::ok();
  }

 private:
  std::vector<cuda::Event> events_;
  std::vector<Phase> marks_;
};

// Sequences holding context memory; shared with the states so a state may outlive the draft.
struct ContextCount {
  int64_t live = 0;
};

// One sequence's draft context: the page bookkeeping (DSparkContextCache without storage) and,
// from its first use, its own bf16 pages (every layer's K and V, pages_per_sequence pages each,
// one allocation), which the block table's page ids index.
struct CudaState final : DraftState {
  std::unique_ptr<dspark::DSparkContextCache> pages;
  std::shared_ptr<cuda::CachingAllocator> alloc;
  std::shared_ptr<ContextCount> count;
  void* mem = nullptr;
  std::vector<cuda::KvCacheView> kv;  // per layer
  ~CudaState() override {
    if (mem != nullptr) {
      alloc->free(mem);
      --count->live;
    }
  }
  int64_t length() const override { return pages->length(); }
};

}  // namespace

struct CudaDSparkDraft::Impl {
  dspark::DSparkConfig cfg;
  MiniMaxM3Config target_cfg;
  DSparkCudaPlan plan;
  CudaDSparkOptions opt;
  CudaM3Model* target = nullptr;
  const DevWeights* tw = nullptr;
  cuda::DeviceArena arena;
  std::shared_ptr<cuda::CachingAllocator> alloc;  // scratch, and the states' context pages
  std::unique_ptr<cuda::PrefillGemm> gemm;
  std::vector<DraftLayer> layers;
  DevMatrix fc;
  uint16_t *hidden_norm = nullptr, *final_norm = nullptr;
  uint16_t *markov_w1 = nullptr, *markov_w2 = nullptr;
  std::vector<float> target_final_norm;  // host float32 (the final_norm_last convention)
  std::shared_ptr<ContextCount> contexts = std::make_shared<ContextCount>();
  PhaseTimer timer;
  CudaDSparkPhaseTimes phase_times;

  CUstream_st* st() const { return target->stream(); }
  float eps() const { return static_cast<float>(cfg.rms_norm_eps); }

  // y [rows, m.n] float32 = x [rows, m.k] bf16 · m^T. MXFP8 / NVFP4 up to kDSparkGemvRows rows
  // on the split-K GEMV (one pass over the weights for all rows); bf16 (fc, the lm_head) on it at
  // one row only, since kBf16SplitK takes 4 rows per pass over the weights (the lm_head at 7 rows
  // would read its 2.5 GB twice), and cuBLASLt reads them once, as the target's head does.
  Status linear(const DevMatrix& m, const uint16_t* x, int64_t rows, float* y,
                cuda::ScopedScratch& sc) {
    const bool gemv_fits = rows <= kDSparkGemvRows && m.groups == 1 &&
                           m.layout == cuda::WeightLayout::kRowMajor &&
                           (m.format == QuantFormat::kBf16 ? rows == 1 && m.k % 256 == 0
                                                           : m.k % 32 == 0);
    if (!gemv_fits) {
      cuda::PrefillLinearParams p;
      p.x = x;
      p.ldx = m.k;
      p.m = rows;
      p.w = m.prefill();
      p.y = y;
      p.ldy = m.n;
      p.out = cuda::PrefillOut::kF32;
      return gemm->linear(p, st());
    }
    const int64_t slices = cuda::quant_gemv_num_slices(m.format, m.k);
    M3_ASSIGN_OR_RETURN(float* partial, sc.get<float>(slices * rows * m.n));
    cuda::QuantGemvParams p;
    p.format = m.format;
    p.x = x;
    p.ldx = m.k;
    p.w = m.w;
    p.w_scale = m.format == QuantFormat::kBf16 ? nullptr : m.scale;
    p.w_global = m.global;
    p.num_rows = rows;
    p.n = m.n;
    p.k = m.k;
    p.partial = partial;
    p.kernel = m.format == QuantFormat::kBf16 ? cuda::GemvKernel::kBf16SplitK
                                              : cuda::GemvKernel::kDequantSplitK;
    M3_RETURN_IF_ERROR(cuda::launch_quant_gemv(p, st()));
    cuda::GemvEpilogueParams e;
    e.kind = cuda::GemvEpilogue::kStoreF32;
    e.partial = partial;
    e.num_slices = slices;
    e.num_rows = rows;
    e.n = m.n;
    e.y = y;
    e.ldy = m.n;
    return cuda::launch_quant_gemv_epilogue(e, st());
  }

  // The state's context pages, allocated on its first use (resource_exhausted past
  // max_sequences live contexts or when the device is full).
  Status ensure_context(CudaState& s) {
    if (s.mem != nullptr) return Status::ok();
    if (opt.max_sequences > 0 && contexts->live >= opt.max_sequences)
      return Status(StatusCode::kResourceExhausted,
                    kWho + "draft contexts of " + std::to_string(opt.max_sequences) +
                        " sequences are live (CudaDSparkOptions::max_sequences)");
    const int64_t per = plan.pages_per_sequence * plan.page_size * plan.kv_rows;  // elements
    auto mem = alloc->allocate(plan.layers * 2 * per * 2);
    if (!mem.is_ok())
      return Status(StatusCode::kResourceExhausted,
                    kWho + "no device memory for a sequence's draft context (" +
                        std::to_string(plan.kv_bytes_per_sequence) + " bytes): " +
                        mem.status().message());
    s.mem = mem.value();
    s.alloc = alloc;
    s.count = contexts;
    ++contexts->live;
    auto* base = static_cast<uint16_t*>(s.mem);
    for (int64_t l = 0; l < plan.layers; ++l) {
      cuda::KvCacheView c;
      c.k = base + (2 * l) * per;
      c.v = base + (2 * l + 1) * per;
      c.num_pages = plan.pages_per_sequence;
      c.page_size = plan.page_size;
      c.num_kv_heads = plan.kv_heads;
      c.head_dim = plan.head_dim;
      s.kv.push_back(c);
    }
    return Status::ok();
  }

  // linear over `rows` rows of a batched propose: the quantised linears in passes of up to
  // kDSparkGemvRows rows on the split-K GEMV (a pass over the weights each) up to
  // kDSparkBatchGemvPasses passes, where dequantising them for PrefillGemm would cost more; bf16
  // (the lm_head) and larger row counts as linear chooses (cuBLASLt, one pass).
  Status linear_rows(const DevMatrix& m, const uint16_t* x, int64_t rows, float* y,
                     cuda::ScopedScratch& sc) {
    if (m.format == QuantFormat::kBf16 || rows <= kDSparkGemvRows ||
        rows > kDSparkGemvRows * kDSparkBatchGemvPasses)
      return linear(m, x, rows, y, sc);
    for (int64_t r0 = 0; r0 < rows; r0 += kDSparkGemvRows) {
      const int64_t r = std::min(kDSparkGemvRows, rows - r0);
      M3_RETURN_IF_ERROR(linear(m, x + r0 * m.k, r, y + r0 * m.n, sc));
    }
    return Status::ok();
  }

  // The block forward of n sequences' blocks through the lm_head: [n·B, V] float32 logits in
  // scratch, sequence s's slots at rows s·B .. s·B + B - 1, before the Markov correction. Every
  // step runs once over all n·B rows: the norms, linears, q/k norm + RoPE, SwiGLU, the lm_head,
  // and the block attention (batched: each sequence's own context pages, block table and anchor
  // position).
  Result<float*> block_logits(std::span<CudaState* const> states,
                              std::span<const int32_t> anchors, cuda::ScopedScratch& sc) {
    const DSparkCudaPlan& P = plan;
    const int64_t n = static_cast<int64_t>(states.size()), b = P.block, hd = P.hidden;
    const int64_t vocab = P.vocab, rows = n * b;
    std::vector<int32_t> ids(static_cast<size_t>(rows), static_cast<int32_t>(cfg.noise_token_id));
    std::vector<int32_t> pos(static_cast<size_t>(rows)), tables;
    std::vector<int64_t> table_at(static_cast<size_t>(n)), table_len(static_cast<size_t>(n));
    for (int64_t s = 0; s < n; ++s) {
      const int32_t anchor = anchors[static_cast<size_t>(s)];
      if (anchor < 0 || anchor >= vocab)
        return invalid_argument(kWho + "anchor token " + std::to_string(anchor) +
                                " outside the vocabulary [0, " + std::to_string(vocab) + ")");
      CudaState& st_s = *states[static_cast<size_t>(s)];
      M3_RETURN_IF_ERROR(ensure_context(st_s));  // an empty context still needs its views
      const int64_t p = st_s.pages->length();
      ids[static_cast<size_t>(s * b)] = anchor;
      for (int64_t k = 0; k < b; ++k) pos[static_cast<size_t>(s * b + k)] = static_cast<int32_t>(p + k);
      const std::vector<int32_t>& table = st_s.pages->block_table();
      table_at[static_cast<size_t>(s)] = static_cast<int64_t>(tables.size());
      table_len[static_cast<size_t>(s)] = static_cast<int64_t>(table.size());
      tables.insert(tables.end(), table.begin(), table.end());
    }
    M3_ASSIGN_OR_RETURN(int32_t* ids_d, sc.get<int32_t>(rows));
    M3_ASSIGN_OR_RETURN(int32_t* pos_d, sc.get<int32_t>(rows));
    M3_ASSIGN_OR_RETURN(int32_t* tables_d, sc.get<int32_t>(static_cast<int64_t>(tables.size())));
    M3_ASSIGN_OR_RETURN(float* x, sc.get<float>(rows * hd));
    M3_ASSIGN_OR_RETURN(float* delta, sc.get<float>(rows * hd));
    M3_ASSIGN_OR_RETURN(uint16_t* h, sc.get<uint16_t>(rows * hd));
    M3_ASSIGN_OR_RETURN(float* qkv, sc.get<float>(rows * P.qkv_rows));
    M3_ASSIGN_OR_RETURN(uint16_t* q16, sc.get<uint16_t>(rows * P.q_rows));
    M3_ASSIGN_OR_RETURN(uint16_t* k16, sc.get<uint16_t>(rows * P.kv_rows));
    M3_ASSIGN_OR_RETURN(uint16_t* attn, sc.get<uint16_t>(rows * P.q_rows));
    M3_ASSIGN_OR_RETURN(float* gate_up, sc.get<float>(rows * 2 * P.inter));
    M3_ASSIGN_OR_RETURN(uint16_t* act, sc.get<uint16_t>(rows * P.inter));
    M3_ASSIGN_OR_RETURN(float* logits, sc.get<float>(rows * vocab));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(ids_d, ids.data(), ids.size() * 4, st()));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(pos_d, pos.data(), pos.size() * 4, st()));
    if (!tables.empty()) {
      M3_RETURN_IF_ERROR(
          cuda::copy_to_device_async(tables_d, tables.data(), tables.size() * 4, st()));
    }
    // Several sequences: one attention launch per layer over all of them, each CTA reading its
    // sequence's cache, table and anchor from seqs_d[l · n + s].
    cuda::DSparkBlockAttentionSeq* seqs_d = nullptr;
    std::vector<cuda::DSparkBlockAttentionSeq> seqs;  // the copy's source, kept to the end
    if (n > 1) {
      seqs.resize(static_cast<size_t>(P.layers * n));
      for (int64_t l = 0; l < P.layers; ++l) {
        for (int64_t s = 0; s < n; ++s) {
          const CudaState& st_s = *states[static_cast<size_t>(s)];
          cuda::DSparkBlockAttentionSeq& q = seqs[static_cast<size_t>(l * n + s)];
          q.cache_k_bf16 = st_s.kv[static_cast<size_t>(l)].k;
          q.cache_v_bf16 = st_s.kv[static_cast<size_t>(l)].v;
          q.num_blocks = table_len[static_cast<size_t>(s)];
          q.block_table = q.num_blocks > 0 ? tables_d + table_at[static_cast<size_t>(s)] : nullptr;
          q.anchor_pos = st_s.pages->length();
        }
      }
      const int64_t bytes = static_cast<int64_t>(seqs.size() * sizeof(cuda::DSparkBlockAttentionSeq));
      M3_ASSIGN_OR_RETURN(uint8_t* raw, sc.get<uint8_t>(bytes));
      seqs_d = reinterpret_cast<cuda::DSparkBlockAttentionSeq*>(raw);
      M3_RETURN_IF_ERROR(
          cuda::copy_to_device_async(seqs_d, seqs.data(), static_cast<size_t>(bytes), st()));
    }

    auto norm = [&](const float* d, const uint16_t* w) {
      cuda::AddRmsNormParams np;
      np.residual = x;
      np.delta = d;
      np.weight = w;
      np.out = h;
      np.t = rows;
      np.hidden = hd;
      np.eps = eps();
      return cuda::launch_add_rms_norm(np, st());
    };
    // Slot 0: the anchor, slots 1..B-1: the noise token, from the target's table.
    M3_RETURN_IF_ERROR(cuda::launch_embed_bf16({tw->embed, ids_d, x, rows, vocab, hd}, st()));
    M3_RETURN_IF_ERROR(timer.mark(st(), PhaseTimer::kUploadEmbed));
    // The block attention's shapes, the same in every layer, and its workspace (split partials).
    cuda::DSparkBlockAttentionParams shape;
    shape.num_pages = P.pages_per_sequence;
    shape.page_size = P.page_size;
    shape.block = b;
    shape.num_heads = P.heads;
    shape.num_kv_heads = P.kv_heads;
    shape.head_dim = P.head_dim;
    shape.window = P.window;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(P.head_dim));
    shape.seqs = seqs_d;  // null for one sequence
    shape.num_seqs = n > 1 ? n : 0;
    M3_ASSIGN_OR_RETURN(shape.workspace,
                        sc.get<float>(cuda::dspark_block_attention_workspace_floats(shape)));
    for (int64_t l = 0; l < P.layers; ++l) {
      const DraftLayer& L = layers[static_cast<size_t>(l)];
      M3_RETURN_IF_ERROR(norm(l == 0 ? nullptr : delta, L.in_norm));
      M3_RETURN_IF_ERROR(linear_rows(L.qkv, h, rows, qkv, sc));
      // Every row carries its own position; the cache view is only a shape (no cache write).
      cuda::AttentionInputsParams a = attention_inputs(L, *states[0], l);
      a.partial = qkv;
      a.ld = P.qkv_rows;
      a.t = rows;
      a.positions = pos_d;
      a.off_q = 0;
      a.off_k = P.q_rows;
      a.off_v = P.q_rows + P.kv_rows;
      a.num_q_heads = P.heads;
      a.q_out = q16;
      a.k_out = k16;
      a.max_blocks = 0;  // the block's K/V are transient: no cache write
      M3_RETURN_IF_ERROR(cuda::launch_attention_inputs(a, st()));
      M3_RETURN_IF_ERROR(timer.mark(st(), PhaseTimer::kQkvRope));
      cuda::DSparkBlockAttentionParams ap = shape;
      ap.q_bf16 = q16;
      ap.block_k_bf16 = k16;
      ap.block_v = qkv + P.q_rows + P.kv_rows;
      ap.ld_block_v = P.qkv_rows;
      ap.out_bf16 = attn;
      if (n > 1) {
        ap.seqs = seqs_d + l * n;
      } else {
        const CudaState& st0 = *states[0];
        const int64_t nb = table_len[0];
        ap.cache_k_bf16 = st0.kv[static_cast<size_t>(l)].k;
        ap.cache_v_bf16 = st0.kv[static_cast<size_t>(l)].v;
        ap.block_table = nb > 0 ? tables_d : nullptr;
        ap.num_blocks = nb;
        ap.anchor_pos = st0.pages->length();
      }
      M3_RETURN_IF_ERROR(cuda::launch_dspark_block_attention(ap, st()));
      M3_RETURN_IF_ERROR(timer.mark(st(), PhaseTimer::kAttention));
      M3_RETURN_IF_ERROR(linear_rows(L.o, attn, rows, delta, sc));
      M3_RETURN_IF_ERROR(norm(delta, L.post_norm));
      M3_RETURN_IF_ERROR(linear_rows(L.gu, h, rows, gate_up, sc));
      M3_RETURN_IF_ERROR(cuda::launch_swiglu_oai_bf16(gate_up, rows, P.inter,
                                                      static_cast<float>(cfg.swiglu_alpha),
                                                      static_cast<float>(cfg.swiglu_limit), act,
                                                      st()));
      M3_RETURN_IF_ERROR(linear_rows(L.down, act, rows, delta, sc));
      M3_RETURN_IF_ERROR(timer.mark(st(), PhaseTimer::kOMlp));
    }
    M3_RETURN_IF_ERROR(norm(P.layers > 0 ? delta : nullptr, final_norm));
    // All rows' base logits in one pass over the lm_head (cuBLASLt above one row, see linear).
    M3_RETURN_IF_ERROR(linear(tw->lm_head, h, rows, logits, sc));
    M3_RETURN_IF_ERROR(timer.mark(st(), PhaseTimer::kLmHead));
    return logits;
  }

  // The greedy Markov chain on the device for n sequences' logits [n·B, V] (block_logits'
  // layout), corrected in place: slot k of every sequence in one pass over markov_w2 (up to
  // kDSparkMarkovMaxRows sequences a launch), prev the anchor (anchors_d[s]) for slot 0 and the
  // sequence's previous argmax after it; tokens_d [n, B] gets every slot's argmax, which the next
  // slot's correction reads there.
  Status greedy_chain(float* logits, int64_t n, const int32_t* anchors_d, int32_t* tokens_d) {
    const int64_t b = plan.block, vocab = plan.vocab;
    // Rows per launch: the looked-up markov_w1 rows share 48 KB of shared memory.
    const int64_t per = std::max<int64_t>(
        1, std::min<int64_t>(cuda::kDSparkMarkovMaxRows, (48 * 1024 / 4) / plan.rank));
    cuda::DSparkMarkovParams mp;
    mp.w1 = markov_w1;
    mp.w2 = markov_w2;
    mp.vocab = vocab;
    mp.rank = plan.rank;
    mp.ld_logits = b * vocab;
    for (int64_t k = 0; k < b; ++k) {
      for (int64_t s0 = 0; s0 < n; s0 += per) {
        mp.num_rows = std::min(per, n - s0);
        mp.logits = logits + (s0 * b + k) * vocab;
        mp.prev_device = k == 0 ? anchors_d + s0 : tokens_d + s0 * b + (k - 1);
        mp.prev_stride = k == 0 ? 1 : b;
        M3_RETURN_IF_ERROR(cuda::launch_dspark_markov(mp, st()));
      }
      M3_RETURN_IF_ERROR(
          cuda::launch_dspark_argmax(logits + k * vocab, vocab, tokens_d + k, st(), n, b * vocab, b));
    }
    return Status::ok();
  }

  // The fused q/k norm + RoPE (+ cache write) of rope/attention_inputs.h with the draft's shapes.
  cuda::AttentionInputsParams attention_inputs(const DraftLayer& L, const CudaState& s,
                                               int64_t l) const {
    cuda::AttentionInputsParams a;
    a.num_slices = 1;
    a.num_kv_heads = plan.kv_heads;
    a.num_index_heads = 0;
    a.head_dim = plan.head_dim;
    a.q_norm = L.q_norm;
    a.k_norm = L.k_norm;
    a.rotary_dim = cfg.rot_dim();
    a.rot_width = cfg.rot_dim();
    a.eps = eps();
    a.theta = cfg.theta();
    a.cache = s.kv[static_cast<size_t>(l)];
    return a;
  }
};

CudaDSparkDraft::~CudaDSparkDraft() = default;

Result<std::unique_ptr<CudaDSparkDraft>> CudaDSparkDraft::load(dspark::DSparkConfig cfg,
                                                               CudaM3Model* target,
                                                               const WeightSource* src,
                                                               const std::string& where,
                                                               const CudaDSparkOptions& o) {
  if (target == nullptr) return invalid_argument(kWho + "no target model");
  const MiniMaxM3Config& whole = o.resolve_against ? *o.resolve_against : target->config();
  if (whole.hidden_size != target->config().hidden_size ||
      whole.vocab_size != target->config().vocab_size)
    return invalid_argument(kWho + "resolve_against differs from the target in hidden size or "
                                   "vocabulary");
  M3_RETURN_IF_ERROR(cfg.resolve_with_target(whole));
  M3_ASSIGN_OR_RETURN(DSparkCudaPlan plan, plan_dspark_cuda(cfg, o.page_size));
  if (o.max_sequences < 0)
    return invalid_argument(kWho + "max_sequences must not be negative, got " +
                            std::to_string(o.max_sequences));
  if (!o.dummy_weights && src == nullptr) return invalid_argument(kWho + "no weight source");
  if (const DevWeights& t = target->dev_weights();
      t.vocab_first != 0 || t.vocab_rows != whole.vocab_size)
    return invalid_argument(kWho + "the target holds vocabulary rows " +
                            std::to_string(t.vocab_first) + " + " + std::to_string(t.vocab_rows) +
                            " of " + std::to_string(whole.vocab_size) +
                            ": the draft reads the whole embedding and head (load the target's "
                            "rank 0 with CudaTensorParallel::whole_vocab_on_rank0)");
  M3_RETURN_IF_ERROR(cuda::set_current_device(target->device()));
  std::unique_ptr<CudaDSparkDraft> d(new CudaDSparkDraft());
  d->impl_ = std::make_unique<Impl>();
  Impl& im = *d->impl_;
  im.cfg = std::move(cfg);
  im.target_cfg = target->config();
  im.plan = plan;
  im.opt = o;
  im.target = target;
  im.tw = &target->dev_weights();
  im.alloc = std::make_shared<cuda::CachingAllocator>();
  M3_ASSIGN_OR_RETURN(im.gemm, cuda::PrefillGemm::create(im.alloc.get()));
  const int64_t hd = plan.hidden, v = plan.vocab, r = plan.rank;

  // Weights: the checkpoint's tensors, or dummy ones from a seed per tensor.
  uint64_t tensor = 0;
  auto seed = [&] { return o.dummy_seed + 0x9E3779B97F4A7C15ull * ++tensor; };
  std::string prefix;
  if (!o.dummy_weights) {
    for (const std::string& p : dspark::dspark_prefixes()) {
      if (src->has(p + "fc.weight")) {
        prefix = p;
        break;
      }
    }
    if (!src->has(prefix + "fc.weight"))
      return Status(StatusCode::kNotFound, kWho + where + ": no DSpark fc.weight under any prefix");
  }
  auto name_err = [&](const Status& s) {
    return Status(s.code(), kWho + where + ": " + s.message());
  };
  auto matrix = [&](QuantFormat dummy_format, std::vector<std::pair<std::string, int64_t>> parts,
                    int64_t k) -> Result<DevMatrix> {
    if (o.dummy_weights) {
      int64_t n = 0;
      for (const auto& p : parts) n += p.second;
      return make_dummy_dev_matrix(dummy_format, n, k, seed(), &im.arena);
    }
    for (auto& p : parts) p.first = prefix + p.first;
    auto m = load_dev_matrix(*src, parts, k, &im.arena);
    if (!m.is_ok()) return name_err(m.status());
    return m;
  };
  auto vec = [&](const std::string& name, int64_t n) -> Result<uint16_t*> {
    if (o.dummy_weights) return make_dummy_dev_vec_bf16(n, 0.01f, seed(), &im.arena);
    auto p = load_dev_vec_bf16(*src, prefix + name, n, &im.arena);
    if (!p.is_ok()) return name_err(p.status());
    return p;
  };
  // The Markov tables are read as bf16 by the correction kernel whatever their storage.
  auto table = [&](const std::string& name) -> Result<uint16_t*> {
    M3_ASSIGN_OR_RETURN(DevMatrix m, matrix(QuantFormat::kBf16, {{name, v}}, r));
    if (m.format != QuantFormat::kBf16)
      return Status(StatusCode::kUnimplemented,
                    kWho + where + ": tensor '" + prefix + name + "' is quantised; the Markov "
                    "head is read as bf16");
    return reinterpret_cast<uint16_t*>(m.w);
  };
  M3_ASSIGN_OR_RETURN(im.fc, matrix(QuantFormat::kBf16, {{"fc.weight", hd}}, plan.feature_width));
  M3_ASSIGN_OR_RETURN(im.hidden_norm, vec("hidden_norm.weight", hd));
  M3_ASSIGN_OR_RETURN(im.final_norm, vec("final_norm.weight", hd));
  M3_ASSIGN_OR_RETURN(im.markov_w1, table("markov_head.markov_w1.weight"));
  M3_ASSIGN_OR_RETURN(im.markov_w2, table("markov_head.markov_w2.weight"));
  for (int64_t l = 0; l < plan.layers; ++l) {
    const std::string lp = "layers." + std::to_string(l) + ".decoder_layer.";
    const std::string a = lp + "self_attn.", m = lp + "mlp.";
    DraftLayer L;
    M3_ASSIGN_OR_RETURN(L.in_norm, vec(lp + "input_layernorm.weight", hd));
    M3_ASSIGN_OR_RETURN(L.post_norm, vec(lp + "post_attention_layernorm.weight", hd));
    M3_ASSIGN_OR_RETURN(L.q_norm, vec(a + "q_norm.weight", plan.head_dim));
    M3_ASSIGN_OR_RETURN(L.k_norm, vec(a + "k_norm.weight", plan.head_dim));
    M3_ASSIGN_OR_RETURN(L.qkv, matrix(QuantFormat::kMxfp8,
                                      {{a + "q_proj.weight", plan.q_rows},
                                       {a + "k_proj.weight", plan.kv_rows},
                                       {a + "v_proj.weight", plan.kv_rows}},
                                      hd));
    L.kv = row_view(L.qkv, plan.q_rows, 2 * plan.kv_rows);
    M3_ASSIGN_OR_RETURN(L.o, matrix(QuantFormat::kMxfp8, {{a + "o_proj.weight", hd}}, plan.q_rows));
    M3_ASSIGN_OR_RETURN(L.gu, matrix(QuantFormat::kMxfp8,
                                     {{m + "gate_proj.weight", plan.inter},
                                      {m + "up_proj.weight", plan.inter}},
                                     hd));
    M3_ASSIGN_OR_RETURN(L.down, matrix(QuantFormat::kMxfp8, {{m + "down_proj.weight", hd}},
                                       plan.inter));
    im.layers.push_back(L);
  }
  // The weights were written on the legacy default stream, which the target's stream does not
  // wait for.
  M3_RETURN_IF_ERROR(cuda::synchronize_device());
  // The target's final norm on the host, for the final_norm_last convention.
  std::vector<uint16_t> fn(static_cast<size_t>(hd));
  M3_RETURN_IF_ERROR(cuda::copy_to_host_async(fn.data(), im.tw->final_norm, fn.size() * 2, im.st()));
  M3_RETURN_IF_ERROR(cuda::synchronize_stream(im.st()));
  im.target_final_norm.resize(fn.size());
  for (size_t i = 0; i < fn.size(); ++i) im.target_final_norm[i] = bf16_to_f32(fn[i]);
  return d;
}

int32_t CudaDSparkDraft::block_size() const { return static_cast<int32_t>(impl_->plan.block); }
std::vector<int32_t> CudaDSparkDraft::capture_layers() const {
  return dspark::capture_layers_for(impl_->cfg);
}
const dspark::DSparkConfig& CudaDSparkDraft::config() const { return impl_->cfg; }
const DSparkCudaPlan& CudaDSparkDraft::plan() const { return impl_->plan; }
int64_t CudaDSparkDraft::weight_bytes() const { return impl_->arena.bytes(); }

std::unique_ptr<DraftState> CudaDSparkDraft::new_state() {
  auto s = std::make_unique<CudaState>();
  s->pages = std::make_unique<dspark::DSparkContextCache>(nullptr, impl_->cfg, impl_->plan.page_size);
  return s;
}

Status CudaDSparkDraft::truncate(DraftState& state, int64_t new_length) {
  return static_cast<CudaState&>(state).pages->truncate(new_length);
}

Status CudaDSparkDraft::append_context(DraftState& state, std::span<const float> captured,
                                       int64_t n) {
  Impl& im = *impl_;
  M3_ASSIGN_OR_RETURN(std::vector<float> features,
                      dspark::build_context_features(captured, n, im.cfg, im.target_cfg,
                                                     im.cfg.capture, im.target_final_norm));
  return append_features(state, features, n);
}

Status CudaDSparkDraft::append_features(DraftState& state, std::span<const float> features,
                                        int64_t n) {
  Impl& im = *impl_;
  auto& s = static_cast<CudaState&>(state);
  const DSparkCudaPlan& P = im.plan;
  const int64_t width = P.feature_width;
  if (n < 0 || static_cast<int64_t>(features.size()) != n * width)
    return invalid_argument(kWho + "append_context: " + std::to_string(features.size()) +
                            " feature values for " + std::to_string(n) + " tokens of width " +
                            std::to_string(width));
  dspark::DSparkContextCache& pages = *s.pages;
  const int64_t start = pages.length(), end = start + n;
  if (end > int64_t{INT32_MAX} - P.block)
    return invalid_argument(kWho + "append_context: position " + std::to_string(end) +
                            " is out of range");
  M3_RETURN_IF_ERROR(cuda::set_current_device(im.target->device()));
  M3_RETURN_IF_ERROR(im.ensure_context(s));
  M3_RETURN_IF_ERROR(pages.prepare_append(end));
  // Positions the window of no later query can reach are neither computed nor stored.
  const int64_t first = std::max(start, pages.first_needed_position(end));
  const int64_t m = end - first;
  if (m > 0) {
    cuda::ScopedScratch sc(im.alloc.get());
    const std::vector<int32_t>& table = s.pages->block_table();
    const int64_t nb = static_cast<int64_t>(table.size());
    std::vector<int32_t> pos(static_cast<size_t>(m)), tables(static_cast<size_t>(m * nb));
    for (int64_t i = 0; i < m; ++i) {
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(first + i);
      std::copy(table.begin(), table.end(), tables.begin() + i * nb);
    }
    M3_ASSIGN_OR_RETURN(float* feat, sc.get<float>(m * width));
    M3_ASSIGN_OR_RETURN(uint16_t* feat16, sc.get<uint16_t>(m * width));
    M3_ASSIGN_OR_RETURN(float* ctx, sc.get<float>(m * P.hidden));
    M3_ASSIGN_OR_RETURN(uint16_t* ctx16, sc.get<uint16_t>(m * P.hidden));
    M3_ASSIGN_OR_RETURN(float* kvp, sc.get<float>(m * 2 * P.kv_rows));
    M3_ASSIGN_OR_RETURN(uint16_t* unused_q, sc.get<uint16_t>(m * P.head_dim));
    M3_ASSIGN_OR_RETURN(int32_t* pos_d, sc.get<int32_t>(m));
    M3_ASSIGN_OR_RETURN(int32_t* tables_d, sc.get<int32_t>(m * nb));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(
        feat, features.data() + (first - start) * width, static_cast<size_t>(m * width) * 4, im.st()));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(pos_d, pos.data(), pos.size() * 4, im.st()));
    M3_RETURN_IF_ERROR(
        cuda::copy_to_device_async(tables_d, tables.data(), tables.size() * 4, im.st()));
    // c = hidden_norm(fc(features)), one c per position for every layer.
    M3_RETURN_IF_ERROR(cuda::launch_f32_to_bf16(feat, feat16, m * width, im.st()));
    M3_RETURN_IF_ERROR(im.linear(im.fc, feat16, m, ctx, sc));
    cuda::AddRmsNormParams np;
    np.residual = ctx;
    np.weight = im.hidden_norm;
    np.out = ctx16;
    np.t = m;
    np.hidden = P.hidden;
    np.eps = im.eps();
    M3_RETURN_IF_ERROR(cuda::launch_add_rms_norm(np, im.st()));
    for (int64_t l = 0; l < P.layers; ++l) {
      const DraftLayer& L = im.layers[static_cast<size_t>(l)];
      // No input norm on c (the trainers' context projection): K|V = c · [W_k; W_v]^T.
      M3_RETURN_IF_ERROR(im.linear(L.kv, ctx16, m, kvp, sc));
      cuda::AttentionInputsParams a = im.attention_inputs(L, s, l);
      a.partial = kvp;
      a.ld = 2 * P.kv_rows;
      a.t = m;
      a.positions = pos_d;
      // The kernel wants a query segment: the first K head, normed with k_norm, into scratch.
      a.off_q = 0;
      a.num_q_heads = 1;
      a.q_norm = L.k_norm;
      a.q_out = unused_q;
      a.off_k = 0;
      a.off_v = P.kv_rows;
      a.block_tables = tables_d;
      a.max_blocks = nb;
      M3_RETURN_IF_ERROR(cuda::launch_attention_inputs(a, im.st()));
    }
    M3_RETURN_IF_ERROR(cuda::synchronize_stream(im.st()));
  }
  pages.set_length(end);
  return Status::ok();
}

Status CudaDSparkDraft::propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                                std::vector<int32_t>* tokens) {
  M3_ASSIGN_OR_RETURN(CudaDSparkProposal p, run_propose(state, anchor, &pick, false));
  *tokens = std::move(p.tokens);
  return Status::ok();
}

Status CudaDSparkDraft::propose_greedy(DraftState& state, int32_t anchor,
                                       std::vector<int32_t>* tokens) {
  M3_ASSIGN_OR_RETURN(CudaDSparkProposal p, run_propose(state, anchor, nullptr, false));
  *tokens = std::move(p.tokens);
  return Status::ok();
}

Result<CudaDSparkProposal> CudaDSparkDraft::propose_detail(DraftState& state, int32_t anchor,
                                                           const DraftTokenPicker& pick) {
  return run_propose(state, anchor, &pick, true);
}

void CudaDSparkDraft::set_phase_timing(bool on) { impl_->timer.on = on; }
const CudaDSparkPhaseTimes& CudaDSparkDraft::last_phase_times() const {
  return impl_->phase_times;
}

Status CudaDSparkDraft::propose_greedy_batch(std::span<DraftState* const> states,
                                             std::span<const int32_t> anchors,
                                             std::vector<std::vector<int32_t>>* tokens) {
  return propose_greedy_batch(states, anchors, tokens, nullptr);
}

Status CudaDSparkDraft::propose_greedy_batch(std::span<DraftState* const> states,
                                             std::span<const int32_t> anchors,
                                             std::vector<std::vector<int32_t>>* tokens,
                                             std::vector<float>* logits) {
  Impl& im = *impl_;
  if (states.size() != anchors.size() || states.empty())
    return invalid_argument(kWho + "propose_greedy_batch: " + std::to_string(states.size()) +
                            " states and " + std::to_string(anchors.size()) +
                            " anchors (one each, at least one)");
  std::vector<CudaState*> cs;
  for (DraftState* st : states) {
    auto* c = static_cast<CudaState*>(st);
    if (std::find(cs.begin(), cs.end(), c) != cs.end())
      return invalid_argument(kWho + "propose_greedy_batch: a state is given twice");
    cs.push_back(c);
  }
  const int64_t n = static_cast<int64_t>(cs.size()), b = im.plan.block, vocab = im.plan.vocab;
  M3_RETURN_IF_ERROR(cuda::set_current_device(im.target->device()));
  cuda::ScopedScratch sc(im.alloc.get());
  M3_RETURN_IF_ERROR(im.timer.start(im.st()));
  M3_ASSIGN_OR_RETURN(float* rows, im.block_logits(cs, anchors, sc));
  M3_ASSIGN_OR_RETURN(int32_t* anchors_d, sc.get<int32_t>(n));
  M3_ASSIGN_OR_RETURN(int32_t* tokens_d, sc.get<int32_t>(n * b));
  M3_RETURN_IF_ERROR(
      cuda::copy_to_device_async(anchors_d, anchors.data(), anchors.size() * 4, im.st()));
  M3_RETURN_IF_ERROR(im.greedy_chain(rows, n, anchors_d, tokens_d));
  std::vector<int32_t> flat(static_cast<size_t>(n * b));
  M3_RETURN_IF_ERROR(cuda::copy_to_host_async(flat.data(), tokens_d, flat.size() * 4, im.st()));
  if (logits != nullptr) {
    logits->resize(static_cast<size_t>(n * b * vocab));
    M3_RETURN_IF_ERROR(
        cuda::copy_to_host_async(logits->data(), rows, logits->size() * 4, im.st()));
  }
  M3_RETURN_IF_ERROR(im.timer.mark(im.st(), PhaseTimer::kChain));
  M3_RETURN_IF_ERROR(cuda::synchronize_stream(im.st()));
  M3_RETURN_IF_ERROR(im.timer.finish(&im.phase_times));
  tokens->assign(static_cast<size_t>(n), {});
  for (int64_t s = 0; s < n; ++s)
    (*tokens)[static_cast<size_t>(s)].assign(flat.begin() + s * b, flat.begin() + (s + 1) * b);
  return Status::ok();
}

Result<CudaDSparkProposal> CudaDSparkDraft::run_propose(DraftState& state, int32_t anchor,
                                                        const DraftTokenPicker* pick,
                                                        bool base_logits) {
  Impl& im = *impl_;
  auto* s = static_cast<CudaState*>(&state);
  const int64_t b = im.plan.block, vocab = im.plan.vocab;
  M3_RETURN_IF_ERROR(cuda::set_current_device(im.target->device()));
  cuda::ScopedScratch sc(im.alloc.get());
  M3_RETURN_IF_ERROR(im.timer.start(im.st()));
  M3_ASSIGN_OR_RETURN(float* logits, im.block_logits(std::span<CudaState* const>(&s, 1),
                                                     std::span<const int32_t>(&anchor, 1), sc));
  CudaDSparkProposal out;
  if (base_logits) {
    out.base_logits.resize(static_cast<size_t>(b * vocab));
    M3_RETURN_IF_ERROR(cuda::copy_to_host_async(out.base_logits.data(), logits,
                                                out.base_logits.size() * 4, im.st()));
  }
  if (pick == nullptr) {
    // Greedy on the device: slot k's argmax lands in tokens_d[k], which slot k + 1's correction
    // reads; the host waits once, for the B tokens.
    M3_ASSIGN_OR_RETURN(int32_t* anchor_d, sc.get<int32_t>(1));
    M3_ASSIGN_OR_RETURN(int32_t* tokens_d, sc.get<int32_t>(b));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(anchor_d, &anchor, 4, im.st()));
    M3_RETURN_IF_ERROR(im.greedy_chain(logits, 1, anchor_d, tokens_d));
    out.tokens.resize(static_cast<size_t>(b));
    M3_RETURN_IF_ERROR(cuda::copy_to_host_async(out.tokens.data(), tokens_d,
                                                out.tokens.size() * 4, im.st()));
    M3_RETURN_IF_ERROR(im.timer.mark(im.st(), PhaseTimer::kChain));
    M3_RETURN_IF_ERROR(cuda::synchronize_stream(im.st()));
    M3_RETURN_IF_ERROR(im.timer.finish(&im.phase_times));
    return out;
  }
  // The host picker: slot k's bias is markov_w2 · markov_w1[prev], prev the anchor for slot 0
  // and the previous slot's pick after it; each corrected row goes to the picker before the next
  // slot's correction.
  cuda::DSparkMarkovParams mp;
  mp.w1 = im.markov_w1;
  mp.w2 = im.markov_w2;
  mp.vocab = vocab;
  mp.rank = im.plan.rank;
  out.logits.resize(static_cast<size_t>(b * vocab));
  int32_t prev = anchor;
  for (int64_t k = 0; k < b; ++k) {
    float* row = logits + k * vocab;
    mp.logits = row;
    mp.prev = prev;
    M3_RETURN_IF_ERROR(cuda::launch_dspark_markov(mp, im.st()));
    float* host_row = out.logits.data() + k * vocab;
    M3_RETURN_IF_ERROR(
        cuda::copy_to_host_async(host_row, row, static_cast<size_t>(vocab) * 4, im.st()));
    M3_RETURN_IF_ERROR(cuda::synchronize_stream(im.st()));
    const int32_t tok = (*pick)(std::span<const float>(host_row, static_cast<size_t>(vocab)), k);
    if (tok < 0 || tok >= vocab)
      return invalid_argument(kWho + "the picker returned token " + std::to_string(tok) +
                              " for slot " + std::to_string(k) + ", outside the vocabulary");
    out.tokens.push_back(tok);
    prev = tok;
  }
  M3_RETURN_IF_ERROR(im.timer.mark(im.st(), PhaseTimer::kChain));
  M3_RETURN_IF_ERROR(im.timer.finish(&im.phase_times));
  return out;
}

}  // namespace m3::minimax_m3

// CudaM3Model's implementation state and per-step code (cuda_m3_model.h), shared by
// cuda_m3_model.cpp (forward and accessors) and cuda_m3_model_load.cpp (load, weight repacking,
// buffers and the KV pool). Private to those two files.
#pragma once

#include "model/minimax_m3/cuda/cuda_m3_model.h"


#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention/dense_decode.h"
#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/attention/sparse_decode_mma.h"
#include "backend/cuda/kv/kv_quant_cache.h"
#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/comm/one_shot_all_reduce.h"
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/gemv_plan.h"
#include "backend/cuda/gemm/mxfp8_repack.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/x_f16.h"
#include "backend/cuda/moe/moe_combine.h"
#include "backend/cuda/moe/moe_route.h"
#include "backend/cuda/moe/router_logits.h"
#include "backend/cuda/norm/add_rms_norm.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/rope/attention_inputs.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/device_memory.h"
#include "backend/cuda/runtime/graph.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/cuda/sampling/sample.h"
#include "backend/cuda/embed/embed_bf16.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/cuda/gpu_weights.h"
#include "model/minimax_m3/cuda/step_rows.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace m3::minimax_m3 {

namespace cuda_model_detail {

using cuda::GemvEpilogue;
using cuda::GemvEpilogueParams;
using cuda::GemvKernel;
using cuda::QuantFormat;
using cuda::WeightLayout;

constexpr int64_t kPage = 128;
// Decode attention may split a selected block's keys over up to this many CTAs (sparse_decode.h:
// small batches); the partial buffers are sized for it.
constexpr int64_t kKeySplits = 4;
// The widest decode block table (1M tokens of 128-token pages).
constexpr int64_t kMaxTablePages = 8192;
// Tokens of one slice that a capturing step (a draft's) runs as decode rows (a verify block is
// the draft's block + 1: 8 for the released draft).
constexpr int64_t kMaxDecodeSliceRows = 16;

static_assert(static_cast<int>(cuda::WeightLayout::kMmaRows16) ==
                  static_cast<int>(nvfp4_mma::Tiling::kRows16) &&
              static_cast<int>(cuda::WeightLayout::kMmaSwigluPairs) ==
                  static_cast<int>(nvfp4_mma::Tiling::kSwigluPairs),
              "a repacked matrix records its tiling as its WeightLayout");

inline int64_t next_pow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// Activation buffers of one step (decode: made at load for max_batch rows; general: per step).
struct Bufs {
  float *residual = nullptr, *delta = nullptr, *qkv = nullptr, *router_logits = nullptr,
        *topk_w = nullptr, *contrib = nullptr, *shared = nullptr, *gate_up = nullptr,
        *partial = nullptr, *block_scores = nullptr, *o_part = nullptr, *ml = nullptr,
        *logits = nullptr;
  // With ranks: every rank's logits of its vocabulary slice, [ranks, rows, head_width] (the
  // head's all-gather; Impl::head).
  float* logits_gather = nullptr;
  uint16_t *h = nullptr, *q = nullptr, *iq = nullptr, *attn = nullptr,
           *act = nullptr, *act_s = nullptr, *h_rows = nullptr;
  int32_t *ids = nullptr, *positions = nullptr, *tables = nullptr, *topk_ids = nullptr,
          *offs = nullptr, *sorted = nullptr, *active = nullptr, *selected = nullptr,
          *rows = nullptr;
  // The tensor-core GEMVs' inputs (f16 x a power of two per row, gemm/x_f16.h): the normed
  // hidden states and the attention output with their inverse factors; SwiGLU activations x 2^8.
  uint16_t *h16 = nullptr, *attn16 = nullptr, *act16 = nullptr, *act_s16 = nullptr;
  float *h_inv = nullptr, *attn_inv = nullptr;
  // A quantised KV cache: the step's new K, V and index-key rows (bf16), appended to their pages
  // by launch_kv_append_quantised after the attention inputs.
  uint16_t *kv_k_rows = nullptr, *kv_v_rows = nullptr, *kv_ik_rows = nullptr;
  uint32_t* route_counter = nullptr;  // launch_moe_route's arrival counter (zero between launches)
  cuda::SampleRowParams* sample_rows = nullptr;  // decode: per-row sampling knobs (device)
  int32_t* sampled = nullptr;                    // decode: the sampled token per row
  // decode: greedy rows' argmax over kSampleGreedySplits CTAs (SampleParams)
  float* greedy_value = nullptr;
  int32_t* greedy_index = nullptr;
  uint32_t* greedy_tickets = nullptr;
  // decode: every sampled row over several CTAs (cuda::SampleKernel::kMultiCta's workspace)
  cuda::SampleMultiCtaWorkspace sample_multi;
  int64_t partial_elems = 0;
  float* partial_side = nullptr;  // split-K scratch of the shared expert on the side stream
  int64_t partial_side_elems = 0;
};

// A GEMV input: bf16 rows and, for the tensor-core kernels, the same rows as f16 with their
// inverse per-row factors (or one constant factor).
struct GemvIn {
  const uint16_t* bf16 = nullptr;
  int64_t ld = 0;
  const uint16_t* f16 = nullptr;
  const float* inv = nullptr;
  float inv_const = 1.0f;
};

inline GemvEpilogueParams store_to(float* y, int64_t ldy) {
  GemvEpilogueParams e;
  e.kind = GemvEpilogue::kStoreF32;
  e.y = y;
  e.ldy = ldy;
  return e;
}

// How the next residual add + norm of the decode step gets its delta: stored in Bufs::delta, the
// split-K partials of the last GEMV (Bufs::partial), or the MoE combine of Bufs::contrib. The
// last two are summed inside the norm (norm/add_rms_norm.h), which saves the epilogue or combine
// launch on the critical path.
// kReduce: b.delta holds this rank's partial delta, which the next norm all-reduces itself (the
// one-shot all-reduce fused with the add + norm, CudaM3Kernels::fused_all_reduce_norm).
struct PendingDelta {
  enum Kind { kNone, kStored, kPartial, kMoe, kReduce } kind = kNone;
  int64_t slices = 0;              // kPartial
  const float* shared = nullptr;   // kMoe: the shared expert's output or nullptr
};

}  // namespace cuda_model_detail

using namespace cuda_model_detail;  // NOLINT: this private header's helpers, for Impl

struct CudaM3Model::Impl {
  // Declaration order is destruction order reversed: the arena (all load-time memory) goes last,
  // the PrefillGemm before the allocator it draws from.
  cuda::DeviceArena arena;
  MiniMaxM3Config cfg;
  CudaM3Options opt;
  cuda::Stream stream;
  cuda::Stream side;  // the shared expert's stream (at the device's least priority)
  cuda::Event fork_ev, join_ev;
  std::unique_ptr<cuda::CachingAllocator> alloc;
  std::unique_ptr<cuda::PrefillGemm> gemm;
  DevWeights w;
  std::vector<cuda::KvCacheView> kv;
  cuda::KvCacheView kv_stage;  // a quantised pool's bf16 staging (alloc_kv); else empty
  Bufs dec;  // decode buffers, max_batch rows
  int64_t dec_rows = 0, dec_mb_cap = 0;
  // Decode graphs by (batch bucket, table width, capture set + 1; 0 without capture).
  std::map<std::tuple<int64_t, int64_t, int64_t>, cuda::GraphExec> graphs;
  // Hidden-state capture on the decode path (a draft's steps): per capture set seen, its layers
  // and a buffer [layers, dec_rows, hd] float32 at a fixed address (the graphs write it). The
  // running decode step's set is dec_capture (-1: none).
  struct DecodeCapture {
    std::vector<int32_t> layers;
    float* buf = nullptr;
  };
  std::vector<DecodeCapture> dec_captures;
  int64_t dec_capture = -1;
  // This step's input embeddings (SequenceInput::embeddings): (row of the step, hidden-size
  // floats in host memory the caller keeps through forward()). They replace the rows' token
  // embeddings in the residual stream right after the gather, on either path; a decode step
  // with any runs eagerly (a graph replays fixed copies).
  std::vector<std::pair<int64_t, const float*>> inject;

  Status inject_embeddings(float* residual) {
    for (const auto& [row, values] : inject)
      M3_RETURN_IF_ERROR(cuda::copy_to_device_async(residual + row * hd, values,
                                                    static_cast<size_t>(hd) * 4, st()));
    return Status::ok();
  }
  CudaM3Stats stats;
  // Tensor parallelism (CudaTensorParallel): the ranks' all-reduces, and a device word for
  // agreeing on the KV pool's size.
  std::unique_ptr<comm::Communicator> comm;
  int64_t* agree = nullptr;
  // Page-locked host staging of a decode step: its inputs (ids, positions, block tables) and its
  // logits. From pageable memory each copy is staged by the driver in pieces: at 8 rows the
  // per-row logits copies took ~0.45 ms each (H200 CUPTI trace).
  // Grown on demand, never shrunk.
  cuda::PinnedHostBuffer host_stage;

  // Shapes.
  int64_t hd = 0, nh = 0, hkv = 0, d = 0, hix = 0, dix = 0, vocab = 0;
  // The vocabulary split (tensor_parallel.h, vocab_slice), as SGLang's vocabulary-parallel
  // embedding and head: this rank looks up the ids and computes the logits of
  // [vocab_begin, vocab_begin + vocab_count) (all of them with one rank). The ranks' lookups are
  // summed by an all-reduce, their logits all-gathered, each rank's padded to head_width (the
  // widest slice, rank 0's) so that the all-gather's counts are equal.
  int64_t vocab_begin = 0, vocab_count = 0, head_width = 0;
  int64_t nqkv = 0, off_k = 0, off_v = 0, off_iq = 0, off_ik = 0;
  int64_t ne = 0, kk = 0, inter = 0, dense_inter = 0, shared_inter = 0, top_k = 0;
  // Expert parallelism (CudaTensorParallel::ep): the routed experts this rank holds are the global
  // ids [expert_base, expert_base + local_experts) (all ne of them without it). Routing runs over
  // all ne experts on every rank; the grouping, the expert GEMVs / GEMMs and the combine take
  // only the local ones, and the all-reduce after the combine adds the other ranks' experts.
  int64_t expert_base = 0, local_experts = 0;
  bool expert_parallel() const { return local_experts != ne; }
  // Attention data parallelism (CudaTensorParallel::dp): `dp` groups, this rank's `dp_group`.
  // The running step's attention rows: this rank's group's, [att_first, att_first + att_rows)
  // of the step's rows (step_rows.h), its first att_decode one-token rows; without --dp all rows.
  // Set by forward() before the step runs; a decode graph bakes them in, and its key (the rows,
  // dp x the group stride) fixes them.
  int dp = 1, dp_group = 0;
  int64_t att_first = 0, att_rows = 0, att_decode = 0;
  bool dp_attention() const { return dp > 1; }
  int64_t max_mlp = 0;  // max(dense_inter, shared_inter)
  // Partial attention states per (decode row, head) in Bufs::o_part / ml: the sparse split's
  // top_k selected blocks x kKeySplits, and the dense layers' context splits (as many).
  int64_t attn_states = 1;
  float eps = 1e-6f, alpha = 1.702f, limit = 7.0f, scale = 0.0f, routed_scale = 1.0f;

  ~Impl() {
    // Nothing may still run on the memory freed below.
    if (stream.get() != nullptr) static_cast<void>(stream.synchronize());
    if (side.get() != nullptr) static_cast<void>(side.synchronize());
  }

  cudaStream_t st() const { return stream.get(); }

  // ---- Tensor parallelism.
  bool tp() const { return comm != nullptr; }
  // Rank 0 gathers the head's slices, samples and returns the model's outputs.
  bool output_rank() const { return opt.tp.rank == 0; }
  // The sum over the ranks of each rank's partial hidden-state delta [count], in place.
  Status all_reduce(float* buf, int64_t count) {
    return comm->all_reduce(buf, count, comm::DataType::kF32, comm::ReduceOp::kSum);
  }
  // Whether the decode all-reduce of `rows` rows runs fused with the next norm: a one-shot group,
  // the switch on, and a message the one-shot path takes (the communicator sends larger ones
  // through NCCL; every rank decides the same from the same rows).
  bool fused_reduce_norm(int64_t rows) const {
    return opt.tp.one_shot != nullptr && opt.kernels.fused_all_reduce_norm && hd % 4 == 0 &&
           hd <= 8192 && rows * hd <= opt.tp.one_shot->max_elements();
  }
  // After a decode GEMV stored this rank's partial delta in b.delta: the sum over the ranks is left
  // to the next norm where it can fuse it (kReduce), else taken here (kStored).
  Status reduce_delta(const Bufs& b, int64_t rows, PendingDelta* pending) {
    if (fused_reduce_norm(rows)) {
      *pending = {PendingDelta::kReduce, 0, nullptr};
      return Status::ok();
    }
    *pending = {PendingDelta::kStored, 0, nullptr};
    return all_reduce(b.delta, rows * hd);
  }
  // Waits for the step: with ranks, first for the collectives under the communicator's timeout
  // (a rank that died or stopped calling fails the step instead of hanging it).
  Status finish_step() {
    if (tp()) M3_RETURN_IF_ERROR(comm->synchronize());
    return stream.synchronize();
  }

  // ---- Attention data parallelism.

  // The buffers as this rank's attention sees them: the positions, block tables and normed
  // hidden states (with their f16 form) from its group's first row; the attention's own scratch
  // (q|k|v, q, index q, the output, partial states) from its start. `mb`: the tables' width.
  Bufs attention_view(const Bufs& b, int64_t mb) const {
    if (att_first == 0) return b;
    Bufs a = b;
    a.positions = b.positions + att_first;
    a.tables = b.tables + att_first * mb;
    a.h = b.h + att_first * hd;
    if (b.h16 != nullptr) a.h16 = b.h16 + att_first * hd;
    if (b.h_inv != nullptr) a.h_inv = b.h_inv + att_first;
    return a;
  }
  // Under --dp, before o_proj stores this rank's partial sum in its group's rows of b.delta: the
  // other groups' rows must add nothing to the all-reduce (it gathers them from their ranks).
  Status zero_other_groups(const Bufs& b, int64_t rows) {
    if (!dp_attention()) return Status::ok();
    return cuda::fill_zero_async(b.delta, static_cast<size_t>(rows * hd) * sizeof(float), st());
  }

  // ---- The vocabulary split.

  // The embedding of `rows` ids into out [rows, hd]: this rank's ids' rows, the others' zero, and
  // with ranks their sum (exact: each element is one rank's value plus zeros), so that every
  // rank's residual stream starts as the whole table's lookup.
  Status embed(const int32_t* ids, float* out, int64_t rows) {
    cuda::EmbedBf16Params p{w.embed + (vocab_begin - w.vocab_first) * hd, ids, out, rows,
                            vocab_count, hd};
    p.first_id = vocab_begin;
    M3_RETURN_IF_ERROR(cuda::launch_embed_bf16(p, st()));
    if (tp() && rows > 0) return all_reduce(out, rows * hd);
    return Status::ok();
  }

  // This rank's vocabulary rows of the head, read in place (from a whole head on rank 0 beside a
  // DSpark draft).
  DevMatrix head_slice() const {
    DevMatrix m = w.lm_head;
    m.w += (vocab_begin - w.vocab_first) * hd * 2;  // bf16 rows
    m.n = vocab_count;
    return m;
  }

  // The head on `rows` normed rows h [rows, hd]: logits [rows, vocab] on the output rank. One rank
  // computes them whole; with ranks each computes its slice into its block of `gather`
  // ([ranks, rows, head_width]; the narrower slices leave their last column unwritten, and it is
  // never read), one all-gather in place hands every rank every block, and the output rank puts
  // the blocks' columns in vocabulary order. Each logit is the same row's dot product with the same
  // weight row as the unsplit head's. `dec`: the decode path's buffers, where one row runs the
  // split-K GEMV on their scratch (sized for the head's slice at one row); from two rows, and on
  // the general path, a cuBLASLt GEMM (the weights read once for all rows: 2.2 ms -> ~0.6 ms at 8
  // rows for the whole M3.1-Flash head; descriptors cached, no allocation: capturable).
  Status head(const uint16_t* h, int64_t rows, float* gather, float* logits, const Bufs* dec) {
    const DevMatrix m = head_slice();
    const int64_t width = tp() ? head_width : vocab;
    float* mine = tp() ? gather + opt.tp.rank * rows * head_width : logits;
    if (dec != nullptr && rows == 1) {
      M3_RETURN_IF_ERROR(gemv(m, GemvIn{h, hd}, 1, store_to(mine, width), *dec));
    } else {
      M3_RETURN_IF_ERROR(plinear(m, h, hd, rows, mine, width));
    }
    if (!tp()) return Status::ok();
    M3_RETURN_IF_ERROR(comm->all_gather(mine, gather, rows * head_width, comm::DataType::kF32));
    if (!output_rank()) return Status::ok();
    for (int64_t q = 0; q < opt.tp.ranks; ++q) {
      const VocabSlice v = vocab_slice(vocab, q, opt.tp.ranks);
      M3_RETURN_IF_ERROR(cuda::copy_device_to_device_2d_async(
          logits + v.begin, static_cast<size_t>(vocab) * 4, gather + q * rows * head_width,
          static_cast<size_t>(head_width) * 4, static_cast<size_t>(v.count) * 4,
          static_cast<size_t>(rows), st()));
    }
    return Status::ok();
  }

  // ---- Kernel helpers (every launch's Status is checked).

  // Whether the decode GEMV of m at `rows` rows runs on the tensor cores (given its input's f16
  // form, which its producer then writes; gemv_plan.h).
  static bool tensor_core(const DevMatrix& m, int64_t rows) {
    return cuda::decode_gemv_on_tensor_cores(m.format, m.layout, rows, m.n, m.k);
  }

  // An MXFP8 matrix in the mma layout (repack_mxfp8): its decode GEMVs run kMmaDirect, which
  // reads the f16 input where there is one and converts the bf16 rows itself (up to 8) otherwise.
  static bool direct(const DevMatrix& m) {
    return m.format == QuantFormat::kMxfp8 && m.layout != WeightLayout::kRowMajor;
  }

  // The split-K kernel of m's format (the decode GEMVs that run neither tensor-core kernel).
  static GemvKernel split_k_kernel(const DevMatrix& m) {
    return m.format == QuantFormat::kBf16 ? GemvKernel::kBf16SplitK : GemvKernel::kDequantSplitK;
  }

  // The launch parameters every decode GEMV of m on the input shares (ungrouped, split-K).
  cuda::QuantGemvParams gemv_params(const DevMatrix& m, const GemvIn& in, int64_t rows,
                                    const Bufs& b) const {
    cuda::QuantGemvParams p;
    p.format = m.format;
    p.x = in.bf16;
    p.ldx = in.ld;
    p.xh = in.f16;
    p.x_inv_scale = in.inv;
    p.x_inv_const = in.inv_const;
    p.w = m.w;
    p.w_scale = m.scale;
    p.w_global = m.global;
    p.num_groups = m.groups;
    p.w_layout = m.layout;
    p.num_rows = rows;
    p.n = m.n;
    p.k = m.k;
    p.partial = b.partial;
    p.kernel = split_k_kernel(m);
    return p;
  }

  // A grouped GEMV's routing: the router's grouping in b (p->num_rows routed rows).
  static void group_by_routing(cuda::QuantGemvParams* p, const Bufs& b) {
    p->group_offsets = b.offs;
    p->sorted_rows = b.sorted;
    p->active_groups = b.active;
    p->num_slots = std::min<int64_t>(p->num_groups, p->num_rows);
  }

  // The decode GEMV of m on the input, on the kernel gemv_plan.h chooses: the tensor-core ones
  // with their epilogue fused (no scratch), else the split-K kernel + the epilogue launch.
  Status gemv(const DevMatrix& m, const GemvIn& in, int64_t rows, GemvEpilogueParams e,
              const Bufs& b, bool grouped = false, int64_t x_row_div = 1,
              cudaStream_t on = nullptr, bool weights_first = false,
              bool token_slots = false) {
    if (on == nullptr) on = st();
    cuda::QuantGemvParams p = gemv_params(m, in, rows, b);
    p.x_row_div = x_row_div;
    if (grouped) group_by_routing(&p, b);
    if (token_slots) {  // one token: slot s = its s-th expert (kMmaRing only: checked)
      p.token_topk_ids = b.topk_ids;
      p.token_group_base = expert_base;
      p.sorted_rows = nullptr;
    }
    p.kernel = cuda::choose_decode_gemv(m.format, m.layout, rows, m.n, m.k, in.f16 != nullptr);
    if (p.kernel == GemvKernel::kMmaDirect) {
      p.epilogue = e;
      // Programmatic launch on the main stream: the first weight stages stream under the
      // previous kernel's tail (the side stream's first kernel follows an event: plain).
      p.pdl = on == st();
      return cuda::launch_quant_gemv(p, on);
    }
    if (p.kernel == GemvKernel::kMmaRing) {
      p.epilogue = e;
      // Rows per group (grouped = the routed experts, `rows` = tokens x top_k; an expert gets at
      // most one row per token): at one, the ring kernel stages the activations with its weights.
      p.max_group_rows = grouped ? rows / kk : 0;
      // A plain launch (under PDL its CTAs would wait at their start; the whole chain launched
      // so was 1-4 % slower at batch 1: docs/performance.md), except with weights_first: neither
      // the weights nor the routing come from the kernel before (the experts' down product after
      // their gate|up, which lets its dependents start only after its own wait), so they are
      // requested before the wait, under PDL, and stream in the previous kernel's tail. Not on
      // the side stream, whose first kernel follows an event.
      if (weights_first && on == st()) p.pdl = p.weights_before_wait = true;
      return cuda::launch_quant_gemv(p, on);
    }
    if (e.kind == GemvEpilogue::kSwigluF16)
      return internal_error("[model.minimax_m3.cuda] f16 SwiGLU output needs a tensor-core GEMV");
    if (m.layout != WeightLayout::kRowMajor)
      return internal_error("[model.minimax_m3.cuda] an NVFP4 matrix in the mma layout without "
                            "its f16 input (kMmaRing)");
    p.pdl = p.kernel == GemvKernel::kDequantSplitK;
    e.pdl = true;
    e.partial = b.partial;
    e.num_slices = cuda::quant_gemv_num_slices(m.format, m.k);
    e.num_rows = rows;
    e.n = m.n;
    if (e.num_slices * rows * m.n > b.partial_elems)
      return internal_error("[model.minimax_m3.cuda] GEMV scratch too small: " +
                            std::to_string(e.num_slices * rows * m.n) + " > " +
                            std::to_string(b.partial_elems) + " floats");
    M3_RETURN_IF_ERROR(cuda::launch_quant_gemv(p, on));
    return cuda::launch_quant_gemv_epilogue(e, on);
  }

  // A split-K decode GEMV without its epilogue: the partial sums are left in b.partial
  // ([slices, rows, m.n]) for a consumer that sums them (the norm, attention inputs).
  Status gemv_partials(const DevMatrix& m, const GemvIn& in, int64_t rows, const Bufs& b,
                       int64_t* slices) {
    if (m.layout != WeightLayout::kRowMajor)
      return internal_error("[model.minimax_m3.cuda] split-K partials of an mma-layout matrix");
    cuda::QuantGemvParams p = gemv_params(m, in, rows, b);
    p.xh = nullptr;  // the split-K kernels read the bf16 rows
    p.pdl = p.kernel == GemvKernel::kDequantSplitK;
    *slices = cuda::quant_gemv_num_slices(m.format, m.k);
    if (*slices * rows * m.n > b.partial_elems)
      return internal_error("[model.minimax_m3.cuda] GEMV scratch too small for the partials");
    return cuda::launch_quant_gemv(p, st());
  }

  // A decode GEMV whose output is the residual delta [rows, m.n = hd]: a tensor-core kernel stores
  // it in b.delta; a split-K one leaves its partials in b.partial for the next norm to sum.
  Status gemv_to_delta(const DevMatrix& m, const GemvIn& in, int64_t rows, const Bufs& b,
                       PendingDelta* pending) {
    if ((in.f16 != nullptr || direct(m)) && tensor_core(m, rows)) {
      *pending = {PendingDelta::kStored, 0, nullptr};
      return gemv(m, in, rows, store_to(b.delta, hd), b);
    }
    int64_t slices = 0;
    M3_RETURN_IF_ERROR(gemv_partials(m, in, rows, b, &slices));
    *pending = {PendingDelta::kPartial, slices, nullptr};
    return Status::ok();
  }

  // residual += pending delta; h (and its f16 form for the tensor-core GEMVs) = norm(residual) ·
  // (1 + weight).
  // pdl: launched as a programmatic dependent of the kernel before it (the layers' two norms; it
  // waits before it reads, and its own dependents, the router or the q/k/v GEMV, then launch
  // under its predecessor's tail).
  Status add_norm(const Bufs& b, const PendingDelta& pd, const uint16_t* weight, int64_t rows,
                  bool f16_copy, bool pdl) {
    cuda::AddRmsNormParams np = norm_params(b, pd, weight, rows, f16_copy);
    np.pdl = pdl;
    if (pd.kind == PendingDelta::kReduce)  // the ranks' sum of b.delta, the add and the norm
      return opt.tp.one_shot->all_reduce_add_rms_norm(opt.tp.rank, b.delta, np, st());
    return cuda::launch_add_rms_norm(np, st());
  }
  cuda::AddRmsNormParams norm_params(const Bufs& b, const PendingDelta& pd,
                                     const uint16_t* weight, int64_t rows, bool f16_copy) const {
    cuda::AddRmsNormParams np{b.residual, nullptr, weight, b.h, rows, hd, eps};
    if (f16_copy) np.out_f16 = b.h16, np.out_inv_scale = b.h_inv;
    np.cluster_rows = opt.tuning.cluster_norm_max_rows;
    switch (pd.kind) {
      case PendingDelta::kNone: break;
      case PendingDelta::kReduce: break;  // the delta is the fused all-reduce's message
      case PendingDelta::kStored: np.delta = b.delta; break;
      case PendingDelta::kPartial:
        np.delta_partial = b.partial;
        np.delta_slices = pd.slices;
        break;
      case PendingDelta::kMoe:
        np.moe_contrib = b.contrib;
        np.moe_weights = b.topk_w;
        np.moe_shared = pd.shared;
        np.moe_top_k = kk;
        break;
    }
    return np;
  }

  Status plinear(const DevMatrix& m, const uint16_t* x, int64_t ldx, int64_t rows, float* y,
                 int64_t ldy) {
    cuda::PrefillLinearParams p;
    p.x = x;
    p.ldx = ldx;
    p.m = rows;
    p.w = m.prefill();
    p.y = y;
    p.ldy = ldy;
    p.out = cuda::PrefillOut::kF32;
    return gemm->linear(p, st());
  }

  // q, index q (normed + roped, bf16) and the KV-cache write (K, V, index key) of every row (row
  // i: block_tables[i * mb ...]; -1 pages skipped), in one launch from the projection's `slices`
  // planes of [rows, L.qkv.n] (split-K partials, summed here; 1: the plain projection). A
  // full_attention layer has no index heads: q, K and V only.
  Status attention_inputs(const Bufs& b, int64_t layer, const float* proj, int64_t slices,
                                int64_t rows, int64_t mb) {
    const DevLayer& L = w.layers[static_cast<size_t>(layer)];
    cuda::AttentionInputsParams p;
    p.partial = proj;
    p.num_slices = slices;
    p.ld = L.qkv.n;
    p.t = rows;
    p.positions = b.positions;
    p.off_q = 0;
    p.off_k = off_k;
    p.off_v = off_v;
    p.off_iq = off_iq;
    p.off_ik = off_ik;
    p.num_q_heads = nh;
    p.num_kv_heads = hkv;
    p.num_index_heads = L.sparse ? hix : 0;
    p.head_dim = d;
    p.index_head_dim = dix;
    p.q_norm = L.q_norm;
    p.k_norm = L.k_norm;
    p.iq_norm = L.iq_norm;
    p.ik_norm = L.ik_norm;
    p.rotary_dim = cfg.rotary_dim;
    p.rot_width = std::min(cfg.rotary_dim, d);
    p.eps = eps;
    p.theta = cfg.rope_theta;
    p.q_out = b.q;
    p.iq_out = b.iq;
    p.cache = kv[static_cast<size_t>(layer)];
    p.block_tables = b.tables;
    p.max_blocks = mb;
    p.pdl = true;
    if (!p.cache.quantised()) return cuda::launch_attention_inputs(p, st());
    p.k_out = b.kv_k_rows;
    p.v_out = b.kv_v_rows;
    p.ik_out = L.sparse ? b.kv_ik_rows : nullptr;
    M3_RETURN_IF_ERROR(cuda::launch_attention_inputs(p, st()));
    cuda::KvAppendQuantisedParams ap;
    ap.cache = p.cache;
    ap.k = p.k_out;
    ap.v = p.v_out;
    ap.idx_k = p.ik_out;
    ap.positions = b.positions;
    ap.block_tables = b.tables;
    ap.t = rows;
    ap.max_blocks = mb;
    return cuda::launch_kv_append_quantised(ap, st());
  }

  // Whether one-token rows with block tables of width mb attend every block without the indexer:
  // where the width is at most the indexer's top-k it would select every block anyway.
  bool every_block_fits(int64_t mb) const { return mb <= top_k; }

  // Indexer + block-sparse attention for `rows` one-token rows (their q/iq/positions/tables are
  // the first rows of b); output into b.attn. Tables of width <= top_k: no indexer, every block.
  Status decode_attention(const Bufs& b, int64_t layer, int64_t rows, int64_t mb) {
    if (rows == 0) return Status::ok();
    if (!w.layers[static_cast<size_t>(layer)].sparse) {
      return dense_decode_attention(b, layer, rows, mb);  // full_attention: every block
    }
    const cuda::KvCacheView& cache = kv[static_cast<size_t>(layer)];
    const bool every_block = every_block_fits(mb);
    cuda::IndexerDecodeParams ip;
    ip.iq = b.iq;
    ip.cache = cache;
    ip.positions = b.positions;
    ip.block_tables = b.tables;
    ip.batch = rows;
    ip.num_index_heads = hix;
    ip.max_blocks = mb;
    ip.top_k = top_k;
    ip.local_blocks = cfg.index_local_blocks;
    ip.init_blocks = cfg.index_init_blocks;
    ip.block_scores = b.block_scores;
    ip.selected = b.selected;
    // The scoring as a programmatic dependent of the attention inputs (which let it start only
    // after their own wait, so its CTAs never sit beside the q/k/v GEMV), the index keys of
    // earlier positions loaded before its wait: one row per sequence, so they are earlier steps'.
    ip.pdl = true;
    // Not in a capturing step: its rows may be several tokens of one slice, whose keys at the
    // earlier rows' positions the attention inputs (the previous kernel) write in this step.
    ip.keys_before_wait = dec_capture < 0;
    cuda::SparseDecodeParams ap;
    ap.q = b.q;
    ap.cache = cache;
    ap.positions = b.positions;
    ap.block_tables = b.tables;
    ap.selected = every_block ? nullptr : b.selected;
    ap.batch = rows;
    ap.num_heads = nh;
    ap.max_blocks = mb;
    ap.top_k = top_k;
    ap.scale = scale;
    ap.o_partial = b.o_part;
    ap.ml_partial = b.ml;
    ap.max_key_splits = kKeySplits;
    ap.mma = true;
    ap.cluster_combine = true;
    // The clustered split selects from the block scores itself: no top-k launch.
    const bool clusters = cuda::sparse_decode_clusters(ap);
    const bool cluster_select =
        clusters && !every_block && hix == hkv && mb <= cuda::kClusterSelectMax;
    if (cluster_select) {
      ip.skip_topk = true;
      ap.selected = nullptr;
      ap.block_scores = b.block_scores;
      ap.local_blocks = cfg.index_local_blocks;
      ap.init_blocks = cfg.index_init_blocks;
    }
    if (!every_block) M3_RETURN_IF_ERROR(cuda::launch_indexer_decode(ip, st()));
    // The clustered split as a programmatic dependent of the kernel before it (the unclustered
    // split is slower so: its wait ends later than a graph edge starts it); where it selects
    // itself, o_proj may launch at its start and stream its first weights while the scoring
    // computes.
    if (clusters) {
      ap.pdl = true;
      ap.dependents_at_start = cluster_select;
    }
    ap.out = b.attn;
    return cuda::launch_sparse_decode(ap, st());
  }

  // Dense attention of a full_attention layer for `rows` one-token rows: every block of each row
  // through the split-context kernel (dense_decode.h), at most attn_states splits per row, so the
  // partial buffers sized for the sparse layers serve any context.
  Status dense_decode_attention(const Bufs& b, int64_t layer, int64_t rows, int64_t mb) {
    cuda::DenseDecodeParams p;
    p.q = b.q;
    p.cache = kv[static_cast<size_t>(layer)];
    p.positions = b.positions;
    p.block_tables = b.tables;
    p.batch = rows;
    p.num_heads = nh;
    p.max_blocks = mb;
    p.max_splits = attn_states;
    p.scale = scale;
    p.pdl = true;  // after the attention inputs, which let dependents launch
    p.o_partial = b.o_part;
    p.ml_partial = b.ml;
    p.out = b.attn;
    return cuda::launch_dense_decode(p, st());
  }

  // ---- Decode path (GEMV), `rows` = the batch bucket, tables of width mb.

  // One layer; *pending says how the residual delta of the previous layer is to be added (and
  // on return, this layer's).
  Status decode_layer(const Bufs& b, int64_t layer, int64_t rows, int64_t mb,
                      PendingDelta* pending) {
    const DevLayer& L = w.layers[static_cast<size_t>(layer)];
    // The norms also write the f16 form of their output for the tensor-core GEMVs.
    const GemvIn h_in{b.h, hd, b.h16, b.h_inv};
    M3_RETURN_IF_ERROR(add_norm(b, *pending, L.in_norm, rows, true, true));
    // The residual now holds the previous layer's output.
    if (layer > 0) M3_RETURN_IF_ERROR(capture_decode_rows(b, layer - 1, rows));
    // Attention on this rank's rows: all of them, or under --dp its group's `ar` rows (padding
    // included) seen through `a` (attention_view); their o_proj sums land in the group's rows of
    // b.delta, the other groups' rows zeroed (zero_other_groups, before the q|k|v GEMV so that the
    // memset does not sit between the attention and the o_proj it lets launch early).
    const int64_t ar = dp_attention() ? att_rows : rows;
    const Bufs a = attention_view(b, mb);
    const GemvIn ah_in{a.h, hd, a.h16, a.h_inv};
    M3_RETURN_IF_ERROR(zero_other_groups(b, rows));
    // The projection's partial sums (or, on the tensor cores, its output) go straight into the fused
    // split-K sum + QK norm/RoPE + KV-cache write.
    int64_t slices = 1;
    const float* proj = a.qkv;
    if (ah_in.f16 != nullptr && tensor_core(L.qkv, ar)) {
      M3_RETURN_IF_ERROR(gemv(L.qkv, ah_in, ar, store_to(a.qkv, L.qkv.n), a));
    } else {
      M3_RETURN_IF_ERROR(gemv_partials(L.qkv, ah_in, ar, a, &slices));
      proj = a.partial;
    }
    M3_RETURN_IF_ERROR(attention_inputs(a, layer, proj, slices, ar, mb));
    M3_RETURN_IF_ERROR(decode_attention(a, layer, ar, mb));
    // The attention output's f16 form for a tensor-core o_proj; kMmaDirect converts one row
    // itself (no launch).
    const bool o_f16 = tensor_core(L.o, ar) && !(direct(L.o) && ar == 1);
    if (o_f16)
      M3_RETURN_IF_ERROR(cuda::launch_x_to_f16(
          {a.attn, nh * d, ar, nh * d, a.attn16, nh * d, a.attn_inv}, st()));
    const GemvIn o_in{a.attn, nh * d, o_f16 ? a.attn16 : nullptr, a.attn_inv};
    if (tp()) {
      M3_RETURN_IF_ERROR(gemv(L.o, o_in, ar, store_to(b.delta + att_first * hd, hd), a));
      M3_RETURN_IF_ERROR(reduce_delta(b, rows, pending));
    } else {
      M3_RETURN_IF_ERROR(gemv_to_delta(L.o, o_in, rows, b, pending));
    }
    M3_RETURN_IF_ERROR(add_norm(b, *pending, L.post_norm, rows, true, true));
    // SwiGLU outputs: f16 x 2^8 (read back at 2^-8) where both the gate|up and the down product
    // run on the tensor cores, else bf16 (a tensor-core down product then reads the bf16 on the
    // split-K kernel).
    const auto swiglu_to = [&](const DevMatrix& gu, const DevMatrix& down, int64_t r,
                               uint16_t* bf16, uint16_t* f16) {
      GemvEpilogueParams e;
      const bool tc = tensor_core(gu, r) && tensor_core(down, r);
      e.kind = tc ? GemvEpilogue::kSwigluF16 : GemvEpilogue::kSwigluBf16;
      e.act = tc ? f16 : bf16;
      e.alpha = alpha;
      e.limit = limit;
      return e;
    };
    const auto act_in = [&](const GemvEpilogueParams& e, const uint16_t* bf16, int64_t ld) {
      const bool tc = e.kind == GemvEpilogue::kSwigluF16;
      return GemvIn{tc ? nullptr : bf16, ld, tc ? e.act : nullptr, nullptr, 1.0f / 256.0f};
    };
    if (!L.moe) {
      const GemvEpilogueParams sw = swiglu_to(L.mlp_gu, L.mlp_down, rows, b.act_s, b.act_s16);
      M3_RETURN_IF_ERROR(gemv(L.mlp_gu, h_in, rows, sw, b));
      if (tp()) {
        M3_RETURN_IF_ERROR(gemv(L.mlp_down, act_in(sw, b.act_s, L.mlp_down.k), rows,
                                store_to(b.delta, hd), b));
        return reduce_delta(b, rows, pending);
      }
      return gemv_to_delta(L.mlp_down, act_in(sw, b.act_s, L.mlp_down.k), rows, b, pending);
    }
    // The shared expert reads only the normed hidden states: on the side stream it overlaps the
    // router and the routed path below (own split-K scratch; joined before the combine). Forked
    // before the router, not after: the router then takes ~20 instead of ~10 us at batch 1 (it
    // waits for SMs the shared expert holds), but the step is faster. Works eagerly and under
    // graph capture.
    const bool side_path = L.shared_gu.n > 0;
    const GemvEpilogueParams swiglu_s =
        swiglu_to(L.shared_gu, L.shared_down, rows, b.act_s, b.act_s16);
    const GemvIn shared_act = act_in(swiglu_s, b.act_s, L.shared_down.k);
    const auto fork_shared_expert = [&]() -> Status {
      M3_RETURN_IF_ERROR(fork_ev.record(st()));
      M3_RETURN_IF_ERROR(fork_ev.make_wait(side.get()));
      Bufs sb = b;
      sb.partial = b.partial_side;
      sb.partial_elems = b.partial_side_elems;
      M3_RETURN_IF_ERROR(gemv(L.shared_gu, h_in, rows, swiglu_s, sb, false, 1, side.get()));
      M3_RETURN_IF_ERROR(gemv(L.shared_down, shared_act, rows, store_to(b.shared, hd), sb, false,
                              1, side.get()));
      M3_RETURN_IF_ERROR(join_ev.record(side.get()));
      return Status::ok();
    };
    if (side_path) M3_RETURN_IF_ERROR(fork_shared_expert());
    // The fused router up to tuning.fused_router_max_rows: its last CTA runs every row's top-k and
    // the grouping, whose time grows with the rows.
    const bool fused_router = rows <= opt.tuning.fused_router_max_rows && ne <= 512 && kk <= 16;
    // One token on the tensor cores: the fused router skips the grouping and the experts read their
    // slots' experts from the top-k (a one-token grouping is the sorted top-k).
    // (Under expert parallelism a slot is a CTA of the token's top-k, so the rank's experts must
    // number at least top_k for the grid to cover every slot.)
    const bool token_route = rows == 1 && fused_router && local_experts >= kk &&
                             tensor_core(L.experts_gu, kk) && tensor_core(L.experts_down, kk);
    if (fused_router) {
      cuda::MoeRouteParams rp = route_params(b, L, rows);
      rp.counter = b.route_counter;
      // A programmatic dependent of the norm: its CTAs take their SMs and fetch their weight rows
      // into L2 while the norm runs.
      rp.pdl = true;
      rp.topk_only = token_route;
      M3_RETURN_IF_ERROR(cuda::launch_moe_route(rp, st()));
    } else {
      M3_RETURN_IF_ERROR(router_logits(b, L, rows));
      RouterTopkParams rp{b.router_logits, L.router_bias, b.topk_ids, b.topk_w, rows, ne, kk,
                          routed_scale};
      M3_RETURN_IF_ERROR(cuda::launch_router_topk(rp, st()));
      cuda::GroupByExpertParams gp;
      gp.topk_ids = b.topk_ids;
      gp.num_rows = rows * kk;
      gp.num_experts = local_experts;
      gp.expert_base = expert_base;
      gp.group_offsets = b.offs;
      gp.sorted_rows = b.sorted;
      gp.active_groups = b.active;
      M3_RETURN_IF_ERROR(cuda::launch_group_by_expert(gp, st()));
    }
    const GemvEpilogueParams swiglu_r =
        swiglu_to(L.experts_gu, L.experts_down, rows * kk, b.act, b.act16);
    M3_RETURN_IF_ERROR(
        gemv(L.experts_gu, h_in, rows * kk, swiglu_r, b, true, kk, nullptr, false, token_route));
    M3_RETURN_IF_ERROR(gemv(L.experts_down, act_in(swiglu_r, b.act, inter), rows * kk,
                            store_to(b.contrib, hd), b, true, 1, nullptr, true, token_route));
    const float* shared = nullptr;
    if (side_path) {
      M3_RETURN_IF_ERROR(join_ev.make_wait(st()));
      shared = b.shared;
    }
    if (tp()) {  // each rank's partial combine, summed over the ranks
      cuda::MoeCombineParams cp{b.contrib, b.topk_w, shared, b.delta, rows, kk, hd};
      if (expert_parallel()) {  // only the local experts' rows were computed
        cp.topk_ids = b.topk_ids;
        cp.expert_begin = expert_base;
        cp.expert_end = expert_base + local_experts;
      }
      M3_RETURN_IF_ERROR(cuda::launch_moe_combine(cp, st()));
      return reduce_delta(b, rows, pending);
    }
    // The combine (Σ routing weight x expert output + shared) is summed by the next norm.
    *pending = {PendingDelta::kMoe, 0, shared};
    return Status::ok();
  }

  // The router's logits of `rows` rows of b.h, in the fused router's summation order (a token
  // routes the same on every path).
  Status router_logits(const Bufs& b, const DevLayer& L, int64_t rows) {
    cuda::RouterLogitsParams p;
    p.x = b.h;
    p.ldx = hd;
    p.rows = rows;
    p.hidden = hd;
    p.w_f32 = L.router;
    p.num_experts = ne;
    p.logits = b.router_logits;
    return cuda::launch_router_logits(p, st());
  }

  // The fused router's parameters for `rows` rows of b.h (no counter).
  cuda::MoeRouteParams route_params(const Bufs& b, const DevLayer& L, int64_t rows) const {
    cuda::MoeRouteParams rp;
    rp.x = b.h;
    rp.ldx = hd;
    rp.rows = rows;
    rp.hidden = hd;
    rp.w_f32 = L.router;
    rp.num_experts = ne;
    rp.bias = L.router_bias;
    rp.top_k = kk;
    rp.scaling = routed_scale;
    rp.logits = b.router_logits;
    rp.topk_ids = b.topk_ids;
    rp.topk_w = b.topk_w;
    rp.group_offsets = b.offs;
    rp.sorted_rows = b.sorted;
    rp.active_groups = b.active;
    if (expert_parallel()) {
      rp.group_base = expert_base;
      rp.group_experts = local_experts;
    }
    return rp;
  }

  // Copies the residual stream of `rows` rows (layer `l`'s output) into the running capture set's
  // planes of l.
  Status capture_decode_rows(const Bufs& b, int64_t l, int64_t rows) {
    if (dec_capture < 0) return Status::ok();
    const DecodeCapture& c = dec_captures[static_cast<size_t>(dec_capture)];
    for (size_t i = 0; i < c.layers.size(); ++i) {
      if (c.layers[i] != l) continue;
      M3_RETURN_IF_ERROR(cuda::copy_device_to_device_async(
          c.buf + static_cast<int64_t>(i) * dec_rows * hd, b.residual,
          static_cast<size_t>(rows * hd) * 4, st()));
    }
    return Status::ok();
  }

  // The capture set `layers`'s index in dec_captures, made (with its buffer) on first use.
  Result<int64_t> decode_capture_for(std::span<const int32_t> layers) {
    for (size_t i = 0; i < dec_captures.size(); ++i)
      if (std::equal(layers.begin(), layers.end(), dec_captures[i].layers.begin(),
                     dec_captures[i].layers.end()))
        return static_cast<int64_t>(i);
    DecodeCapture c;
    c.layers.assign(layers.begin(), layers.end());
    M3_ASSIGN_OR_RETURN(void* p, alloc->allocate(static_cast<int64_t>(layers.size()) * dec_rows *
                                                 hd * static_cast<int64_t>(sizeof(float))));
    c.buf = static_cast<float*>(p);
    dec_captures.push_back(std::move(c));
    return static_cast<int64_t>(dec_captures.size() - 1);
  }

  // The whole decode step on dec (inputs already in dec.ids / positions / tables).
  Status decode_step(int64_t rows, int64_t mb) {
    const Bufs& b = dec;
    M3_RETURN_IF_ERROR(embed(b.ids, b.residual, rows));
    M3_RETURN_IF_ERROR(inject_embeddings(b.residual));
    const int64_t layers = cfg.num_hidden_layers;
    PendingDelta pending;
    for (int64_t l = 0; l < layers; ++l)
      M3_RETURN_IF_ERROR(decode_layer(b, l, rows, mb, &pending));
    // Every rank: the final norm (the last layer's sum may be pending in the fused norm, a
    // collective) and its slice of the head.
    M3_RETURN_IF_ERROR(add_norm(b, pending, w.final_norm, rows, false, false));
    if (layers > 0 && output_rank()) M3_RETURN_IF_ERROR(capture_decode_rows(b, layers - 1, rows));
    return head(b.h, rows, b.logits_gather, b.logits, &b);
  }

  // Runs decode_step eagerly or through the graph of (rows, mb), capturing it on first use.
  Status run_decode(int64_t rows, int64_t mb) {
    if (!opt.use_graphs || !inject.empty()) return decode_step(rows, mb);
    const auto key = std::make_tuple(rows, mb, dec_capture + 1);
    auto it = graphs.find(key);
    if (it != graphs.end()) {
      const auto t0 = std::chrono::steady_clock::now();
      M3_RETURN_IF_ERROR(it->second.launch(st()));
      stats.graph_launch_us +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      ++stats.graph_replays;
      return Status::ok();
    }
    // First use: run eagerly (this step's result; also does the launchers' one-time
    // cudaFuncSetAttribute calls outside the capture), then capture the same launches.
    M3_RETURN_IF_ERROR(decode_step(rows, mb));
    // Per-node priorities (copied from the capturing streams): the side stream's kernels stay
    // below the critical path's.
    M3_ASSIGN_OR_RETURN(cuda::GraphExec exec,
                        cuda::capture_graph(st(), [&] { return decode_step(rows, mb); }));
    graphs.emplace(key, std::move(exec));
    ++stats.graph_captures;
    return Status::ok();
  }

  // ---- General path (any prefill chunk).

  struct Seq {
    size_t index;       // in the caller's batch
    int64_t offset, n;  // token rows [offset, offset + n) in step order
    int64_t need;       // blocks covering start_pos + n positions
    int32_t group = 0;  // its attention group (ModelSlice::dp_group)
  };

  Status general_step(std::span<const SequenceInput> batch, const std::vector<Seq>& seqs,
                      int64_t t_all, int64_t n_dec, int64_t mb, const std::vector<int32_t>& ids,
                      const std::vector<int32_t>& pos, const std::vector<int32_t>& tabs,
                      std::span<const int32_t> capture_layers, ForwardOutput* out) {
    cuda::ScopedScratch sc(alloc.get());
    Bufs b;
    const int64_t t = t_all;
    M3_ASSIGN_OR_RETURN(b.ids, sc.get<int32_t>(t));
    M3_ASSIGN_OR_RETURN(b.positions, sc.get<int32_t>(t));
    M3_ASSIGN_OR_RETURN(b.tables, sc.get<int32_t>(t * mb));
    M3_ASSIGN_OR_RETURN(b.residual, sc.get<float>(t * hd));
    M3_ASSIGN_OR_RETURN(b.delta, sc.get<float>(t * hd));
    M3_ASSIGN_OR_RETURN(b.h, sc.get<uint16_t>(t * hd));
    M3_ASSIGN_OR_RETURN(b.qkv, sc.get<float>(t * nqkv));
    M3_ASSIGN_OR_RETURN(b.q, sc.get<uint16_t>(t * nh * d));
    M3_ASSIGN_OR_RETURN(b.iq, sc.get<uint16_t>(t * hix * dix));
    M3_ASSIGN_OR_RETURN(b.attn, sc.get<uint16_t>(t * nh * d));
    if (opt.kv_cache_dtype != KvCacheDtype::kBF16) {
      M3_ASSIGN_OR_RETURN(b.kv_k_rows, sc.get<uint16_t>(t * hkv * d));
      M3_ASSIGN_OR_RETURN(b.kv_v_rows, sc.get<uint16_t>(t * hkv * d));
      M3_ASSIGN_OR_RETURN(b.kv_ik_rows, sc.get<uint16_t>(t * dix));
    }
    M3_ASSIGN_OR_RETURN(b.router_logits, sc.get<float>(t * ne));
    M3_ASSIGN_OR_RETURN(b.topk_ids, sc.get<int32_t>(t * kk));
    M3_ASSIGN_OR_RETURN(b.topk_w, sc.get<float>(t * kk));
    M3_ASSIGN_OR_RETURN(b.gate_up, sc.get<float>(t * 2 * max_mlp));
    M3_ASSIGN_OR_RETURN(b.act_s, sc.get<uint16_t>(t * max_mlp));
    M3_ASSIGN_OR_RETURN(b.shared, sc.get<float>(t * hd));
    M3_ASSIGN_OR_RETURN(b.block_scores, sc.get<float>(n_dec * hix * mb));
    M3_ASSIGN_OR_RETURN(b.selected, sc.get<int32_t>(n_dec * hix * top_k));
    M3_ASSIGN_OR_RETURN(b.o_part, sc.get<float>(n_dec * nh * attn_states * d));
    M3_ASSIGN_OR_RETURN(b.ml, sc.get<float>(n_dec * nh * attn_states * 2));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(b.ids, ids.data(), t * 4, st()));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(b.positions, pos.data(), t * 4, st()));
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(b.tables, tabs.data(), t * mb * 4, st()));

    // Captured hidden states (ModelStep::capture_layers): [n_cap, t, hd] float32. A layer's output
    // is residual + delta after its feed-forward block (the next add + norm adds them).
    const int64_t n_cap = static_cast<int64_t>(capture_layers.size());
    float* hidden = nullptr;
    if (n_cap > 0) {
      M3_ASSIGN_OR_RETURN(hidden, sc.get<float>(n_cap * t * hd));
    }
    auto capture = [&](int64_t l) -> Status {
      for (int64_t c = 0; c < n_cap; ++c) {
        if (capture_layers[static_cast<size_t>(c)] == l) {
          M3_RETURN_IF_ERROR(
              cuda::launch_add({b.residual, b.delta, hidden + c * t * hd, t * hd}, st()));
        }
      }
      return Status::ok();
    };

    M3_RETURN_IF_ERROR(embed(b.ids, b.residual, t));
    M3_RETURN_IF_ERROR(inject_embeddings(b.residual));
    for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
      const DevLayer& L = w.layers[static_cast<size_t>(l)];
      M3_RETURN_IF_ERROR(cuda::launch_add_rms_norm(
          {b.residual, l == 0 ? nullptr : b.delta, L.in_norm, b.h, t, hd, eps}, st()));
      M3_RETURN_IF_ERROR(general_attention(b, seqs, l, t, mb));
      if (tp()) M3_RETURN_IF_ERROR(all_reduce(b.delta, t * hd));
      M3_RETURN_IF_ERROR(
          cuda::launch_add_rms_norm({b.residual, b.delta, L.post_norm, b.h, t, hd, eps}, st()));
      if (!L.moe) {
        M3_RETURN_IF_ERROR(mlp_general(L.mlp_gu, L.mlp_down, b, t, b.delta));
        if (tp()) M3_RETURN_IF_ERROR(all_reduce(b.delta, t * hd));
        M3_RETURN_IF_ERROR(capture(l));
        continue;
      }
      M3_RETURN_IF_ERROR(router_logits(b, L, t));
      RouterTopkParams rp{b.router_logits, L.router_bias, b.topk_ids, b.topk_w, t, ne, kk,
                          routed_scale};
      M3_RETURN_IF_ERROR(cuda::launch_router_topk(rp, st()));
      const float* shared = nullptr;
      if (L.shared_gu.n > 0) {
        M3_RETURN_IF_ERROR(mlp_general(L.shared_gu, L.shared_down, b, t, b.shared));
        shared = b.shared;
      }
      cuda::PrefillMoeParams mp;
      mp.x = b.h;
      mp.topk_ids = b.topk_ids;
      mp.topk_weights = b.topk_w;
      mp.w13 = L.experts_gu.prefill();
      mp.w2 = L.experts_down.prefill();
      mp.shared = shared;
      mp.out = b.delta;
      mp.t = t;
      mp.hidden = hd;
      mp.inter = inter;
      mp.num_experts = local_experts;
      mp.expert_base = expert_base;
      mp.top_k = kk;
      mp.alpha = alpha;
      mp.limit = limit;
      mp.kernel = opt.kernels.prefill_moe_kernel();
      M3_RETURN_IF_ERROR(gemm->moe(mp, st()));
      if (tp()) M3_RETURN_IF_ERROR(all_reduce(b.delta, t * hd));
      M3_RETURN_IF_ERROR(capture(l));
    }
    out->hidden.clear();
    if (n_cap > 0) {
      out->hidden.resize(batch.size());
      for (const Seq& s : seqs) {
        std::vector<float>& dst = out->hidden[s.index];
        dst.resize(static_cast<size_t>(n_cap * s.n * hd));
        for (int64_t c = 0; c < n_cap; ++c)
          M3_RETURN_IF_ERROR(cuda::copy_to_host_async(dst.data() + c * s.n * hd,
                                                      hidden + (c * t + s.offset) * hd,
                                                      s.n * hd * 4, st()));
      }
    }
    out->logits.assign(batch.size(), {});
    out->tokens.clear();  // the general path returns logits only

    // LM head on the rows that need logits, in the caller's order (every rank: its vocabulary
    // slice; every rank sees the same rows).
    std::vector<int32_t> rows;
    for (const Seq& s : seqs)
      for (int32_t r : batch[s.index].logits_rows)
        rows.push_back(static_cast<int32_t>(s.offset + r));
    if (rows.empty()) return finish_step();
    M3_RETURN_IF_ERROR(cuda::launch_add_rms_norm(
        {b.residual, cfg.num_hidden_layers > 0 ? b.delta : nullptr, w.final_norm, b.h, t, hd, eps},
        st()));
    const int64_t nr = static_cast<int64_t>(rows.size());
    M3_ASSIGN_OR_RETURN(b.rows, sc.get<int32_t>(nr));
    M3_ASSIGN_OR_RETURN(b.h_rows, sc.get<uint16_t>(nr * hd));
    if (output_rank()) {
      M3_ASSIGN_OR_RETURN(b.logits, sc.get<float>(nr * vocab));
    }
    if (tp()) {
      M3_ASSIGN_OR_RETURN(b.logits_gather, sc.get<float>(opt.tp.ranks * nr * head_width));
    }
    M3_RETURN_IF_ERROR(cuda::copy_to_device_async(b.rows, rows.data(), nr * 4, st()));
    M3_RETURN_IF_ERROR(cuda::launch_gather_bf16(b.h, b.rows, 1, nr, hd, b.h_rows, st()));
    M3_RETURN_IF_ERROR(head(b.h_rows, nr, b.logits_gather, b.logits, nullptr));
    if (!output_rank()) return finish_step();
    int64_t r0 = 0;
    for (const Seq& s : seqs) {
      const int64_t n = static_cast<int64_t>(batch[s.index].logits_rows.size());
      std::vector<float>& dst = out->logits[s.index];
      dst.resize(static_cast<size_t>(n * vocab));
      if (n > 0)
        M3_RETURN_IF_ERROR(
            cuda::copy_to_host_async(dst.data(), b.logits + r0 * vocab, n * vocab * 4, st()));
      r0 += n;
    }
    return finish_step();
  }

  // One layer's attention on the general path: q|k|v, the decode rows' and each prefill chunk's
  // attention and o_proj, into b.delta [t, hd] (a partial sum with ranks). Under --dp only this
  // rank's group's att_rows rows from att_first (a = attention_view: their positions, tables and
  // normed rows; q, index q and the output from the scratch's start), stored in the group's rows
  // of b.delta with the other groups' rows zeroed; a group without rows in the step leaves all
  // of b.delta zero.
  Status general_attention(const Bufs& b, const std::vector<Seq>& seqs, int64_t l, int64_t t,
                           int64_t mb) {
    const DevLayer& L = w.layers[static_cast<size_t>(l)];
    const Bufs a = attention_view(b, mb);
    const int64_t ar = dp_attention() ? att_rows : t;
    M3_RETURN_IF_ERROR(zero_other_groups(b, t));
    if (ar == 0) return Status::ok();
    M3_RETURN_IF_ERROR(plinear(L.qkv, a.h, hd, ar, a.qkv, L.qkv.n));
    M3_RETURN_IF_ERROR(attention_inputs(a, l, a.qkv, 1, ar, mb));
    // Decode rows (the first att_decode of the rank's rows) with the batched decode kernels.
    M3_RETURN_IF_ERROR(decode_attention(a, l, att_decode, mb));
    // Each prefill chunk over its own block table (the row of its first token).
    for (const Seq& s : seqs) {
      if (s.group != dp_group || s.offset - att_first < att_decode) continue;
      const int64_t own = s.offset - att_first;  // its first row among the rank's rows
      cuda::PrefillAttentionParams ap;
      ap.q = a.q + own * nh * d;
      ap.iq = a.iq + own * hix * dix;
      ap.cache = kv[static_cast<size_t>(l)];
      if (ap.cache.quantised()) {
        // The prefill kernels read bf16: the chunk's pages, dequantised exactly (the indexer
        // and attention over them equal what they would compute reading the codes).
        M3_RETURN_IF_ERROR(cuda::launch_kv_dequantise_pages(ap.cache, kv_stage,
                                                            a.tables + own * mb, s.need,
                                                            st()));
        ap.cache = kv_stage;
      }
      ap.positions = a.positions + own;
      ap.block_table = a.tables + own * mb;
      ap.t = s.n;
      ap.num_heads = nh;
      ap.num_index_heads = hix;
      ap.num_blocks = s.need;
      ap.top_k = top_k;
      ap.local_blocks = cfg.index_local_blocks;
      ap.init_blocks = cfg.index_init_blocks;
      ap.dense = !L.sparse;  // full_attention: every causal block, no indexer
      ap.scale = scale;
      ap.out = a.attn + own * nh * d;
      const bool tiled = opt.kernels.tiled_prefill_attention;  // CudaM3Kernels
      ap.kernel = tiled ? cuda::PrefillAttentionKernel::kTiled
                        : cuda::PrefillAttentionKernel::kTensorCore;
      ap.indexer = tiled ? cuda::PrefillIndexerKernel::kFusedMaxPool
                         : cuda::PrefillIndexerKernel::kGemmScores;
      ap.gemm = gemm.get();
      M3_RETURN_IF_ERROR(cuda::launch_prefill_attention(ap, alloc.get(), st()));
    }
    return plinear(L.o, a.attn, nh * d, ar, b.delta + att_first * hd, hd);
  }

  // Dense SwiGLU-OAI MLP on t rows of b.h through PrefillGemm: gate|up -> act -> down.
  Status mlp_general(const DevMatrix& gu, const DevMatrix& down, const Bufs& b, int64_t t,
                     float* y) {
    const int64_t in = down.k;
    M3_RETURN_IF_ERROR(plinear(gu, b.h, hd, t, b.gate_up, 2 * in));
    M3_RETURN_IF_ERROR(cuda::launch_swiglu_oai_bf16(b.gate_up, t, in, alpha, limit, b.act_s, st()));
    return plinear(down, b.act_s, in, t, y, hd);
  }

  Status alloc_decode_buffers();
  Status alloc_kv(cuda::DeviceArena& a, int64_t pages);
  Status repack_nvfp4();
  Status repack_mxfp8();
};

}  // namespace m3::minimax_m3

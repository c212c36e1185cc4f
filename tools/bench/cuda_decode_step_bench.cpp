// A measured decode step of the MiniMax-M3.1-Flash architecture on one GPU with dummy weights in
// the real formats: the embedding of the previous step's tokens, L MoE + MSA layers (all
// real-shape kernels chained: fused add+RMSNorm, MXFP8 q|k|v|index GEMV, QK-norm+RoPE, bf16 paged
// KV write, indexer, block-sparse attention, o_proj, router, expert grouping, NVFP4 experts with
// SwiGLU, MXFP8 shared expert, combine), then the final norm, the BF16 lm_head and GPU sampling
// (temperature 1, top_k 40, top_p 0.95; the sampled tokens feed the next replay's embedding).
// Each (batch, context) step is captured once into a CUDA graph and replayed; the median replay
// time is the step time. No allocation inside the step (buffers are made per configuration,
// outside the graph). 60-layer figures are extrapolated from the per-layer time (stated as such).
// Two more graphs per configuration leave out the routed experts or the indexer + attention, so
// the per-layer time splits into experts / attention / the rest (dense MXFP8 linears, norms,
// router, combine) by difference.
//
// Bytes per layer: every dense weight byte once, the distinct experts the batch touches (expected
// count for uniform top-4 routing: 128·(1 - (1 - 4/128)^B)) once, the selected K/V blocks
// (16 blocks of 128 tokens per KV head, bf16) and the whole index-key cache (the indexer scores
// every block) per sequence; activations are ignored. FLOPs: 2 per weight element per token
// (experts: 4 routed per token), attention 4·64·2048·128 per token, indexer 2·4·ctx·128 per token.
//
// The GEMVs are the CUDA-core split-K kernels (kDequantSplitK for MXFP8 / NVFP4, kBf16SplitK for BF16)
// with their epilogue launches; CudaM3Model's decode step (tensor cores, fused launches) is
// timed by cuda_model_decode_bench.
//
// Usage: cuda_decode_step_bench [layers=4] [results.tsv (appended)]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/kv/kv_write_bf16.h"
#include "backend/cuda/moe/moe_combine.h"
#include "backend/cuda/norm/add_rms_norm.h"
#include "backend/cuda/rope/qk_norm_rope.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/sampling/sample.h"
#include "cuda_bench_util.h"

namespace {

using namespace m3;
using namespace m3::cuda;
using namespace m3::cuda_bench;

constexpr double kHbm = 4.8e12;
constexpr double kFlops = 830e12;  // bf16 dense matrix rate (measured cuBLASLt, device.md)
constexpr int64_t kHd = 6144, kH = 64, kHkv = 4, kD = 128, kHix = 4, kDix = 128, kS = 128;
constexpr int64_t kTopK = 16, kE = 128, kK4 = 4, kI = 3072, kSI = 3072, kV = 200064;
constexpr int64_t kQkv = kH * kD + 2 * kHkv * kD + kHix * kDix + kDix;  // 9856
constexpr int64_t kOffK = kH * kD, kOffV = kOffK + kHkv * kD, kOffIq = kOffV + kHkv * kD,
                  kOffIk = kOffIq + kHix * kDix;


struct QuantMatrix {  // G matrices [N, K] back to back
  QuantFormat f;
  int64_t n, k, g;
  uint8_t *w = nullptr, *s = nullptr;
  float* glob = nullptr;
  double bytes_one() const {
    const double e = double(n) * k;
    return f == QuantFormat::kMxfp8 ? e * (1 + 1.0 / 32) : f == QuantFormat::kNvfp4 ? e * (0.5 + 1.0 / 16) : 2 * e;
  }
};
QuantMatrix make(QuantFormat f, int64_t n, int64_t k, int64_t g = 1) {
  QuantMatrix m{f, n, k, g};
  const DummyMatrices d = dummy_matrices(f, n, k, g);
  m.w = d.w, m.s = d.scale, m.glob = d.global;
  if (f == QuantFormat::kBf16) m.s = dalloc<uint8_t>(16);  // unused, but not null
  return m;
}

struct Layer {
  uint16_t *in_norm, *post_norm, *q_norm, *k_norm, *iq_norm, *ik_norm;
  QuantMatrix qkv, o, shared_gu, shared_d, router, experts_gu, experts_d;
  KvCacheView cache;
};

// Scratch for one batch size.
struct Scratch {
  int64_t b;
  float *residual, *delta, *qkv, *partial, *router_logits, *topk_w, *contrib, *shared, *moe_out,
      *scores, *o_part, *ml, *logits;
  uint16_t *h, *q, *k, *iq, *ik, *attn, *act, *act_s;
  int32_t *topk_ids, *offs, *sorted, *active, *positions, *tables, *tokens, *selected;
  // Random distinct experts per token, grouped instead of the router's choice: dummy weights make
  // the router saturate and pick the same experts for every token, which would understate the
  // expert traffic of a real batch.
  int32_t* random_ids;
  float* embed_table;  // [V, H] float32 (the checkpoint's is bf16: 2x the bytes of B rows here)
  SampleRowParams* sample_rows;
  int64_t max_blocks;
};

void gemv(const QuantMatrix& m, const uint16_t* x, int64_t ldx, int64_t rows, float* partial,
          GemvEpilogueParams e, const Scratch* grouped = nullptr, int64_t x_row_div = 1) {
  QuantGemvParams p;
  p.format = m.f;
  p.x = x;
  p.ldx = ldx;
  p.x_row_div = x_row_div;
  p.w = m.w;
  p.w_scale = m.s;
  p.w_global = m.glob;
  p.num_groups = m.g;
  if (grouped) {
    p.group_offsets = grouped->offs;
    p.sorted_rows = grouped->sorted;
    p.active_groups = grouped->active;
    p.num_slots = std::min<int64_t>(m.g, rows);
  }
  p.num_rows = rows;
  p.n = m.n;
  p.k = m.k;
  p.partial = partial;
  p.kernel = m.f == QuantFormat::kBf16 ? GemvKernel::kBf16SplitK : GemvKernel::kDequantSplitK;
  e.partial = partial;
  e.num_slices = quant_gemv_num_slices(m.f, m.k);
  e.num_rows = rows;
  e.n = m.n;
  CHECK_OK(launch_quant_gemv(p, st()));
  CHECK_OK(launch_quant_gemv_epilogue(e, st()));
}

GemvEpilogueParams store(float* y, int64_t ldy) {
  GemvEpilogueParams e;
  e.y = y;
  e.ldy = ldy;
  return e;
}
GemvEpilogueParams swiglu(uint16_t* act) {
  GemvEpilogueParams e;
  e.kind = GemvEpilogue::kSwigluBf16;
  e.act = act;
  return e;
}

void qk_norm(const float* x, int64_t h, const uint16_t* w, uint16_t* out, const Scratch& s) {
  QkNormRopeParams p;
  p.x = x;
  p.ld_x = kQkv;
  p.weight = w;
  p.positions = s.positions;
  p.out = out;
  p.t = s.b;
  p.h = h;
  CHECK_OK(launch_qk_norm_rope(p, st()));
}

// Stages a layer runs (the leave-one-out graphs drop one).
struct Stages {
  bool attention = true;  // indexer + sparse attention
  bool experts = true;    // grouping + routed experts
};

void layer_step(const Layer& L, Scratch& s, bool first, Stages st_on) {
  const int64_t b = s.b;
  // x = residual (+ previous delta); h = norm(x).
  CHECK_OK(launch_add_rms_norm({s.residual, first ? nullptr : s.delta, L.in_norm, s.h, b, kHd, 1e-6f}, st()));
  gemv(L.qkv, s.h, kHd, b, s.partial, store(s.qkv, kQkv));
  qk_norm(s.qkv, kH, L.q_norm, s.q, s);
  qk_norm(s.qkv + kOffK, kHkv, L.k_norm, s.k, s);
  qk_norm(s.qkv + kOffIq, kHix, L.iq_norm, s.iq, s);
  qk_norm(s.qkv + kOffIk, 1, L.ik_norm, s.ik, s);
  KvWriteBf16Params kw;
  kw.cache = L.cache;
  kw.k = s.k;
  kw.v = s.qkv + kOffV;
  kw.ld_v = kQkv;
  kw.idx_k = s.ik;
  kw.positions = s.positions;
  kw.block_tables = s.tables;
  kw.batch = b;
  kw.max_blocks = s.max_blocks;
  CHECK_OK(launch_kv_write_bf16(kw, st()));
  if (st_on.attention) {
  IndexerDecodeParams ip;
  ip.iq = s.iq;
  ip.cache = L.cache;
  ip.positions = s.positions;
  ip.block_tables = s.tables;
  ip.batch = b;
  ip.num_index_heads = kHix;
  ip.max_blocks = s.max_blocks;
  ip.top_k = kTopK;
  ip.block_scores = s.scores;
  ip.selected = s.selected;
  CHECK_OK(launch_indexer_decode(ip, st()));
  SparseDecodeParams ap;
  ap.q = s.q;
  ap.cache = L.cache;
  ap.positions = s.positions;
  ap.block_tables = s.tables;
  ap.selected = s.selected;
  ap.batch = b;
  ap.num_heads = kH;
  ap.max_blocks = s.max_blocks;
  ap.top_k = kTopK;
  ap.scale = 1.0f / std::sqrt(float(kD));
  ap.o_partial = s.o_part;
  ap.ml_partial = s.ml;
  ap.max_key_splits = 4;
  ap.out = s.attn;
  CHECK_OK(launch_sparse_decode(ap, st()));
  }
  gemv(L.o, s.attn, kH * kD, b, s.partial, store(s.delta, kHd));
  CHECK_OK(launch_add_rms_norm({s.residual, s.delta, L.post_norm, s.h, b, kHd, 1e-6f}, st()));
  // MoE: router (bf16 weights here; fp32 in the checkpoint), top-4, grouping, experts, shared.
  gemv(L.router, s.h, kHd, b, s.partial, store(s.router_logits, kE));
  RouterTopkParams rp{s.router_logits, nullptr, s.topk_ids, s.topk_w, b, kE, kK4, 2.0f};
  CHECK_OK(launch_router_topk(rp, g_stream));
  if (st_on.experts) {
    // Grouped by the random routing (see Scratch::random_ids), not the router's saturated choice;
    // the router still runs for its time and its weights feed the combine.
    CHECK_OK(launch_group_by_expert({s.random_ids, b * kK4, kE, s.offs, s.sorted, s.active}, st()));
    gemv(L.experts_gu, s.h, kHd, b * kK4, s.partial, swiglu(s.act), &s, kK4);
    gemv(L.experts_d, s.act, kI, b * kK4, s.partial, store(s.contrib, kHd), &s, 1);
  }
  gemv(L.shared_gu, s.h, kHd, b, s.partial, swiglu(s.act_s));
  gemv(L.shared_d, s.act_s, kSI, b, s.partial, store(s.shared, kHd));
  CHECK_OK(launch_moe_combine({s.contrib, s.topk_w, s.shared, s.delta, b, kK4, kHd}, st()));
}

struct Row {  // one configuration's results (60-layer figures extrapolated)
  std::string cfg;
  double step_ms, layer_us, head_ms, experts_us, attn_us;
  double layer_bytes, layer_flops, bytes60, flops60, step60_ms;
  double expert_bytes, attn_bytes;
};

}  // namespace

int main(int argc, char** argv) {
  g_seed = 100;
  const int64_t layers = argc > 1 ? std::atoll(argv[1]) : 4;
  FILE* tsv = nullptr;
  if (argc > 2) {
    std::FILE* probe = std::fopen(argv[2], "r");
    const bool fresh = probe == nullptr;
    if (probe) std::fclose(probe);
    tsv = std::fopen(argv[2], "a");
    if (tsv && fresh)
      std::fprintf(tsv,
                   "config\tlayers\tstep_ms\tlayer_us\thead_ms\texperts_us\tattn_us\t"
                   "layer_bytes\tlayer_flops\tlayer_frac_hbm\tstep60_ms\tbytes60\tflops60\t"
                   "tbps60\tfrac_hbm60\tfrac_flops60\n");
  }
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::printf("decode step: %lld MoE+MSA layers + embedding + lm_head + sampling, CUDA-core "
              "GEMVs, CUDA graph replay\n",
              (long long)layers);
  // Weights.
  std::vector<Layer> L(layers);
  for (auto& l : L) {
    l.in_norm = dfill<uint16_t>(kHd, DummyKind::kBf16Normal, 0.1f);
    l.post_norm = dfill<uint16_t>(kHd, DummyKind::kBf16Normal, 0.1f);
    l.q_norm = dfill<uint16_t>(kD, DummyKind::kBf16Normal, 0.1f);
    l.k_norm = dfill<uint16_t>(kD, DummyKind::kBf16Normal, 0.1f);
    l.iq_norm = dfill<uint16_t>(kDix, DummyKind::kBf16Normal, 0.1f);
    l.ik_norm = dfill<uint16_t>(kDix, DummyKind::kBf16Normal, 0.1f);
    l.qkv = make(QuantFormat::kMxfp8, kQkv, kHd);
    l.o = make(QuantFormat::kMxfp8, kHd, kH * kD);
    l.shared_gu = make(QuantFormat::kMxfp8, 2 * kSI, kHd);
    l.shared_d = make(QuantFormat::kMxfp8, kHd, kSI);
    l.router = make(QuantFormat::kBf16, kE, kHd);
    l.experts_gu = make(QuantFormat::kNvfp4, 2 * kI, kHd, kE);
    l.experts_d = make(QuantFormat::kNvfp4, kHd, kI, kE);
  }
  QuantMatrix lm_head = make(QuantFormat::kBf16, kV, kHd);
  uint16_t* final_norm = dfill<uint16_t>(kHd, DummyKind::kBf16Normal, 0.1f);
  float* embed_table = dfill<float>(kV * kHd, DummyKind::kF32Normal, 0.02f);
  const double dense_bytes = L[0].qkv.bytes_one() + L[0].o.bytes_one() +
                             L[0].shared_gu.bytes_one() + L[0].shared_d.bytes_one() +
                             L[0].router.bytes_one();
  const double dense_elems = double(kQkv) * kHd + double(kHd) * kH * kD + 2.0 * kSI * kHd +
                             double(kHd) * kSI + double(kE) * kHd;
  // One expert's gate|up and down (bytes_one() is one [N, K] matrix of the group).
  const double expert_bytes = L[0].experts_gu.bytes_one() + L[0].experts_d.bytes_one();
  const double expert_elems = 2.0 * kI * kHd + double(kHd) * kI;

  const int64_t batches[] = {1, 8, 32, 128};
  const int64_t ctxs[] = {4096, 32768};
  std::vector<Row> rows;
  std::printf("%-16s %9s %9s %9s %9s %9s %10s %8s %11s %8s %8s\n", "config", "step ms", "layer us",
              "experts", "attn", "head ms", "layer GB", "HBM %", "60-layer ms*", "HBM %*",
              "FLOP %*");
  for (int64_t b : batches)
    for (int64_t ctx : ctxs) {
      // Caches for this configuration (one per layer), block tables, scratch.
      const int64_t nb = ctx / kS, pages = b * nb + 1;
      const size_t mark = g_allocs.size();
      for (auto& l : L) {
        l.cache = {dfill<uint16_t>(pages * kS * kHkv * kD, DummyKind::kBf16Normal),
                   dfill<uint16_t>(pages * kS * kHkv * kD, DummyKind::kBf16Normal),
                   dfill<uint16_t>(pages * kS * kDix, DummyKind::kBf16Normal),
                   pages, kS, kHkv, kD, kDix};
      }
      Scratch s{};
      s.b = b;
      s.max_blocks = nb;
      s.residual = dalloc<float>(b * kHd);
      s.delta = dalloc<float>(b * kHd);
      s.qkv = dalloc<float>(b * kQkv);
      const int64_t max_partial = std::max<int64_t>({12 * b * kQkv, 16 * b * kHd, 6 * b * kK4 * 2 * kI,
                                                     3 * b * kK4 * kHd, 24 * b * kE, 24 * b * kV});
      s.partial = dalloc<float>(max_partial);
      s.router_logits = dalloc<float>(b * kE);
      s.topk_w = dalloc<float>(b * kK4);
      s.contrib = dalloc<float>(b * kK4 * kHd);
      s.shared = dalloc<float>(b * kHd);
      s.scores = dalloc<float>(b * kHix * nb);
      s.o_part = dalloc<float>(b * kH * kTopK * 4 * kD);  // up to 4 key splits (small batches)
      s.ml = dalloc<float>(b * kH * kTopK * 4 * 2);
      s.logits = dalloc<float>(b * kV);
      s.h = dalloc<uint16_t>(b * kHd);
      s.q = dalloc<uint16_t>(b * kH * kD);
      s.k = dalloc<uint16_t>(b * kHkv * kD);
      s.iq = dalloc<uint16_t>(b * kHix * kDix);
      s.ik = dalloc<uint16_t>(b * kDix);
      s.attn = dalloc<uint16_t>(b * kH * kD);
      s.act = dalloc<uint16_t>(b * kK4 * kI);
      s.act_s = dalloc<uint16_t>(b * kSI);
      s.topk_ids = dalloc<int32_t>(b * kK4);
      s.offs = dalloc<int32_t>(kE + 1);
      s.sorted = dalloc<int32_t>(b * kK4);
      s.active = dalloc<int32_t>(kE);
      s.tokens = dalloc<int32_t>(b);
      s.selected = dalloc<int32_t>(b * kHix * kTopK);
      s.random_ids = dalloc<int32_t>(b * kK4);
      s.embed_table = embed_table;
      s.sample_rows = dalloc<SampleRowParams>(b);
      {
        std::mt19937 rng(11);
        std::vector<int32_t> ids(b * kK4);
        for (int64_t t = 0; t < b; ++t) {
          std::vector<int32_t> perm(kE);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          std::sort(perm.begin(), perm.begin() + kK4);
          std::copy(perm.begin(), perm.begin() + kK4, ids.begin() + t * kK4);
        }
        CHECK_CUDA(cudaMemcpy(s.random_ids, ids.data(), 4 * b * kK4, cudaMemcpyHostToDevice));
        std::vector<int32_t> tok(b);
        for (auto& t : tok) t = static_cast<int32_t>(rng() % kV);
        CHECK_CUDA(cudaMemcpy(s.tokens, tok.data(), 4 * b, cudaMemcpyHostToDevice));
        std::vector<SampleRowParams> sp(b);
        for (int64_t t = 0; t < b; ++t) {
          sp[t].temperature = 1.0f;
          sp[t].top_k = 40;
          sp[t].top_p = 0.95f;
          sp[t].seed = 1234;
          sp[t].stream = 0;
          sp[t].counter = static_cast<uint64_t>(t);
        }
        CHECK_CUDA(cudaMemcpy(s.sample_rows, sp.data(), sizeof(SampleRowParams) * b,
                              cudaMemcpyHostToDevice));
      }
      std::vector<int32_t> pos(b, static_cast<int32_t>(ctx - 1)), tab(b * nb);
      std::iota(tab.begin(), tab.end(), 1);
      std::shuffle(tab.begin(), tab.end(), std::mt19937(7));
      s.positions = dalloc<int32_t>(b);
      s.tables = dalloc<int32_t>(b * nb);
      CHECK_CUDA(cudaMemcpy(s.positions, pos.data(), 4 * b, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy(s.tables, tab.data(), 4 * b * nb, cudaMemcpyHostToDevice));

      auto step = [&](bool with_layers, Stages on) {
        // Embedding of the previous replay's sampled tokens (float32 table; ids outside [0, V)
        // leave the row as it was).
        EmbeddingParams ep;
        ep.table = s.embed_table;
        ep.ids = s.tokens;
        ep.out = s.residual;
        ep.t = b;
        ep.vocab = kV;
        ep.dim = kHd;
        CHECK_OK(launch_embedding(ep, g_stream));
        if (with_layers)
          for (int64_t i = 0; i < layers; ++i) layer_step(L[i], s, i == 0, on);
        CHECK_OK(launch_add_rms_norm({s.residual, with_layers ? s.delta : nullptr, final_norm, s.h, b, kHd, 1e-6f}, st()));
        gemv(lm_head, s.h, kHd, b, s.partial, store(s.logits, kV));
        SampleParams sp;
        sp.logits = s.logits;
        sp.batch = b;
        sp.vocab = kV;
        sp.ld = kV;
        sp.rows = s.sample_rows;
        sp.out = s.tokens;
        CHECK_OK(launch_sample(sp, st()));
      };
      auto graph_ms = [&](bool with_layers, Stages on) {
        step(with_layers, on);  // warm-up outside capture (cudaFuncSetAttribute etc.)
        CHECK_CUDA(cudaStreamSynchronize(g_stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK_CUDA(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
        step(with_layers, on);
        CHECK_CUDA(cudaStreamEndCapture(g_stream, &graph));
        CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        // Median of 9 replays after one untimed replay.
        const double ms =
            median_ms([&](int) { CHECK_CUDA(cudaGraphLaunch(exec, g_stream)); }, 1, 9);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        return ms;
      };
      const double full = graph_ms(true, {}), head = graph_ms(false, {});
      const double no_experts = graph_ms(true, {true, false});
      const double no_attn = graph_ms(true, {false, true});
      Row r;
      char cfg[64];
      std::snprintf(cfg, sizeof cfg, "B=%lld ctx=%lldK", (long long)b, (long long)(ctx / 1024));
      r.cfg = cfg;
      r.step_ms = full;
      r.head_ms = head;
      const double per_layer_ms = (full - head) / layers;
      r.layer_us = per_layer_ms * 1e3;
      r.experts_us = (full - no_experts) / layers * 1e3;
      r.attn_us = (full - no_attn) / layers * 1e3;
      const double touched = kE * (1.0 - std::pow(1.0 - double(kK4) / kE, double(b)));
      r.expert_bytes = touched * expert_bytes;
      r.attn_bytes = double(b) * (kHkv * kTopK * kS * kD * 2 * 2 + ctx * kDix * 2.0);
      r.layer_bytes = dense_bytes + r.expert_bytes + r.attn_bytes;
      r.layer_flops = 2.0 * b * (dense_elems + kK4 * expert_elems) +
                      double(b) * (4.0 * kH * kTopK * kS * kD + 2.0 * kHix * ctx * kDix);
      const double head_bytes = lm_head.bytes_one() + double(b) * kHd * 4 + 4.0 * b * kV;
      const double head_flops = 2.0 * b * kV * kHd;
      r.step60_ms = 60 * per_layer_ms + head;
      r.bytes60 = 60 * r.layer_bytes + head_bytes;
      r.flops60 = 60 * r.layer_flops + head_flops;
      const double layer_rate = r.layer_bytes / (per_layer_ms * 1e-3);
      const double rate60 = r.bytes60 / (r.step60_ms * 1e-3);
      const double frac_flops60 = r.flops60 / (r.step60_ms * 1e-3) / kFlops;
      std::printf("%-16s %9.3f %9.1f %9.1f %9.1f %9.3f %10.3f %7.1f%% %11.2f %7.1f%% %7.2f%%\n",
                  cfg, full, r.layer_us, r.experts_us, r.attn_us, head, r.layer_bytes / 1e9,
                  100 * layer_rate / kHbm, r.step60_ms, 100 * rate60 / kHbm, 100 * frac_flops60);
      if (tsv)
        std::fprintf(tsv,
                     "%s\t%lld\t%.4f\t%.2f\t%.4f\t%.2f\t%.2f\t%.0f\t%.4g\t%.4f\t%.3f\t%.0f\t%.4g\t"
                     "%.3f\t%.4f\t%.5f\n",
                     cfg, (long long)layers, full, r.layer_us, head, r.experts_us,
                     r.attn_us, r.layer_bytes, r.layer_flops, layer_rate / kHbm, r.step60_ms,
                     r.bytes60, r.flops60, rate60 / 1e12, rate60 / kHbm, frac_flops60);
      rows.push_back(r);
      std::fflush(stdout);
      CHECK_CUDA(cudaStreamSynchronize(g_stream));
      for (size_t i = mark; i < g_allocs.size(); ++i) cudaFree(g_allocs[i]);
      g_allocs.resize(mark);
    }
  if (tsv) std::fclose(tsv);

  // The table last: 60-layer step (extrapolated), bytes, FLOPs, roofline fractions, and where the
  // layer time goes (by the leave-one-out graphs).
  std::printf("\n== decode step, CUDA-core GEMVs: 60 layers extrapolated* from %lld measured\n",
              (long long)layers);
  std::printf("%-16s %10s %9s %9s %8s %9s %8s | %8s %8s %8s %8s\n", "config", "step ms*", "GB*",
              "TFLOP*", "TB/s*", "HBM %*", "FLOP %*", "experts", "attn", "rest", "head");
  for (const Row& r : rows) {
    const double rate = r.bytes60 / (r.step60_ms * 1e-3);
    const double layer = r.layer_us;
    const double rest = layer - r.experts_us - r.attn_us;
    std::printf("%-16s %10.2f %9.2f %9.3f %8.2f %8.1f%% %7.2f%% | %7.0f%% %7.0f%% %7.0f%% %7.0f%%\n",
                r.cfg.c_str(), r.step60_ms, r.bytes60 / 1e9, r.flops60 / 1e12, rate / 1e12,
                100 * rate / kHbm, 100 * r.flops60 / (r.step60_ms * 1e-3) / kFlops,
                100 * 60 * r.experts_us / 1e3 / r.step60_ms, 100 * 60 * r.attn_us / 1e3 / r.step60_ms,
                100 * 60 * rest / 1e3 / r.step60_ms, 100 * r.head_ms / r.step60_ms);
  }
  std::printf("* extrapolated: 60 x (measured per-layer time) + measured embedding/final norm/lm_head/"
              "sampling; all 60 layers taken as MoE + sparse attention (M3.1-Flash has 3 dense-MLP "
              "layers). experts/attn/rest/head: shares of the 60-layer step (experts = routed "
              "experts + grouping, attn = indexer + sparse attention, rest = dense MXFP8 linears, "
              "norms, RoPE, KV write, router, combine; by leave-one-out graphs).\n");
  // What limits it, from the numbers above.
  std::printf("\nwhat limits it (per layer, measured):\n");
  for (const Row& r : rows) {
    const double rest = r.layer_us - r.experts_us - r.attn_us;
    const double dense_rate = dense_bytes / (rest * 1e-6);
    const double expert_rate = r.experts_us > 0 ? r.expert_bytes / (r.experts_us * 1e-6) : 0;
    const double attn_rate = r.attn_us > 0 ? r.attn_bytes / (r.attn_us * 1e-6) : 0;
    std::printf("  %-16s experts %6.0f us at %5.2f TB/s (%4.1f%%), attention %6.0f us at %5.2f TB/s "
                "(%4.1f%%), rest %6.0f us at %5.2f TB/s on the dense weights (%4.1f%%)\n",
                r.cfg.c_str(), r.experts_us, expert_rate / 1e12, 100 * expert_rate / kHbm,
                r.attn_us, attn_rate / 1e12, 100 * attn_rate / kHbm, rest, dense_rate / 1e12,
                100 * dense_rate / kHbm);
  }
  return 0;
}

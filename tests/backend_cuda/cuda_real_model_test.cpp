// The real-shape CUDA model (src/model/minimax_m3/cuda: quantised GEMVs, PrefillGemm, bf16 paged
// KV, indexer + block-sparse attention, grouped experts, CUDA graphs) against the float32 CPU
// model (src/model/minimax_m3) on the same weights, exact in their storage formats (MXFP8
// attention / indexer / dense / shared linears, NVFP4 routed experts, BF16 the rest).
//
// Config: the real head shapes (D = Dix = 128, 16 query heads per KV head, page = block = 128)
// with hidden 1024, Hkv = Hix = 2, vocab 2048, three MSA layers (layer 0 dense MLP, layers 1-2 MoE
// with 8 experts, top-2, a shared expert), top-3 blocks with the init and local blocks forced,
// so one block per (token, KV group) is chosen by score once a prompt passes 3 blocks.
//
// Both models round differently (the GPU keeps activations in bf16, the CPU in float32), so any
// discrete choice made on nearly equal scores may differ and a compare would then measure that
// choice, not the kernels. The weights are shaped so that the two discrete choices have margins
// far above the rounding error:
//  * Indexer: the index projections have one non-zero row per head, so after the per-head norm
//    every index query/key is ±sqrt(128/n)·(1+w) in fixed dims (its sign is the only thing that
//    depends on the token) and the score is a cosine/sine of (distance · one RoPE frequency).
//    Head 0 (dims 12 / pair 12, f = 5e6^(-24/64) = 0.0031) prefers the nearest block; head 1
//    (query dim 45 against key dim 13, f = 0.0019) prefers the farthest. Up to 600 tokens both are
//    monotonic in distance and adjacent blocks differ by >= 6 in score; bf16 rounding of the
//    ~11-magnitude components moves a score by < 0.4.
//  * Routing: the routing bias ramps by 2 per expert (up in layer 1, down in layer 2), more than
//    the sigmoid's range, so the chosen experts are fixed (layer 1: 6, 7; layer 2: 0, 1) while the
//    weights s_i / Σ s stay token dependent. Gate and up of each expert are quantised to NVFP4
//    together (one global scale), as real checkpoints do, so the GPU keeps them NVFP4.
//
// Tolerance: each bf16 rounding of an activation (normed input of every linear, q, k, v, index
// q/k, attention output, SwiGLU output) has relative error <= 2^-9; a layer has about 6 of them on
// the way to the residual, and the attention softmax turns a relative error e of the q·k logits
// (|logit| <= ~4 here) into ~4e of its weights, so a layer is counted as 10 roundings, plus 4 for
// the embedding / final norm / head. Errors add at most linearly through the (unit-gain) normed
// residual stream, so |gpu - cpu| <= 2^-9 · (4 + 10·L) · rms(cpu logits of the row). The worst
// |gpu-cpu|/bound is printed per case. The argmax must agree wherever the CPU's top-2 margin
// exceeds twice the bound (then no pair of errors within the bound can swap them).
//
// Cases: (a) prefill of a 600-token prompt (5 blocks), all-token logits, prefill attention
// variants (1, 1) and (0, 0); (b) chunked prefill of several sequences, then mixed batches (one
// prefill chunk + decode rows of two other sequences); (c) 20 greedy decode steps (teacher-forced
// with the CPU's argmax) at batch 1 and batch 5, with CUDA graphs on and off: the graph output
// must be bitwise equal to the eager output.
//
// The same cases run on MiniMax-M3's layer mix (full_attention_test_config: layer 1 full
// attention, no indexer weights, dense attention over every causal block): the prompts of 375-600
// tokens (3-5 blocks) then exceed top_k = 3, so the full layer attends more blocks than the sparse
// ones, on the prefill path (dense prefill attention) and the decode path (dense_decode). The same
// error model holds (a full layer has the same roundings as a sparse one, without the indexer).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "../model/single_sequence.h"
#include "model/minimax_m3/cuda/cuda_kv_page_copier.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "sample/sampler.h"
#include "../model_cuda/small_real_shape_config.h"
#include "real_model_fixture.h"

namespace m3 {
namespace {

using minimax_m3::CudaM3Model;
using minimax_m3::CudaM3Options;
using minimax_m3::DummyWeightSource;
using minimax_m3::ForwardOutput;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::SequenceInput;
using real_model_fixture::Compare;
using real_model_fixture::Seq;
using real_model_fixture::last_argmax;
using real_model_fixture::random_tokens;
using real_model_fixture::full_attention_test_config;
using real_model_fixture::test_config;
using real_model_fixture::TestSource;

constexpr int64_t kPages = 96;

// ---- Harness: the CPU model and up to three GPU models on the same weights and page ids.

class Harness {
 public:
  explicit Harness(const MiniMaxM3Config& cfg) : cfg_(cfg), src_(cfg_), cpu_(0), pages_(kPages, 5) {
    auto m = Model::load(cfg_, src_, &cpu_);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) cpu_model_ = std::move(m).value();
    cpu_cache_ = std::make_unique<PagedKvCache>(&cpu_, cfg_, kPages);
  }

  Result<std::unique_ptr<CudaM3Model>> gpu_model(bool graphs,
                                                 minimax_m3::CudaM3Tuning tuning = {},
                                                 int64_t max_batch = 16) {
    CudaM3Options o;
    o.num_kv_pages = kPages;
    o.max_batch = max_batch;
    o.use_graphs = graphs;
    o.tuning = tuning;
    return CudaM3Model::load(cfg_, src_, o);
  }

  const MiniMaxM3Config& cfg() const { return cfg_; }
  double rel_bound() const { return real_model_fixture::rel_bound(cfg_); }
  Seq new_seq(int64_t max_tokens) { return pages_.new_seq(max_tokens); }
  void reset_pages() { pages_.reset(); }

  // One step: tokens[i] appended to seqs[i] (all logits rows when all_rows, else the last), on
  // the CPU and on every GPU model; outputs per model.
  // `embeddings`, when given: each sequence's input embeddings (replacing those tokens'
  // embeddings on both models).
  void step(std::vector<Seq*> seqs, const std::vector<std::vector<int32_t>>& tokens, bool all_rows,
            std::vector<CudaM3Model*> gpus, ForwardOutput* cpu_out,
            std::vector<ForwardOutput>* gpu_out,
            const std::vector<std::vector<InputEmbedding>>* embeddings = nullptr) {
    std::vector<SequenceInput> in = real_model_fixture::step_inputs(seqs, tokens, all_rows);
    if (embeddings != nullptr)
      for (size_t i = 0; i < in.size(); ++i) in[i].embeddings = (*embeddings)[i];
    Status s = cpu_model_->forward(in, cpu_cache_.get(), cpu_out);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    gpu_out->assign(gpus.size(), {});
    for (size_t g = 0; g < gpus.size(); ++g) {
      s = gpus[g]->forward(in, &(*gpu_out)[g]);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      seqs[i]->cached += static_cast<int64_t>(tokens[i].size());
  }

  bool ready() const { return cpu_model_ != nullptr; }

 private:
  MiniMaxM3Config cfg_;
  TestSource src_;
  CpuBackend cpu_;
  std::unique_ptr<Model> cpu_model_;
  std::unique_ptr<PagedKvCache> cpu_cache_;
  real_model_fixture::PageIds pages_;
};

Harness& harness() {
  static Harness h(test_config());
  return h;
}

// MiniMax-M3's mix: layer 1 full attention.
Harness& full_harness() {
  static Harness h(full_attention_test_config());
  return h;
}

TEST(CudaRealModel, FitsAndLoadsQuantised) {
  Harness& h = harness();
  ASSERT_TRUE(h.ready());
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const minimax_m3::CudaM3Stats st = (*g)->stats();
  std::printf(
      "[cuda_real_model] load: %lld fused matrices quantised, %lld BF16 fallbacks, "
      "weights %.1f MB, KV %.1f MB, buffers %.1f MB\n",
      (long long)st.quantised_matrices, (long long)st.bf16_fallbacks, st.weight_bytes / 1e6,
      st.kv_bytes / 1e6, st.buffer_bytes / 1e6);
  // Per layer: q|k|v|iq|ik and o (MXFP8); dense gate|up + down or shared gate|up + down (MXFP8);
  // experts gate|up and down (NVFP4). Router, embedding and lm_head are BF16 by design.
  EXPECT_EQ(st.bf16_fallbacks, 0);
  EXPECT_EQ(st.quantised_matrices, 4 + 2 * 6);
  // A config the kernels cannot run is refused with the field named (the caller falls back).
  MiniMaxM3Config bad = h.cfg();
  bad.num_attention_heads = 16;
  CudaM3Options o;
  o.num_kv_pages = 4;
  TestSource src(h.cfg());
  auto r = CudaM3Model::load(bad, src, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("num_attention_heads"), std::string::npos);
}

// (a) Prefill of a prompt longer than top_k blocks: every position's logits.
void prefill_case(Harness& h, const std::string& what) {
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int64_t n = 600, v = h.cfg().vocab_size;
  Seq s = h.new_seq(n);
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  ASSERT_NO_FATAL_FAILURE(h.step({&s}, {random_tokens(n, v, 11)}, true, {g->get()}, &cpu, &gpu));
  ASSERT_EQ(gpu.size(), 1u);
  ASSERT_EQ(gpu[0].logits[0].size(), cpu.logits[0].size());
  Compare c{h.rel_bound()};
  c.rows_of(gpu[0].logits[0].data(), cpu.logits[0].data(), n, v);
  c.report("(a) prefill 600 tokens" + what);
  EXPECT_TRUE(c.ok());
  EXPECT_EQ((*g)->stats().general_steps, 1);
}

TEST(CudaRealModel, PrefillAllTokenLogits) {
  prefill_case(harness(), "");
}

// Every sequence's logits rows of a step, GPU against CPU, reported under `label`.
bool compare_step(const Harness& h, const ForwardOutput& cpu, const ForwardOutput& gpu,
                  size_t seqs, const std::string& label) {
  const int64_t v = h.cfg().vocab_size;
  Compare c{h.rel_bound()};
  for (size_t i = 0; i < seqs; ++i) {
    EXPECT_EQ(gpu.logits[i].size(), cpu.logits[i].size()) << label << " sequence " << i;
    if (gpu.logits[i].size() != cpu.logits[i].size()) return false;
    c.rows_of(gpu.logits[i].data(), cpu.logits[i].data(),
              static_cast<int64_t>(cpu.logits[i].size()) / v, v);
  }
  c.report(label);
  return c.ok();
}

// (b) Several prefill chunks in one step, then one prefill chunk + decode rows of two others.
void mixed_case(Harness& h, const std::string& what) {
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int64_t v = h.cfg().vocab_size;
  Seq a = h.new_seq(600), b = h.new_seq(260), c = h.new_seq(200);
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  // Step 1: three prefill chunks (a's first chunk; b and c whole prompts).
  ASSERT_NO_FATAL_FAILURE(
      h.step({&a, &b, &c},
             {random_tokens(300, v, 21), random_tokens(250, v, 22), random_tokens(150, v, 23)},
             true, {g->get()}, &cpu, &gpu));
  EXPECT_TRUE(compare_step(h, cpu, gpu[0], 3, "(b) step 1: three prefill chunks" + what));
  // Step 2: a's second chunk (chunked prefill over the cached first chunk) + decode rows of b, c
  // (their next tokens: the CPU's greedy choice).
  const int32_t tb = last_argmax(cpu.logits[1], v), tc = last_argmax(cpu.logits[2], v);
  ASSERT_NO_FATAL_FAILURE(
      h.step({&b, &a, &c}, {{tb}, random_tokens(220, v, 24), {tc}}, true, {g->get()}, &cpu, &gpu));
  EXPECT_TRUE(compare_step(h, cpu, gpu[0], 3, "(b) step 2: prefill chunk + 2 decode rows" + what));
  EXPECT_EQ((*g)->stats().general_steps, 2);
  // Step 3: a's last chunk of 12 tokens + decode rows of b, c: 14 rows fit the decode buffers
  // (max_batch 16), so the chunk's tokens run as decode rows (small_steps_on_decode_path).
  const int32_t tb2 = last_argmax(cpu.logits[0], v), tc2 = last_argmax(cpu.logits[2], v);
  ASSERT_NO_FATAL_FAILURE(
      h.step({&b, &a, &c}, {{tb2}, random_tokens(12, v, 25), {tc2}}, true, {g->get()}, &cpu, &gpu));
  EXPECT_TRUE(compare_step(h, cpu, gpu[0], 3,
                           "(b) step 3: 12-token chunk + 2 decode rows, decode path" + what));
  // Step 4: the same with only each sequence's last row of logits (a chunk's row 4 of 5).
  const int32_t tb3 = last_argmax(cpu.logits[0], v), tc3 = last_argmax(cpu.logits[2], v);
  ASSERT_NO_FATAL_FAILURE(
      h.step({&b, &a, &c}, {{tb3}, random_tokens(5, v, 26), {tc3}}, false, {g->get()}, &cpu, &gpu));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cpu.logits[i].size(), static_cast<size_t>(v));
  EXPECT_TRUE(compare_step(h, cpu, gpu[0], 3,
                           "(b) step 4: 5-token chunk + 2 decode rows, last rows" + what));
  EXPECT_EQ((*g)->stats().general_steps, 2);
  EXPECT_EQ((*g)->stats().decode_steps, 2);
}

TEST(CudaRealModel, MixedBatch) {
  mixed_case(harness(), "");
}

// HiCache's CUDA page copier (cuda_kv_page_copier.h): a prefilled sequence's pages saved to
// pinned host memory and loaded into other page ids come back byte for byte (saved again and
// compared), and a decode step over the copies gives bitwise the logits of one over the
// originals (the same kernels on the same bytes).
TEST(CudaRealModel, KvPagesRoundTripThroughPinnedHost) {
  Harness& h = harness();
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int64_t v = h.cfg().vocab_size;
  Seq a = h.new_seq(301), b = h.new_seq(301);
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  ASSERT_NO_FATAL_FAILURE(h.step({&a}, {random_tokens(300, v, 51)}, false, {g->get()}, &cpu, &gpu));
  auto copier = minimax_m3::CudaKvPageCopier::create({g->get()});
  ASSERT_TRUE(copier.is_ok()) << copier.status().to_string();
  KvPageCopier& c = **copier;
  EXPECT_EQ(c.page_bytes(), CudaM3Model::kv_bytes_per_page(h.cfg()));
  const size_t pages = 3;  // positions 0..299
  ASSERT_GE(a.table.size(), pages);
  auto arena = c.allocate_host_arena(static_cast<int64_t>(2 * pages) * c.page_bytes());
  ASSERT_NE(arena, nullptr);
  std::vector<PageCopy> save_a, load_b, save_b;
  for (size_t i = 0; i < pages; ++i) {
    std::byte* first = arena->data() + static_cast<int64_t>(i) * c.page_bytes();
    std::byte* second = arena->data() + static_cast<int64_t>(pages + i) * c.page_bytes();
    save_a.push_back({a.table[i], first});
    load_b.push_back({b.table[i], first});
    save_b.push_back({b.table[i], second});
  }
  ASSERT_TRUE(c.save(save_a).is_ok());
  ASSERT_TRUE(c.wait().is_ok());
  ASSERT_TRUE(c.load(load_b).is_ok());
  ASSERT_TRUE(c.save(save_b).is_ok());
  ASSERT_TRUE(c.wait().is_ok());
  EXPECT_EQ(std::memcmp(arena->data(), arena->data() + static_cast<int64_t>(pages) * c.page_bytes(),
                        static_cast<size_t>(static_cast<int64_t>(pages) * c.page_bytes())),
            0)
      << "the pages came back changed";
  b.cached = a.cached;
  const int32_t next = last_argmax(gpu[0].logits[0], v);
  auto decode = [&](const Seq& s) {
    std::vector<SequenceInput> in(1);
    const std::vector<int32_t> token = {next};
    in[0].tokens = token;
    in[0].start_pos = s.cached;
    in[0].block_table = s.table;
    in[0].logits_rows = {0};
    ForwardOutput out;
    Status st = (*g)->forward(in, &out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return out.logits.empty() ? std::vector<float>{} : out.logits[0];
  };
  const std::vector<float> from_a = decode(a), from_b = decode(b);
  ASSERT_EQ(from_a.size(), static_cast<size_t>(v));
  EXPECT_EQ(from_a, from_b) << "a decode step over the copied pages differs";
  // A released page's save reads the page before the next forward writes it: a's page 2 (as b's
  // page 2 is now: both decoded position 300) saved, released, then a decode at position 301
  // writes it; the saved bytes must be b's page's.
  ASSERT_TRUE(c.save({{PageCopy{a.table[2], arena->data()}}}).is_ok());
  c.release(a.table[2]);
  ASSERT_TRUE(c.order_before_forward().is_ok());
  Seq a_next = a;
  a_next.cached = a.cached + 1;
  EXPECT_EQ(decode(a_next).size(), static_cast<size_t>(v));
  ASSERT_TRUE(c.save({{PageCopy{b.table[2], arena->data() + c.page_bytes()}}}).is_ok());
  ASSERT_TRUE(c.wait().is_ok());
  EXPECT_EQ(std::memcmp(arena->data(), arena->data() + c.page_bytes(), size_t(c.page_bytes())), 0)
      << "a released page's save read what the next forward wrote";
  const std::vector<PageCopy> outside = {{static_cast<PageId>((*g)->num_kv_pages()), arena->data()}};
  EXPECT_EQ(c.save(outside).code(), StatusCode::kInternal);
}

// Input embeddings (image features at placeholder tokens) replace their tokens' embeddings on
// both paths: a 40-token chunk beside a decode row (general path: 41 rows > max_batch 16) and a
// 10-token chunk beside it (decode path), each with embeddings at the first, middle and last
// tokens, against the CPU model given the same embeddings.
TEST(CudaRealModel, InputEmbeddingsOnBothPaths) {
  Harness& h = harness();
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int64_t v = h.cfg().vocab_size, hd = h.cfg().hidden_size;
  Seq a = h.new_seq(100), b = h.new_seq(100);
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  ASSERT_NO_FATAL_FAILURE(
      h.step({&b}, {random_tokens(20, v, 31)}, false, {g->get()}, &cpu, &gpu));
  std::vector<std::vector<float>> values;
  for (uint32_t k = 0; k < 6; ++k) values.push_back(real_model_fixture::normal(hd, 40 + k, 1.0f));
  struct Case {
    int64_t chunk;
    const char* what;
    int64_t general_steps;
  };
  int64_t decode_steps = 0;
  for (const Case c : {Case{40, "general path", 2}, Case{10, "decode path", 2}}) {
    const int32_t next_b = last_argmax(cpu.logits[0], v);
    const int32_t n = static_cast<int32_t>(c.chunk);
    const size_t base = c.chunk == 40 ? 0 : 3;
    std::vector<std::vector<InputEmbedding>> emb(2);
    emb[1] = {{0, values[base]}, {n / 2, values[base + 1]}, {n - 1, values[base + 2]}};
    ASSERT_NO_FATAL_FAILURE(h.step({&b, &a},
                                   {{next_b}, random_tokens(c.chunk, v, 32 + uint32_t(c.chunk))},
                                   true, {g->get()}, &cpu, &gpu, &emb));
    EXPECT_TRUE(compare_step(h, cpu, gpu[0], 2, std::string("input embeddings, ") + c.what));
    if (c.chunk == 10) ++decode_steps;
    EXPECT_EQ((*g)->stats().general_steps, c.general_steps) << c.what;
    EXPECT_EQ((*g)->stats().decode_steps, decode_steps) << c.what;
  }
  // An embedding of the wrong width or for a token outside the slice is refused.
  std::vector<float> short_values(static_cast<size_t>(hd - 1), 0.0f);
  const std::vector<int32_t> bad_tokens = {1, 2}, bad_table = h.new_seq(2).table;
  std::vector<SequenceInput> bad(1);
  bad[0].tokens = bad_tokens;
  bad[0].start_pos = 0;
  bad[0].block_table = bad_table;
  bad[0].embeddings = {{0, short_values}};
  ForwardOutput out;
  EXPECT_EQ((*g)->forward(bad, &out).code(), StatusCode::kInvalidArgument);
  bad[0].embeddings = {{2, values[0]}};
  EXPECT_EQ((*g)->forward(bad, &out).code(), StatusCode::kInvalidArgument);
}

// (c) Greedy decode (teacher-forced by the CPU's argmax) at batch 1 and 5: CUDA graphs against
// eager launches (the same kernels on the same buffers: bitwise equal), and a model with the
// tuning thresholds at 0 (one CTA per norm row; the router as GEMV + top-k + grouping launches,
// so also at one row the experts read the grouping), each against the CPU.
// Contexts whose block tables fit the indexer's top-k (width <= index_topk_blocks = 3 here, so
// up to 256 tokens) skip the indexer (every block attended): `indexer_skipped` says whether every
// decode step does, else none may.
void decode_case(Harness& h, const std::string& label, int64_t batch,
                 const std::vector<int64_t>& prompt_lens, int64_t steps,
                 bool indexer_skipped = false) {
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto on = h.gpu_model(true);
  // Eager launches (the rows must still be equal). This config's top-k of 3 blocks never takes
  // the clustered split attention (it needs 16): sparse_decode_test and attention_inputs_test
  // compare it bitwise.
  auto off = h.gpu_model(false);
  minimax_m3::CudaM3Tuning plain;
  plain.cluster_norm_max_rows = 0;
  plain.fused_router_max_rows = 0;
  auto thresholds0 = h.gpu_model(true, plain);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  ASSERT_TRUE(thresholds0.is_ok()) << thresholds0.status().to_string();
  const int64_t v = h.cfg().vocab_size;
  std::vector<Seq> seqs;
  for (int64_t i = 0; i < batch; ++i) seqs.push_back(h.new_seq(prompt_lens[i] + steps));
  std::vector<Seq*> ptrs;
  std::vector<std::vector<int32_t>> toks;
  for (int64_t i = 0; i < batch; ++i) {
    ptrs.push_back(&seqs[i]);
    toks.push_back(random_tokens(prompt_lens[i], v, 31 + static_cast<uint32_t>(i)));
  }
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  ASSERT_NO_FATAL_FAILURE(
      h.step(ptrs, toks, false, {on->get(), off->get(), thresholds0->get()}, &cpu, &gpu));
  Compare cmp{h.rel_bound()}, cmp0{h.rel_bound()};
  int64_t bitwise_bad = 0;
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t i = 0; i < batch; ++i) toks[i] = {last_argmax(cpu.logits[i], v)};
    ASSERT_NO_FATAL_FAILURE(
        h.step(ptrs, toks, false, {on->get(), off->get(), thresholds0->get()}, &cpu, &gpu));
    for (int64_t i = 0; i < batch; ++i) {
      ASSERT_EQ(gpu[0].logits[i].size(), static_cast<size_t>(v));
      ASSERT_EQ(gpu[1].logits[i].size(), static_cast<size_t>(v));
      ASSERT_EQ(gpu[2].logits[i].size(), static_cast<size_t>(v));
      cmp.rows_of(gpu[0].logits[i].data(), cpu.logits[i].data(), 1, v);
      cmp0.rows_of(gpu[2].logits[i].data(), cpu.logits[i].data(), 1, v);
      if (std::memcmp(gpu[0].logits[i].data(), gpu[1].logits[i].data(), v * sizeof(float)) != 0)
        ++bitwise_bad;
    }
  }
  const minimax_m3::CudaM3Stats st_on = (*on)->stats(), st_off = (*off)->stats();
  const std::string what =
      "(c) decode batch " + std::to_string(batch) + ", " + std::to_string(steps) + " steps" + label;
  cmp.report(what);
  cmp0.report(what + " (tuning thresholds 0)");
  std::printf(
      "[cuda_real_model] %-44s graphs vs eager: %lld of %lld rows differ bitwise; graphs "
      "captured %lld, replayed %lld; decode steps %lld / %lld  -> %s\n",
      what.c_str(), (long long)bitwise_bad, (long long)(batch * steps),
      (long long)st_on.graph_captures, (long long)st_on.graph_replays,
      (long long)st_on.decode_steps, (long long)st_off.decode_steps,
      bitwise_bad == 0 ? "PASS" : "FAIL");
  EXPECT_TRUE(cmp.ok());
  EXPECT_TRUE(cmp0.ok());
  EXPECT_EQ(bitwise_bad, 0);
  EXPECT_EQ(st_on.decode_steps, steps);  // every step took the GEMV path
  EXPECT_EQ(st_off.decode_steps, steps);
  EXPECT_GE(st_on.graph_captures, 1);
  EXPECT_GE(st_on.graph_replays, 1);
  EXPECT_EQ(st_off.graph_captures, 0);
  EXPECT_EQ(st_on.indexer_skipped_steps, indexer_skipped ? steps : 0);
  EXPECT_EQ(st_off.indexer_skipped_steps, indexer_skipped ? steps : 0);
}

TEST(CudaRealModel, DecodeBatch1GraphsOnAndOff) {
  decode_case(harness(), "", 1, {375}, 20);
}

TEST(CudaRealModel, DecodeBatch5GraphsOnAndOff) {
  decode_case(harness(), "", 5, {120, 250, 375, 500, 60}, 20);
}

// The decode path at its widest bucket, 256 rows (--cuda-graph-max-bs 256): a 200-token chunk and
// two decode rows run as 202 rows padded to 256 (small_steps_on_decode_path), every row's logits
// against the CPU model, with graphs on (captured on first use, then replayed on a second step of
// the same bucket).
TEST(CudaRealModel, DecodePathAt256Rows) {
  Harness& h = harness();
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true, {}, 256);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const int64_t v = h.cfg().vocab_size;
  Seq a = h.new_seq(500), b = h.new_seq(300), c = h.new_seq(300);
  ForwardOutput cpu;
  std::vector<ForwardOutput> gpu;
  ASSERT_NO_FATAL_FAILURE(h.step({&b, &c}, {random_tokens(140, v, 61), random_tokens(260, v, 62)},
                                 false, {g->get()}, &cpu, &gpu));
  EXPECT_TRUE(compare_step(h, cpu, gpu[0], 2, "256 rows: two prompts"));
  for (int k = 0; k < 2; ++k) {
    const int32_t tb = last_argmax(cpu.logits[0], v), tc = last_argmax(cpu.logits[1], v);
    const uint32_t seed = 63 + static_cast<uint32_t>(k);
    ASSERT_NO_FATAL_FAILURE(h.step({&b, &c, &a}, {{tb}, {tc}, random_tokens(200, v, seed)}, true,
                                   {g->get()}, &cpu, &gpu));
    EXPECT_TRUE(compare_step(h, cpu, gpu[0], 3,
                             "256 rows: a 200-token chunk + 2 decode rows, step " +
                                 std::to_string(k + 1)));
  }
  const minimax_m3::CudaM3Stats st = (*g)->stats();
  EXPECT_EQ(st.general_steps, 1) << "the 400-token first step only";
  EXPECT_EQ(st.decode_steps, 2);
  EXPECT_GE(st.graph_replays, 1);
}

// Short contexts (at most 2 blocks of 128, top-k 3): no indexer, every block, against the CPU
// model, which runs its indexer (the same blocks: it selects all of them).
TEST(CudaRealModel, DecodeShortContextsSkipTheIndexer) {
  decode_case(harness(), "", 2, {40, 200}, 20, /*indexer_skipped=*/true);
}

// ---- MiniMax-M3's layer mix (layer 1 full attention).

// The full layer loads q|k|v without index projections (still one quantised matrix) and caches K
// and V without index keys.
TEST(CudaRealModelFullAttention, LoadsWithoutIndexerWeights) {
  Harness& h = full_harness();
  ASSERT_TRUE(h.ready());
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const minimax_m3::CudaM3Stats st = (*g)->stats();
  EXPECT_EQ(st.bf16_fallbacks, 0);
  EXPECT_EQ(st.quantised_matrices, 4 + 2 * 6);
  const MiniMaxM3Config& c = h.cfg();
  const int64_t kv = 2 * c.num_key_value_heads * c.head_dim, ix = c.index_head_dim;
  EXPECT_EQ(CudaM3Model::kv_bytes_per_page(c), 128 * (3 * kv + 2 * ix) * 2);
  EXPECT_EQ(st.kv_bytes, kPages * CudaM3Model::kv_bytes_per_page(c));
}

TEST(CudaRealModelFullAttention, PrefillAllTokenLogits) {
  prefill_case(full_harness(), " (layer 1 full)");
}

TEST(CudaRealModelFullAttention, MixedBatch) {
  mixed_case(full_harness(), " (layer 1 full)");
}

// Contexts of 395 tokens (4 blocks) at batch 1 and up to 520 (5 blocks) at batch 5: the sparse
// layers run the indexer's top 3, the full layer every block.
TEST(CudaRealModelFullAttention, DecodeBatch1GraphsOnAndOff) {
  decode_case(full_harness(), " (layer 1 full)", 1, {375}, 20);
}

TEST(CudaRealModelFullAttention, DecodeBatch5GraphsOnAndOff) {
  decode_case(full_harness(), " (layer 1 full)", 5, {120, 250, 375, 500, 60}, 20);
}

// Decode rows sampled on the GPU (SequenceInput::sample, what the engine's CUDA runner offers)
// give the token the CPU sampler picks from the same logits (the same step run first without
// sampling: same inputs, same KV writes, the same graph, so the same logits bit for bit), with no
// logits copied back for them; a row not offered keeps its logits. Rows: greedy, temperature
// with top-k, top-p and min-p, plain temperature 1, and (on even steps) one row not offered.
TEST(CudaRealModel, DeviceSamplingMatchesTheCpuSamplerOnTheSameLogits) {
  Harness& h = harness();
  ASSERT_TRUE(h.ready());
  h.reset_pages();
  auto g = h.gpu_model(true);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  CudaM3Model& gpu = **g;
  const int64_t v = h.cfg().vocab_size;
  const std::vector<int64_t> lens = {90, 33, 7, 140};
  const int64_t steps = 12;
  std::vector<Seq> seqs;
  std::vector<Seq*> ptrs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t i = 0; i < lens.size(); ++i) seqs.push_back(h.new_seq(lens[i] + steps));
  for (size_t i = 0; i < lens.size(); ++i) {
    ptrs.push_back(&seqs[i]);
    toks.push_back(random_tokens(lens[i], v, 71 + static_cast<uint32_t>(i)));
  }
  ForwardOutput cpu;
  std::vector<ForwardOutput> prefill;
  ASSERT_NO_FATAL_FAILURE(h.step(ptrs, toks, false, {&gpu}, &cpu, &prefill));
  std::vector<int32_t> next(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) next[i] = last_argmax(prefill[0].logits[i], v);
  int64_t sampled_rows = 0, distinct_from_greedy = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<SequenceInput> in(lens.size());
    std::vector<std::vector<int32_t>> one(lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      one[i] = {next[i]};
      in[i].tokens = one[i];
      in[i].start_pos = seqs[i].cached;
      in[i].block_table = seqs[i].table;
      in[i].logits_rows = {0};
    }
    ForwardOutput plain, dev;
    ASSERT_TRUE(gpu.forward(in, &plain).is_ok());
    EXPECT_TRUE(plain.tokens.empty());
    std::vector<SamplingParams> params(lens.size());
    params[0].temperature = 0.0f;
    params[1].temperature = 0.8f, params[1].top_k = 40, params[1].top_p = 0.9f;
    params[1].min_p = 0.02f;
    params[2].temperature = 1.0f;
    params[3].temperature = 0.7f, params[3].top_p = 0.95f;
    const bool offer_last = step % 2 == 1;
    for (size_t i = 0; i < lens.size(); ++i) {
      if (i == 3 && !offer_last) continue;
      in[i].sample = device_sampling(params[i], RngKey{900u + i, 0, static_cast<uint64_t>(step)});
    }
    ASSERT_TRUE(gpu.forward(in, &dev).is_ok());
    ASSERT_EQ(dev.tokens.size(), lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      if (!in[i].sample.has_value()) {
        EXPECT_EQ(dev.tokens[i], -1);
        EXPECT_EQ(dev.logits[i], plain.logits[i]) << "row not offered, step " << step;
        continue;
      }
      EXPECT_TRUE(dev.logits[i].empty());
      SampleInput si;
      si.logits = plain.logits[i];
      si.params = &params[i];
      si.rng = in[i].sample->rng;
      SamplerScratch scratch;
      const int32_t want = sample_token(si, &scratch).token;
      EXPECT_EQ(dev.tokens[i], want) << "row " << i << " step " << step;
      ++sampled_rows;
      distinct_from_greedy += want != last_argmax(plain.logits[i], v) ? 1 : 0;
    }
    for (size_t i = 0; i < lens.size(); ++i) {
      seqs[i].cached += 1;
      next[i] = last_argmax(plain.logits[i], v);
    }
  }
  std::printf("[cuda_real_model] device sampling: %lld rows sampled on the GPU = the CPU sampler's "
              "token (%lld of them not the argmax)\n",
              (long long)sampled_rows, (long long)distinct_from_greedy);
  EXPECT_EQ(sampled_rows, steps * 3 + steps / 2);
  EXPECT_GT(distinct_from_greedy, 0);  // the temperature rows did sample
}

}  // namespace
}  // namespace m3

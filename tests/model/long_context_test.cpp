// Long-context readiness of the float32 MiniMax-M3 model and the engine around it (the KV-memory
// issue's "1M-token readiness"), on the CPU at a reduced width:
//
// - ChunkedPrefillOverMoreThan8192BlocksEqualsOneFullForward: a tiny random-weight model whose
//   layers are all MSA-sparse, with 2-token sparse blocks (= 2-token KV pages), so that a prompt of
//   16,400 tokens spans 8,200 index blocks, the block count of a 1,048,576-token context at the
//   real 128-token blocks. The engine prefills it in chunks of 1,024 tokens and decodes greedily;
//   a fresh single-pass forward of prompt + decoded tokens must give bitwise the same logits at
//   every position, the same greedy tokens and the same KV cache, and the engine's step working
//   memory (device bytes allocated during a step, counted by a delegating backend) must be set by
//   the chunk, not by the context. The indexer's top-k at query positions beyond 8,192 blocks is
//   also checked against a plain full-sort reference over the cached index keys.
// - RopeIsExactNearOneMillionTokens: the CPU RoPE at positions around 2^20 against a double-
//   precision evaluation of the rotary embedding as transformers defines it.
// - RealShapesAtOneMillionTokens: the index-block, block-table and top-k sizes of a 1,048,576-token
//   sequence at MiniMax-M3.1-Flash's shapes are within the ranges of the types that carry them.
// (KV bytes per token at the real shapes for bf16 / fp8_e4m3 / fp4_e2m1 are checked against
// docs/memory.md in tests/app/memory_plan_test.cpp, KvBytesPerTokenForEachDtype.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/model.h"
#include "model/tiny_model.h"

namespace m3 {
namespace {

// A Backend that hands every call to a CpuBackend and counts the bytes it has allocated: live now
// and the peak since reset_peak(). The model allocates its step scratch through the backend
// (DeviceBuffer), so the peak over a step less what was live before it is the step's working
// memory.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(int threads) : cpu_(threads) {}

  int64_t live() const {
    std::lock_guard<std::mutex> l(mu_);
    return live_;
  }
  int64_t peak() const {
    std::lock_guard<std::mutex> l(mu_);
    return peak_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> l(mu_);
    peak_ = live_;
  }

  DeviceKind kind() const override { return cpu_.kind(); }
  std::string name() const override { return cpu_.name(); }
  void* alloc(int64_t bytes) override {
    void* p = cpu_.alloc(bytes);
    if (p != nullptr) {
      std::lock_guard<std::mutex> l(mu_);
      sizes_[p] = bytes;
      live_ += bytes;
      peak_ = std::max(peak_, live_);
    }
    return p;
  }
  void free(void* p) override {
    if (p != nullptr) {
      std::lock_guard<std::mutex> l(mu_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        live_ -= it->second;
        sizes_.erase(it);
      }
    }
    cpu_.free(p);
  }
  void copy_to_device(void* dst, const void* src, int64_t n) override {
    cpu_.copy_to_device(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, int64_t n) override {
    cpu_.copy_to_host(dst, src, n);
  }
  void fill_zero(void* p, int64_t n) override { cpu_.fill_zero(p, n); }
  void synchronize() override { cpu_.synchronize(); }
  void linear(const LinearParams& p) override { cpu_.linear(p); }
  void rms_norm(const RmsNormParams& p) override { cpu_.rms_norm(p); }
  void rope(const RopeParams& p) override { cpu_.rope(p); }
  void swiglu_oai(const SwigluOaiParams& p) override { cpu_.swiglu_oai(p); }
  void router_topk(const RouterTopkParams& p) override { cpu_.router_topk(p); }
  void moe_experts(const MoeExpertsParams& p) override { cpu_.moe_experts(p); }
  void kv_write(const KvWriteParams& p) override { cpu_.kv_write(p); }
  void indexer_topk(const IndexerTopkParams& p) override { cpu_.indexer_topk(p); }
  void paged_attention(const PagedAttentionParams& p) override { cpu_.paged_attention(p); }
  void embedding(const EmbeddingParams& p) override { cpu_.embedding(p); }
  void add(const AddParams& p) override { cpu_.add(p); }
  void gather_rows(const GatherRowsParams& p) override { cpu_.gather_rows(p); }

 private:
  CpuBackend cpu_;
  mutable std::mutex mu_;
  std::map<void*, int64_t> sizes_;
  int64_t live_ = 0, peak_ = 0;
};

// The engine's runner with a record of every step: the tokens and block-table length of its
// slices, and every logits row it returned, by sequence position (one request at a time).
class RecordingRunner final : public ModelRunner {
 public:
  explicit RecordingRunner(std::unique_ptr<MiniMaxM3ModelRunner> inner) : inner_(std::move(inner)) {}

  struct StepRecord {
    int64_t tokens = 0, max_start = 0, max_blocks = 0;
  };
  std::vector<StepRecord> steps;
  std::map<int64_t, std::vector<float>> logits_at;  // position -> [vocab]
  std::vector<int32_t> last_block_table;

  MiniMaxM3ModelRunner& inner() { return *inner_; }

  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t hidden_size() const override { return inner_->hidden_size(); }
  int32_t num_kv_pages() const override { return inner_->num_kv_pages(); }
  int32_t page_size() const override { return inner_->page_size(); }
  ModelFeatures features() const override { return inner_->features(); }
  KvPageCopier* kv_page_copier() override { return inner_->kv_page_copier(); }
  Status truncate(std::span<const int32_t> table, int64_t n) override {
    return inner_->truncate(table, n);
  }
  Status forward(const ModelStep& step, ModelOutput& out) override {
    StepRecord r;
    for (const ModelSlice& s : step.slices) {
      r.tokens += static_cast<int64_t>(s.tokens.size());
      r.max_start = std::max(r.max_start, s.start_pos);
      r.max_blocks = std::max(r.max_blocks, static_cast<int64_t>(s.block_table.size()));
      last_block_table.assign(s.block_table.begin(), s.block_table.end());
    }
    steps.push_back(r);
    M3_RETURN_IF_ERROR(inner_->forward(step, out));
    const int64_t v = vocab_size();
    for (size_t i = 0; i < step.slices.size(); ++i) {
      const ModelSlice& s = step.slices[i];
      for (size_t k = 0; k < s.logits_rows.size(); ++k) {
        const float* row = out.logits[i].data() + static_cast<int64_t>(k) * v;
        logits_at[s.start_pos + s.logits_rows[k]].assign(row, row + v);
      }
    }
    return Status::ok();
  }

 private:
  std::unique_ptr<MiniMaxM3ModelRunner> inner_;
};

// Every layer MSA-sparse (the M3.1-Flash layout), a dense MLP and an MoE layer, widths tiny so
// that the CPU forward over 16K tokens takes seconds. Blocks (= KV pages) of 2 tokens; top-4
// blocks with one init and one local block, so the selection is a real choice among thousands.
MiniMaxM3Config long_context_config() {
  MiniMaxM3Config c = testing::tiny_config();
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.rotary_dim = 8;
  c.vocab_size = 64;
  c.max_position_embeddings = 32768;
  c.intermediate_size = 16;
  c.shared_intermediate_size = 16;
  c.dense_intermediate_size = 32;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.index_n_heads = 1;
  c.index_head_dim = 8;
  c.index_block_size = 2;
  c.index_topk_blocks = 4;
  c.index_local_blocks = 1;
  c.index_init_blocks = 1;
  c.layer_types = {AttentionKind::kSparse, AttentionKind::kSparse};
  c.mlp_layer_types = {MlpKind::kDense, MlpKind::kMoe};
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(LongContext, ChunkedPrefillOverMoreThan8192BlocksEqualsOneFullForward) {
  const MiniMaxM3Config cfg = long_context_config();
  constexpr int64_t kPrompt = 16'400, kDecode = 8, kChunk = 1'024;
  const int64_t page = cfg.index_block_size;
  const int64_t total = kPrompt + kDecode;           // positions the sequence reaches
  const int64_t blocks = (total + page - 1) / page;  // its index blocks = KV pages
  ASSERT_GE(kPrompt / page, 8'192) << "the prompt alone must span >= 8,192 index blocks";
  const int32_t pages = static_cast<int32_t>(blocks + 8);

  auto src = testing::random_weights(cfg, 20261206);
  auto owned_backend = std::make_unique<CountingBackend>(2);
  CountingBackend* be = owned_backend.get();
  auto model = minimax_m3::Model::load(cfg, src, be);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  auto inner = MiniMaxM3ModelRunner::create_with_pages(std::move(owned_backend),
                                                       std::move(model).value(), pages);
  ASSERT_TRUE(inner.is_ok()) << inner.status().to_string();
  auto owned_recorder = std::make_unique<RecordingRunner>(std::move(inner).value());
  RecordingRunner* rec = owned_recorder.get();
  EngineConfig ec;
  ec.scheduler.page_size = static_cast<int32_t>(page);
  ec.scheduler.chunked_prefill_size = static_cast<int32_t>(kChunk);
  ec.scheduler.max_running_requests = 4;
  ec.scheduler.enable_prefix_cache = false;  // keeps the finished sequence's pages unreused
  ec.context_length = static_cast<int32_t>(cfg.max_position_embeddings);
  auto engine = Engine::create(std::move(ec), std::move(owned_recorder));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  GenerateRequest req;
  req.prompt_tokens = testing::random_tokens(kPrompt, cfg.vocab_size, 7);
  req.params.max_tokens = static_cast<int32_t>(kDecode);
  req.params.temperature = 0.0f;
  req.params.ignore_eos = true;
  req.prompt_logits = true;  // every prompt position's logits come back, chunk by chunk
  auto handle = (*engine)->submit(req);
  ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();

  // ---- The engine: chunked prefill, then greedy decode. Each step's working memory is the
  // peak of the backend's allocations during the step less what was live before it (weights and
  // the KV pool).
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t resident = be->live();
  int64_t prefill_working = 0, decode_working = 0;
  std::vector<int32_t> generated;
  for (int step = 0; step < 1000 && !handle->stream().done(); ++step) {
    be->reset_peak();
    const size_t before = rec->steps.size();
    (*engine)->step();
    ASSERT_EQ(be->live(), resident) << "a step left device memory allocated";
    for (size_t i = before; i < rec->steps.size(); ++i) {
      int64_t& w = rec->steps[i].tokens > 1 ? prefill_working : decode_working;
      w = std::max(w, be->peak() - resident);
    }
    while (auto e = handle->stream().try_next()) {
      ASSERT_TRUE(e->error.is_ok()) << e->error.to_string();
      for (const SeqDelta& d : e->seqs)
        for (const GeneratedToken& g : d.tokens) generated.push_back(g.token);
    }
  }
  const double engine_s = seconds_since(t0);
  ASSERT_TRUE(handle->stream().done());
  ASSERT_EQ(static_cast<int64_t>(generated.size()), kDecode);

  // Chunked: no step carried more than a chunk, the prompt took ceil(P / chunk) steps, and the
  // last step's block table covered every position the sequence wrote.
  int64_t prefill_steps = 0, most_tokens = 0;
  for (const auto& s : rec->steps) {
    most_tokens = std::max(most_tokens, s.tokens);
    if (s.tokens > 1) ++prefill_steps;
  }
  EXPECT_LE(most_tokens, kChunk);
  EXPECT_EQ(prefill_steps, (kPrompt + kChunk - 1) / kChunk);
  ASSERT_GE(static_cast<int64_t>(rec->last_block_table.size()), (total - 1 + page - 1) / page);
  EXPECT_GE(static_cast<int64_t>(rec->last_block_table.size()), 8'192);

  // ---- A fresh full forward: prompt + the decoded tokens but the last (whose logits nobody
  // needs), one pass, logits of every row, into a cache of its own.
  std::vector<int32_t> seq = req.prompt_tokens;
  seq.insert(seq.end(), generated.begin(), generated.end() - 1);
  const int64_t n = static_cast<int64_t>(seq.size());
  minimax_m3::Model& m = rec->inner().model();
  minimax_m3::PagedKvCache fresh(be, cfg, pages);
  std::vector<int32_t> table(static_cast<size_t>((n + page - 1) / page));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  minimax_m3::SequenceInput in;
  in.tokens = seq;
  in.start_pos = 0;
  in.block_table = table;
  for (int64_t i = 0; i < n; ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  minimax_m3::ForwardOutput full;
  const int64_t resident_full = be->live();
  be->reset_peak();
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE(m.forward(std::span<const minimax_m3::SequenceInput>(&in, 1), &fresh, &full).is_ok());
  const double full_s = seconds_since(t1);
  const int64_t full_working = be->peak() - resident_full;

  // ---- Logits. Error model: no rounding differs between the two runs. Every CPU op computes each
  // output element in a fixed order that depends only on that element's inputs (cpu_backend.h),
  // never on how many rows share the step; a row's K, V and index key are therefore bitwise the
  // same whichever step wrote them, and the indexer and attention of a query read the same cached
  // rows in the same (position) order. So chunked prefill + decode must equal the single pass
  // bit for bit, and the test asserts equality, not a tolerance.
  const int64_t v = cfg.vocab_size;
  ASSERT_EQ(static_cast<int64_t>(full.logits[0].size()), n * v);
  ASSERT_EQ(static_cast<int64_t>(rec->logits_at.size()), n) << "a logits row per position";
  int64_t differing_rows = 0;
  for (int64_t pos = 0; pos < n; ++pos) {
    const std::vector<float>& got = rec->logits_at.at(pos);
    if (std::memcmp(got.data(), full.logits[0].data() + pos * v, sizeof(float) * v) != 0) {
      if (differing_rows++ < 5) ADD_FAILURE() << "logits differ at position " << pos;
    }
  }
  EXPECT_EQ(differing_rows, 0);
  // Greedy tokens: the argmax (first maximum) of the full pass's rows P-1 .. P+D-2.
  for (int64_t i = 0; i < kDecode; ++i) {
    const float* row = full.logits[0].data() + (kPrompt - 1 + i) * v;
    const int32_t best = static_cast<int32_t>(std::max_element(row, row + v) - row);
    EXPECT_EQ(generated[i], best) << "decoded token " << i;
  }

  // ---- KV cache: every written page of the engine's sequence (K, V and index keys of both
  // layers) equals the fresh pass's page of the same logical block.
  minimax_m3::PagedKvCache& kv = rec->inner().kv_cache();
  std::vector<std::byte> a(static_cast<size_t>(kv.bytes_per_page())),
      b(static_cast<size_t>(fresh.bytes_per_page()));
  ASSERT_EQ(a.size(), b.size());
  int64_t differing_pages = 0;
  for (int64_t blk = 0; blk < n / page; ++blk) {  // the whole pages
    kv.save_page(rec->last_block_table[blk], a.data());
    fresh.save_page(table[blk], b.data());
    if (a != b && differing_pages++ < 5) ADD_FAILURE() << "KV page of block " << blk << " differs";
  }
  EXPECT_EQ(differing_pages, 0);

  // ---- The indexer's top-k over more than 8,192 blocks against a plain reference on the fresh
  // pass's cached index keys (both layers): block score = the max over the block's keys of the
  // same float32 dot product the op uses (cpu::dot), the init and local blocks forced, the top
  // min(k, blocks) by (score descending, block id ascending) by a full sort, padded with -1.
  {
    const int64_t dix = cfg.index_head_dim, topk = cfg.index_topk_blocks;
    const std::vector<int32_t> qpos = {static_cast<int32_t>(n - 1), 16'385, 16'384, 9'001, 3, 0};
    std::vector<float> iq(qpos.size() * static_cast<size_t>(dix));
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& e : iq) e = dist(rng);
    for (int64_t li = 0; li < cfg.num_hidden_layers; ++li) {
      KvLayerView view = fresh.layer(li);
      std::vector<int32_t> got(qpos.size() * static_cast<size_t>(topk), -7);
      be->indexer_topk({iq.data(), view, qpos.data(), table.data(), got.data(),
                        static_cast<int64_t>(qpos.size()), 1, static_cast<int64_t>(table.size()),
                        topk, cfg.index_local_blocks, cfg.index_init_blocks});
      for (size_t t = 0; t < qpos.size(); ++t) {
        const int64_t pos = qpos[t], qb = pos / page;
        std::vector<std::pair<float, int32_t>> score;
        for (int64_t blk = 0; blk <= qb; ++blk) {
          float best = -std::numeric_limits<float>::infinity();
          for (int64_t j = blk * page; j <= std::min(pos, (blk + 1) * page - 1); ++j)
            best = std::max(best, cpu::dot(iq.data() + t * dix,
                                           view.idx_k + (table[blk] * page + j % page) * dix, dix));
          if (blk < cfg.index_init_blocks || qb - blk < cfg.index_local_blocks)
            best = std::numeric_limits<float>::infinity();
          score.push_back({best, static_cast<int32_t>(blk)});
        }
        std::sort(score.begin(), score.end(), [](const auto& a, const auto& b) {
          return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
        std::vector<int32_t> want(static_cast<size_t>(topk), -1);
        for (int64_t i = 0; i < std::min<int64_t>(topk, qb + 1); ++i) want[i] = score[i].second;
        EXPECT_EQ(std::vector<int32_t>(got.begin() + t * topk, got.begin() + (t + 1) * topk), want)
            << "layer " << li << " query position " << pos;
        if (pos >= 16'384) {  // a choice among > 8,192 blocks, not only the forced ones
          EXPECT_GE(want[2], 0);
          EXPECT_EQ(want[0], 0);  // the init block
        }
      }
    }
  }

  // ---- Bounded memory. The model's step scratch (activations, q/k/v, index queries and keys,
  // selections, MLP buffers, logits) is sized by the step's tokens; what grows with the context
  // is the block table upload (4 bytes a block). So the chunked prefill's working memory must be
  // the full pass's per-token share times the chunk (10 % slack for per-step constants), plus the
  // table, and the full pass must need many times more.
  const double per_token = static_cast<double>(full_working - 4 * n / page) / static_cast<double>(n);
  const double bound = 1.10 * per_token * kChunk + 4.0 * static_cast<double>(blocks) + 4096.0;
  EXPECT_GT(prefill_working, 0);
  EXPECT_LE(static_cast<double>(prefill_working), bound)
      << "prefill step working memory " << prefill_working << " bytes; full pass " << full_working;
  EXPECT_LT(prefill_working * 8, full_working);
  EXPECT_LE(decode_working, prefill_working);
  std::printf("[ %-40s ] %lld tokens, %lld blocks; engine (chunks of %lld + %lld decodes) %.2f s, "
              "full pass %.2f s; working memory: prefill step %lld B, decode step %lld B, full "
              "pass %lld B\n",
              "long context", (long long)n, (long long)blocks, (long long)kChunk,
              (long long)kDecode, engine_s, full_s, (long long)prefill_working,
              (long long)decode_working, (long long)full_working);
}

// RoPE as transformers computes it (MiniMax-M3's rotary embedding, "Force float32"): inv_freq =
// 1 / theta^(float(2i) / rotary_dim) in float32, the angle the float32 product inv_freq * float(pos),
// then cos and sin of that angle. The CPU backend implements exactly this, so near 2^20 it must
// agree with a double-precision evaluation of it to within the roundings of the output: cos and
// sin rounded to float (2^-24 relative each), the two products and their sum (2^-24 relative
// each), i.e. |y - y_ref| <= 4 * 2^-24 * (|x_d cos| + |x_rot sin|) + tiny.
//
// Exactness of the position itself: positions are int32 and the conversion to float is exact up
// to 2^24 = 16,777,216, so positions near 1,048,576 (2^20) enter the angle exactly. The angle's
// one float32 rounding (the product) is part of the reference definition (transformers, and the
// GPU kernels that are bitwise equal to this op); its size against the exact real product is
// bounded and checked below: <= 2^-24 |angle|, i.e. <= 2^-4 rad for the fastest frequency at 2^20.
TEST(LongContext, RopeIsExactNearOneMillionTokens) {
  for (double theta : {10'000.0, 5'000'000.0}) {  // the tiny models' and M3.1-Flash's
    SCOPED_TRACE(theta);
    constexpr int64_t kDim = 128, kRot = 64, kHeads = 2;
    std::vector<int32_t> positions;
    for (int64_t p : {(1 << 20) - 3, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (1 << 20) + 12'345,
                      (1 << 21) - 1, 1'000'000, 999'999})
      positions.push_back(static_cast<int32_t>(p));
    const int64_t t = static_cast<int64_t>(positions.size());
    std::vector<float> x(static_cast<size_t>(t * kHeads * kDim));
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& e : x) e = dist(rng);
    std::vector<float> y = x;
    CpuBackend cpu(1);
    cpu.rope({y.data(), positions.data(), t, kHeads, kDim, kRot, kRot, theta});

    const int64_t half = kRot / 2;
    double worst = 0.0, worst_angle_error = 0.0;
    for (int64_t ti = 0; ti < t; ++ti) {
      const int64_t pos = positions[ti];
      ASSERT_EQ(static_cast<int64_t>(static_cast<float>(pos)), pos) << "position exact in float";
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* xh = x.data() + (ti * kHeads + h) * kDim;
        const float* yh = y.data() + (ti * kHeads + h) * kDim;
        for (int64_t d = 0; d < kDim; ++d) {
          if (d >= kRot) {  // beyond the rotary width: untouched
            EXPECT_EQ(yh[d], xh[d]);
            continue;
          }
          const int64_t i = d % half;
          const float inv_freq = 1.0f / static_cast<float>(std::pow(
                                            theta, static_cast<double>(static_cast<float>(2 * i) /
                                                                       static_cast<float>(kRot))));
          const float angle = inv_freq * static_cast<float>(pos);  // transformers' float32 angle
          const double exact = static_cast<double>(inv_freq) * static_cast<double>(pos);
          const double angle_error = std::fabs(static_cast<double>(angle) - exact);
          ASSERT_LE(angle_error, std::ldexp(std::fabs(exact), -24)) << "one rounding, no more";
          worst_angle_error = std::max(worst_angle_error, angle_error);
          const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
          const double rot = d < half ? -static_cast<double>(xh[d + half])
                                      : static_cast<double>(xh[d - half]);
          const double ref = xh[d] * c + rot * s;
          const double bound =
              4.0 * std::ldexp(std::fabs(xh[d] * c) + std::fabs(rot * s), -24) + 1e-30;
          const double err = std::fabs(static_cast<double>(yh[d]) - ref);
          ASSERT_LE(err, bound) << "pos " << pos << " head " << h << " dim " << d;
          worst = std::max(worst, err / bound);
        }
      }
    }
    std::printf("[ %-40s ] theta %.0f: worst error %.3f of the bound; float32 angle vs the exact "
                "product: %.3g rad at most\n",
                "rope near 2^20", theta, worst, worst_angle_error);
  }
}

// MiniMax-M3.1-Flash's shapes at 1,048,576 tokens: 8,192 index blocks (pages) of 128 tokens; a
// block table of int32 page ids; the indexer's selections [tokens, index heads, top-k] of int32
// block ids for a whole chunk; positions as int32 (and exact as float, for RoPE).
TEST(LongContext, RealShapesAtOneMillionTokens) {
  const MiniMaxM3Config c = minimax_m3::builtin_m3_flash_config(60);
  constexpr int64_t kTokens = 1'048'576;
  const int64_t blocks = kTokens / c.index_block_size;
  EXPECT_EQ(c.index_block_size, 128);
  EXPECT_EQ(blocks, 8'192);
  // Block ids and page ids are int32: a 1M-token sequence's, and a pool of many such sequences.
  EXPECT_LT(blocks * 1'000, std::numeric_limits<int32_t>::max());
  // The last position and its block as the model computes them (int32 positions, int64 maths).
  const int32_t last = static_cast<int32_t>(kTokens - 1);
  EXPECT_EQ(static_cast<int64_t>(last) / c.index_block_size, blocks - 1);
  EXPECT_EQ(static_cast<int64_t>(static_cast<float>(last)), static_cast<int64_t>(last));
  // The selection buffer of one 16,384-token prefill chunk (t x index heads x top-k int32), and
  // the candidate blocks a query ranks (every block up to its own): far from int32's limits.
  EXPECT_EQ(c.index_topk_blocks, 16);
  const int64_t sel = 16'384 * c.index_n_heads * c.index_topk_blocks;
  EXPECT_LT(sel, std::numeric_limits<int32_t>::max());
  EXPECT_LE(c.index_topk_blocks, blocks);
}

}  // namespace
}  // namespace m3

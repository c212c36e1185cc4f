// The float32 DSpark draft on the CUDA backend (model/minimax_m3/cuda/cuda_dspark_f32.h) against
// the CPU reference: the block attention kernel against dspark::block_attention, the whole draft
// (context append in chunks, propose) against DSparkDraft on the CPU backend with the same
// weights, and on the bundled m3-tiny through the engine, greedy speculative output equal to
// ordinary decoding on the CUDA backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dspark/block_attention.h"
#include "dspark_reference.h"
#include "engine/engine_test_util.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "model/minimax_m3/cuda/cuda_dspark_f32.h"
#include "model/minimax_m3/dspark/dspark_attention.h"
#include "model/minimax_m3/dspark/dspark_draft.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/model_dir.h"

namespace m3 {
namespace {

using minimax_m3::dspark::BlockAttentionParams;
using minimax_m3::dspark::DSparkConfig;
using minimax_m3::dspark::DSparkDraft;
using minimax_m3::dspark::DSparkProposal;
using minimax_m3::dspark::TargetSharedWeights;

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff
double gamma_n(double n) { return n * kU / (1.0 - n * kU); }

std::unique_ptr<CudaBackend> gpu() {
  auto be = CudaBackend::create(0);
  EXPECT_TRUE(be.is_ok()) << be.status().to_string();
  return be.is_ok() ? std::move(be).value() : nullptr;
}

template <typename T>
T* to_gpu(CudaBackend* be, const std::vector<T>& host) {
  T* d = static_cast<T*>(be->alloc(static_cast<int64_t>(std::max<size_t>(host.size(), 1) * sizeof(T))));
  if (!host.empty())
    be->copy_to_device(d, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
  return d;
}

struct AttentionCase {
  int64_t anchor_pos, window, block, heads, kv_heads, head_dim, page_size;
};

// Error model: a score is a float32 dot of D products, |Δs_j| <= γ_D · scale · Σ_i |q_i k_ji|
// on either side; softmax weights then move by at most 2 · max_j |Δs_j| relative (exp is
// 1-Lipschitz in log space, both sides' roundings added), and the weighted sum of n values adds
// γ_n · Σ_j w_j |v_j| per side. So |out_gpu - out_cpu| <= 2 · (2 · max|Δs| + γ_n) · max|v| plus
// the exp / division roundings (a few u), which the factor 2 covers.
TEST(DSparkCudaF32, BlockAttentionMatchesTheHostCode) {
  auto be = gpu();
  ASSERT_NE(be, nullptr);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const AttentionCase c : {AttentionCase{0, 16, 7, 4, 2, 16, 16}, {5, 16, 7, 4, 2, 16, 16},
                                {40, 16, 7, 4, 2, 16, 16}, {300, 64, 7, 8, 2, 32, 16},
                                {1000, 512, 7, 16, 4, 128, 128}, {33, 32, 4, 8, 8, 64, 8}}) {
    const int64_t d = c.head_dim, hkv = c.kv_heads, s = c.page_size;
    const int64_t blocks = (c.anchor_pos + s - 1) / s;
    // Pages in a shuffled order; blocks wholly outside every slot's window are released (-1),
    // as DSparkContextCache releases them, so reading one would be caught as a -inf score.
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), rng);
    const int64_t first = std::max<int64_t>(0, c.anchor_pos - c.window + 1);
    for (int64_t b = 0; b < blocks; ++b)
      if ((b + 1) * s <= first) table[static_cast<size_t>(b)] = -1;
    const int64_t pages = std::max<int64_t>(blocks, 1);
    auto fill = [&](int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = uni(rng);
      return v;
    };
    std::vector<float> q = fill(c.block * c.heads * d), bk = fill(c.block * hkv * d),
                       bv = fill(c.block * hkv * d), ck = fill(pages * s * hkv * d),
                       cv = fill(pages * s * hkv * d);
    std::vector<float> want(static_cast<size_t>(c.block * c.heads * d));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    KvLayerView host_cache{ck.data(), cv.data(), nullptr, pages, s, hkv, d, 0};
    BlockAttentionParams hp{q.data(), bk.data(), bv.data(), host_cache, table.data(), blocks,
                            c.anchor_pos, c.block, c.heads, c.window, scale, want.data()};
    minimax_m3::dspark::block_attention(hp);

    float* q_d = to_gpu(be.get(), q);
    float* bk_d = to_gpu(be.get(), bk);
    float* bv_d = to_gpu(be.get(), bv);
    float* ck_d = to_gpu(be.get(), ck);
    float* cv_d = to_gpu(be.get(), cv);
    int32_t* table_d = to_gpu(be.get(), table);
    float* out_d = to_gpu(be.get(), std::vector<float>(want.size(), std::nanf("")));
    auto fn = minimax_m3::cuda_dspark_block_attention_f32(be.get());
    KvLayerView dev_cache{ck_d, cv_d, nullptr, pages, s, hkv, d, 0};
    ASSERT_TRUE(fn({q_d, bk_d, bv_d, dev_cache, table_d, blocks, c.anchor_pos, c.block, c.heads,
                    c.window, scale, out_d})
                    .is_ok());
    std::vector<float> got(want.size());
    be->copy_to_host(got.data(), out_d, static_cast<int64_t>(got.size() * sizeof(float)));

    // |q|, |k|, |v| <= 1: Σ_i |q_i k_i| <= D, n keys at most window - 1 + block.
    const double ds = gamma_n(static_cast<double>(d)) * scale * static_cast<double>(d);
    const double nk = static_cast<double>(std::min(c.anchor_pos, c.window - 1) + c.block);
    const double tol = 2.0 * (2.0 * 2.0 * ds + 2.0 * gamma_n(nk)) * 1.0;
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], tol) << "p " << c.anchor_pos << " D " << d << " element " << i;
    for (void* ptr : std::initializer_list<void*>{q_d, bk_d, bv_d, ck_d, cv_d, table_d, out_d})
      be->free(ptr);
  }
}

TEST(DSparkCudaF32, BlockAttentionRefusesBadShapes) {
  cuda::DSparkBlockAttentionParams p;
  p.block = 7;
  p.num_heads = 4;
  p.num_kv_heads = 3;
  p.head_dim = 16;
  p.window = 16;
  EXPECT_EQ(cuda::launch_dspark_block_attention(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.num_kv_heads = 2;
  p.head_dim = 48;  // does not divide 256
  EXPECT_EQ(cuda::launch_dspark_block_attention(p, nullptr).code(), StatusCode::kInvalidArgument);
  p.head_dim = 16;
  p.window = 4;  // below the block
  EXPECT_EQ(cuda::launch_dspark_block_attention(p, nullptr).code(), StatusCode::kInvalidArgument);
}

// The same draft (weights, target tables) on the CPU and the CUDA backend.
struct TwoDrafts {
  MiniMaxM3Config target_cfg = testing::dspark_target_config();
  testing::MemoryWeightSource target_src = testing::random_weights(target_cfg, 11);
  DSparkConfig cfg = testing::tiny_dspark_config();
  testing::MemoryWeightSource src = testing::random_dspark_weights(cfg, 5);
  CpuBackend cpu{2};
  std::unique_ptr<CudaBackend> cuda = gpu();
  std::unique_ptr<DSparkDraft> on_cpu, on_gpu;

  TwoDrafts() {
    auto a = TargetSharedWeights::load(target_src, target_cfg, &cpu);
    auto b = TargetSharedWeights::load(target_src, target_cfg, cuda.get());
    EXPECT_TRUE(a.is_ok() && b.is_ok());
    auto dc = DSparkDraft::load(cfg, target_cfg, src, "test draft", std::move(a).value(), &cpu);
    auto dg = DSparkDraft::load(cfg, target_cfg, src, "test draft", std::move(b).value(),
                                cuda.get(),
                                minimax_m3::cuda_dspark_block_attention_f32(cuda.get()));
    EXPECT_TRUE(dc.is_ok()) << dc.status().to_string();
    EXPECT_TRUE(dg.is_ok()) << dg.status().to_string();
    on_cpu = std::move(dc).value();
    on_gpu = std::move(dg).value();
  }
};

TEST(DSparkCudaF32, WithoutAKernelTheCudaDraftIsRefused) {
  TwoDrafts t;
  auto shared = TargetSharedWeights::load(t.target_src, t.target_cfg, t.cuda.get());
  ASSERT_TRUE(shared.is_ok());
  auto d = DSparkDraft::load(t.cfg, t.target_cfg, t.src, "test draft", std::move(shared).value(),
                             t.cuda.get());
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnimplemented);
}

// Error model of the whole block: every float32 op of the forward (linear with inner dimension
// up to K = the feature width, norm, RoPE, attention, SwiGLU) rounds each output with relative
// error at most γ_K on each backend, the activations are O(1) (the reference's weight scaling),
// and the normalisations keep each op's error from growing; about 8 ops per layer in series plus
// the context path (fc, norm, k/v) and the head give n_ops = 8 L + 6, so
// |Δlogit| <= 2 · n_ops · γ_K · max|logit| (both sides), which is checked with a factor 4 margin
// for the non-linear amplification of softmax and SwiGLU.
TEST(DSparkCudaF32, TheDraftMatchesTheCpuDraft) {
  TwoDrafts t;
  ASSERT_NE(t.on_cpu, nullptr);
  ASSERT_NE(t.on_gpu, nullptr);
  const int64_t width = t.cfg.feature_width();
  for (const std::vector<int64_t>& chunks :
       std::vector<std::vector<int64_t>>{{}, {5}, {17, 3, 20}, {60, 1, 1}}) {
    int64_t n = 0;
    for (int64_t c : chunks) n += c;
    const std::vector<float> features = testing::random_features(n, width, 3);
    auto cc = t.on_cpu->new_cache(8);
    auto gc = t.on_gpu->new_cache(8);
    int64_t at = 0;
    for (int64_t c : chunks) {
      const std::span<const float> f(features.data() + at * width, static_cast<size_t>(c * width));
      ASSERT_TRUE(t.on_cpu->append_context(f, c, cc.get()).is_ok());
      ASSERT_TRUE(t.on_gpu->append_context(f, c, gc.get()).is_ok());
      at += c;
    }
    ASSERT_EQ(gc->length(), n);
    EXPECT_EQ(gc->block_table(), cc->block_table()) << "the same pages are held and released";
    for (int32_t anchor : {0, 17, 4090}) {
      auto want = t.on_cpu->propose(anchor, *cc);
      auto got = t.on_gpu->propose(anchor, *gc);
      ASSERT_TRUE(want.is_ok() && got.is_ok()) << got.status().to_string();
      float mx = 0.0f;
      for (float x : want->base_logits) mx = std::max(mx, std::fabs(x));
      const double n_ops = 8.0 * static_cast<double>(t.cfg.num_hidden_layers) + 6.0;
      const double tol = 4.0 * 2.0 * n_ops * gamma_n(static_cast<double>(width)) * mx;
      for (size_t i = 0; i < want->base_logits.size(); ++i) {
        ASSERT_NEAR(got->base_logits[i], want->base_logits[i], tol) << "n " << n << " i " << i;
        ASSERT_NEAR(got->logits[i], want->logits[i], 2.0 * tol) << "n " << n << " i " << i;
      }
      // The greedy chain agrees wherever the CPU's choice is clear of the tolerance: a slot's
      // token depends on the previous slot's, so the comparison stops at the first close call.
      const int64_t vocab = t.cfg.vocab_size;
      for (int64_t s = 0; s < t.cfg.block_size; ++s) {
        const float* row = want->logits.data() + s * vocab;
        std::vector<float> sorted(row, row + vocab);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        if (sorted[0] - sorted[1] <= 4.0 * tol) break;
        ASSERT_EQ(got->tokens[static_cast<size_t>(s)], want->tokens[static_cast<size_t>(s)])
            << "slot " << s;
      }
    }
    // Truncation then re-append gives the same proposal on the GPU. Not bit for bit: the
    // re-appended rows go through the context GEMMs as a 2-row chunk where they were part of a
    // longer one, and cuBLAS may pick another kernel (another summation order) for another M.
    // So the same bound as against the CPU, which covers any summation order.
    if (n >= 3) {
      auto before = t.on_gpu->propose(5, *gc);
      ASSERT_TRUE(gc->truncate(n - 2).is_ok());
      const std::span<const float> tail(features.data() + (n - 2) * width,
                                        static_cast<size_t>(2 * width));
      ASSERT_TRUE(t.on_gpu->append_context(tail, 2, gc.get()).is_ok());
      auto after = t.on_gpu->propose(5, *gc);
      ASSERT_TRUE(before.is_ok() && after.is_ok());
      ASSERT_EQ(before->base_logits.size(), after->base_logits.size());
      float mx = 0.0f;
      for (float x : before->base_logits) mx = std::max(mx, std::fabs(x));
      const double n_ops = 8.0 * static_cast<double>(t.cfg.num_hidden_layers) + 6.0;
      const double tol = 4.0 * 2.0 * n_ops * gamma_n(static_cast<double>(width)) * mx;
      for (size_t i = 0; i < before->base_logits.size(); ++i)
        ASSERT_NEAR(after->base_logits[i], before->base_logits[i], tol) << "n " << n << " i " << i;
    }
  }
}

// m3-tiny on the float32 CUDA backend through the engine: greedy output with the DSpark draft
// (random dummy weights: most drafts rejected, so verification and KV truncation are exercised
// every step) equals ordinary decoding token for token.
struct TinyOnGpu {
  std::unique_ptr<Engine> engine;
  MiniMaxM3ModelRunner* runner = nullptr;

  explicit TinyOnGpu(bool speculative) {
    auto backend = gpu();
    auto loaded = minimax_m3::load_model_dir(std::string(M3_REPO_ROOT) + "/models/m3-tiny",
                                             backend.get());
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    weights_ = std::move(loaded->weights);
    const int64_t page = loaded->config.index_block_size;
    auto r =
        MiniMaxM3ModelRunner::create_with_pages(std::move(backend), std::move(loaded->model), 64);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    runner = r->get();
    EngineConfig c;
    c.scheduler.page_size = static_cast<int32_t>(page);
    c.scheduler.chunked_prefill_size = 64;
    auto e = Engine::create(std::move(c), std::move(r).value());
    EXPECT_TRUE(e.is_ok()) << e.status().to_string();
    engine = std::move(e).value();
    if (!speculative) return;
    minimax_m3::dspark::DSparkLoadOptions o;
    o.dummy_weights = true;
    o.attention = minimax_m3::cuda_dspark_block_attention_f32(
        static_cast<CudaBackend*>(runner->backend()));
    auto d = minimax_m3::dspark::load_dspark_engine_draft(o, runner->model(), runner->backend());
    EXPECT_TRUE(d.is_ok()) << d.status().to_string();
    SpeculativeOptions so;
    so.num_draft_tokens = 3;
    Status st = engine->enable_speculative(std::move(d).value(), so);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }

  testing::Outcome run(const GenerateRequest& r) {
    auto h = engine->submit(r);
    EXPECT_TRUE(h.is_ok()) << h.status().to_string();
    std::vector<RequestHandle> hs;
    hs.push_back(std::move(h).value());
    return testing::run_all(*engine, hs, {r.params.n})[0];
  }

 private:
  std::unique_ptr<WeightSource> weights_;
};

TEST(DSparkCudaF32, GreedyEqualsOrdinaryDecodingOnTheBundledModel) {
  GenerateRequest r;
  for (int32_t i = 0; i < 21; ++i) r.prompt_tokens.push_back((i * 37 + 11) % 4000);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 64;
  r.params.ignore_eos = true;
  TinyOnGpu plain(false);
  const testing::Outcome want = plain.run(r);
  ASSERT_TRUE(want.done && want.error.is_ok()) << want.error.to_string();
  TinyOnGpu spec(true);
  const testing::Outcome got = spec.run(r);
  ASSERT_TRUE(got.done && got.error.is_ok()) << got.error.to_string();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.usage.spec_draft_tokens, 0);
  EXPECT_EQ(spec.engine->stats().kv_pages_used, 0);
}

}  // namespace
}  // namespace m3

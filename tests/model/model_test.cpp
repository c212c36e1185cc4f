// MiniMax-M3 text model on the CPU backend: against an independent double-precision reference,
// incremental decode and chunked prefill against one prefill, batch invariance, weight naming and
// input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/model.h"
#include "single_sequence.h"
#include "tiny_model.h"

namespace m3 {
namespace {

using minimax_m3::ForwardOutput;
using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::SequenceInput;
using testing::SequenceRunner;
using testing::SimplePagePool;
using testing::NamingStyle;

using testing::random_tokens;

struct Harness {
  MiniMaxM3Config cfg;
  testing::MemoryWeightSource src;
  CpuBackend backend{2};
  std::unique_ptr<Model> model;
  std::unique_ptr<PagedKvCache> cache;
  std::unique_ptr<SimplePagePool> pool;

  explicit Harness(const MiniMaxM3Config& c, uint32_t seed = 7, const NamingStyle& style = {})
      : cfg(c), src(testing::random_weights(c, seed, style)) {
    auto m = Model::load(cfg, src, &backend);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (m.is_ok()) model = std::move(m).value();
    cache = std::make_unique<PagedKvCache>(&backend, cfg, 64);
    pool = std::make_unique<SimplePagePool>(64);
  }

  // Logits [T, V] of every position, prefilled in chunks of `chunk` (0: one forward).
  std::vector<float> run(const std::vector<int32_t>& tokens, int64_t chunk) {
    SequenceRunner seq(model.get(), cache.get(), pool.get());
    std::vector<float> logits;
    Status st = seq.append(tokens, chunk, true, &logits);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return logits;
  }
};

// Float32 model vs the double reference. Tolerance: every op is within a few units of roundoff
// of its exact value (the op tests bound each one), so each layer adds a relative error of order
// K·u ≈ 64·6e-8 ≈ 4e-6 to the residual stream (K = the longest dot product, worst case, no
// cancellation assumed); three layers and the LM head stay under ~2e-5 of the logit scale, which
// is the bound used: |err| <= 2e-5 · max(1, max|logit| of the row). Observed: below 1e-6. The
// argmax must agree unless the reference's top-2 gap is below that bound. A semantic error
// (wrong mask, norm, RoPE pairing, routing) moves logits by O(0.1-1), far above it.
void expect_close_to_reference(const MiniMaxM3Config& cfg, const NamingStyle& style,
                               int64_t len, uint32_t seed) {
  Harness hx(cfg, seed, style);
  ASSERT_TRUE(hx.model);
  auto tokens = random_tokens(len, cfg.vocab_size, seed + 1);
  auto got = hx.run(tokens, 0);
  auto want = testing::ref::forward(cfg, hx.src, tokens, style);
  const int64_t V = cfg.vocab_size;
  double worst = 0;
  int64_t worst_t = -1, worst_v = -1;
  for (int64_t t = 0; t < len; ++t) {
    double scale = 0;
    for (double z : want[t]) scale = std::max(scale, std::abs(z));
    double tol = 2e-5 * std::max(scale, 1.0);
    int64_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      double r = std::abs(got[t * V + v] - want[t][v]) / tol;
      if (r > worst) worst = r, worst_t = t, worst_v = v;
      if (want[t][v] > want[t][best]) best = v;
    }
    double second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != best) second = std::max(second, want[t][v]);
    if (want[t][best] - second > tol) {
      EXPECT_EQ(testing::argmax(std::span<const float>(got.data() + t * V, V)), best)
          << "position " << t;
    }
  }
  std::printf("[ model vs reference ] worst |err| / tolerance = %.3g (position %lld, id %lld)\n",
              worst, static_cast<long long>(worst_t), static_cast<long long>(worst_v));
  EXPECT_LE(worst, 1.0) << "worst logit at position " << worst_t << " id " << worst_v << ": got "
                        << got[worst_t * V + worst_v] << " want " << want[worst_t][worst_v];
}

TEST(MiniMaxM3Model, MatchesReferenceMixedLayers) {
  expect_close_to_reference(testing::tiny_config(), {}, 37, 11);
}

TEST(MiniMaxM3Model, MatchesReferenceAllSparseInitBlockTwoLocal) {
  auto c = testing::tiny_config();
  c.layer_types.assign(3, AttentionKind::kSparse);
  c.index_init_blocks = 1;
  c.index_local_blocks = 2;
  c.index_topk_blocks = 4;
  c.rotary_dim = 16;  // whole head rotated; the index head (16) too
  expect_close_to_reference(c, {}, 45, 12);
}

TEST(MiniMaxM3Model, MatchesReferenceBareTextNamesDenseUnderMoe) {
  auto c = testing::tiny_config();
  c.mlp_layer_types = {MlpKind::kDense, MlpKind::kDense, MlpKind::kMoe};
  c.index_head_dim = 8;  // narrower than rotary_dim: rot width min(8, 8)
  c.rotary_dim = 12;     // index head rotates 8 dims with a 12-wide table (HF's slice)
  NamingStyle style;
  style.model_prefix = "model.";
  style.lm_head = "lm_head.weight";
  style.dense_under_moe = true;
  expect_close_to_reference(c, style, 23, 13);
}

TEST(MiniMaxM3Model, SparsityChangesTheResult) {
  // Guard for the test above: with top-3 of up to 10 blocks the selection matters, i.e. the same
  // weights with top-k >= every block (dense-equivalent) give clearly different logits.
  auto c = testing::tiny_config();
  Harness sparse(c, 21);
  auto dense_cfg = c;
  dense_cfg.index_topk_blocks = 64;
  Harness dense(dense_cfg, 21);
  auto tokens = random_tokens(40, c.vocab_size, 22);
  auto a = sparse.run(tokens, 0), b = dense.run(tokens, 0);
  const int64_t V = c.vocab_size;
  // Positions < 12 (3 blocks) are identical: every block is selected.
  for (int64_t i = 0; i < 12 * V; ++i) ASSERT_EQ(a[i], b[i]) << "index " << i;
  double diff = 0;
  for (int64_t i = 12 * V; i < 40 * V; ++i) diff = std::max(diff, double(std::abs(a[i] - b[i])));
  EXPECT_GT(diff, 1e-2);
}

TEST(MiniMaxM3Model, DecodeAndChunkedPrefillEqualOnePrefill) {
  // Every op computes an element in an order independent of how many tokens share the call, so
  // token-by-token decode and any chunking reproduce one prefill bitwise (stronger than the
  // 1e-5 relative the design asks for).
  Harness hx(testing::tiny_config(), 31);
  auto tokens = random_tokens(30, hx.cfg.vocab_size, 32);
  auto full = hx.run(tokens, 0);
  for (int64_t chunk : {1, 3, 4, 7, 16}) {
    auto got = hx.run(tokens, chunk);
    ASSERT_EQ(got.size(), full.size());
    EXPECT_EQ(got, full) << "chunk " << chunk;
  }
}

TEST(MiniMaxM3Model, BatchInvariance) {
  Harness hx(testing::tiny_config(), 41);
  const int64_t V = hx.cfg.vocab_size;
  auto a = random_tokens(19, V, 42), b = random_tokens(6, V, 43), c = random_tokens(33, V, 44);
  // Alone: a prefilled in two chunks (13 + 6), b in one, c in one.
  auto alone_a = hx.run(a, 13), alone_b = hx.run(b, 0), alone_c = hx.run(c, 0);

  // Together: step 1 = a[0:13] + b[0:5] + c[0:20]; step 2 = a[13:] + b[5] (decode) + c[20:].
  SimplePagePool& pool = *hx.pool;
  std::vector<int32_t> ta, tb, tc;
  ASSERT_TRUE(pool.allocate(5, &ta).is_ok());
  ASSERT_TRUE(pool.allocate(2, &tb).is_ok());
  ASSERT_TRUE(pool.allocate(9, &tc).is_ok());
  auto all_rows = [](int64_t n) {
    std::vector<int32_t> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r[i] = static_cast<int32_t>(i);
    return r;
  };
  std::vector<float> got_a, got_b, got_c;
  for (int step = 0; step < 2; ++step) {
    std::span<const int32_t> sa(a), sb(b), sc(c);
    SequenceInput in[3];
    in[0].tokens = step == 0 ? sa.subspan(0, 13) : sa.subspan(13);
    in[0].start_pos = step == 0 ? 0 : 13;
    in[1].tokens = step == 0 ? sb.subspan(0, 5) : sb.subspan(5);
    in[1].start_pos = step == 0 ? 0 : 5;
    in[2].tokens = step == 0 ? sc.subspan(0, 20) : sc.subspan(20);
    in[2].start_pos = step == 0 ? 0 : 20;
    in[0].block_table = ta, in[1].block_table = tb, in[2].block_table = tc;
    for (auto& x : in) x.logits_rows = all_rows(static_cast<int64_t>(x.tokens.size()));
    ForwardOutput out;
    Status st = hx.model->forward(in, hx.cache.get(), &out);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    got_a.insert(got_a.end(), out.logits[0].begin(), out.logits[0].end());
    got_b.insert(got_b.end(), out.logits[1].begin(), out.logits[1].end());
    got_c.insert(got_c.end(), out.logits[2].begin(), out.logits[2].end());
  }
  EXPECT_EQ(got_a, alone_a);
  EXPECT_EQ(got_b, alone_b);
  EXPECT_EQ(got_c, alone_c);
  pool.release(ta), pool.release(tb), pool.release(tc);
}

TEST(MiniMaxM3Model, LogitsRowsInRequestedOrder) {
  Harness hx(testing::tiny_config(), 51);
  const int64_t V = hx.cfg.vocab_size;
  auto tokens = random_tokens(9, V, 52);
  auto full = hx.run(tokens, 0);
  std::vector<int32_t> table;
  ASSERT_TRUE(hx.pool->allocate(3, &table).is_ok());
  SequenceInput in;
  in.tokens = tokens;
  in.block_table = table;
  in.logits_rows = {8, 2};
  ForwardOutput out;
  ASSERT_TRUE(hx.model->forward({&in, 1}, hx.cache.get(), &out).is_ok());
  ASSERT_EQ(out.logits[0].size(), size_t(2 * V));
  EXPECT_TRUE(std::equal(full.begin() + 8 * V, full.begin() + 9 * V, out.logits[0].begin()));
  EXPECT_TRUE(std::equal(full.begin() + 2 * V, full.begin() + 3 * V, out.logits[0].begin() + V));
  hx.pool->release(table);
}

TEST(MiniMaxM3Model, GreedyGenerateMatchesArgmaxOfFullForward) {
  Harness hx(testing::tiny_config(), 61);
  const int64_t V = hx.cfg.vocab_size;
  auto prompt = random_tokens(7, V, 62);
  testing::GenerateOptions opts;
  opts.max_tokens = 12;
  opts.ignore_eos = true;
  auto gen = testing::generate(hx.model.get(), hx.cache.get(), hx.pool.get(), prompt, opts);
  ASSERT_TRUE(gen.is_ok()) << gen.status().to_string();
  ASSERT_EQ(gen->size(), 12u);
  // Re-run prompt + generated tokens in one forward: each generated token is the argmax of the
  // previous position.
  auto seq = prompt;
  seq.insert(seq.end(), gen->begin(), gen->end());
  auto logits = hx.run(seq, 0);
  for (size_t i = 0; i < gen->size(); ++i) {
    size_t pos = prompt.size() - 1 + i;
    EXPECT_EQ((*gen)[i], testing::argmax(std::span<const float>(logits.data() + pos * V, V)))
        << "token " << i;
  }
  // Stop at EOS: make the first generated token the EOS id.
  opts.ignore_eos = false;
  opts.eos_token_ids = {(*gen)[0]};
  auto stopped = testing::generate(hx.model.get(), hx.cache.get(), hx.pool.get(), prompt, opts);
  ASSERT_TRUE(stopped.is_ok());
  EXPECT_EQ(*stopped, std::vector<int32_t>{(*gen)[0]});
  // Sampling is reproducible with a seed.
  opts.ignore_eos = true;
  opts.temperature = 0.8;
  opts.seed = 5;
  auto s1 = testing::generate(hx.model.get(), hx.cache.get(), hx.pool.get(), prompt, opts);
  auto s2 = testing::generate(hx.model.get(), hx.cache.get(), hx.pool.get(), prompt, opts);
  ASSERT_TRUE(s1.is_ok() && s2.is_ok());
  EXPECT_EQ(*s1, *s2);
  EXPECT_EQ(hx.pool->num_free(), 64);  // every page came back
}

TEST(MiniMaxM3Model, InputErrorsAreStatuses) {
  Harness hx(testing::tiny_config(), 71);
  std::vector<int32_t> table;
  ASSERT_TRUE(hx.pool->allocate(1, &table).is_ok());
  std::vector<int32_t> bad = {1, 300};
  SequenceInput in;
  in.tokens = bad;
  in.block_table = table;
  ForwardOutput out;
  Status st = hx.model->forward({&in, 1}, hx.cache.get(), &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("token id 300"), std::string::npos) << st.message();
  std::vector<int32_t> long_seq(9, 1);  // 9 positions need 3 pages of 4
  in.tokens = long_seq;
  st = hx.model->forward({&in, 1}, hx.cache.get(), &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block table"), std::string::npos) << st.message();
  hx.pool->release(table);
}

TEST(MiniMaxM3Weights, MissingTensorIsNamed) {
  auto cfg = testing::tiny_config();
  auto src = testing::random_weights(cfg, 81);
  src.tensors.erase("language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight");
  CpuBackend be(1);
  auto m = Model::load(cfg, src, &be);
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("layers.2.block_sparse_moe.experts.3.w2.weight"),
            std::string::npos)
      << m.status().message();

  auto src2 = testing::random_weights(cfg, 81);
  src2.tensors.erase("language_model.model.embed_tokens.weight");
  auto m2 = Model::load(cfg, src2, &be);
  ASSERT_FALSE(m2.is_ok());
  EXPECT_NE(m2.status().message().find("no text model found"), std::string::npos);

  auto src3 = testing::random_weights(cfg, 81);
  src3.tensors.erase("language_model.lm_head.weight");
  auto m3r = Model::load(cfg, src3, &be);
  ASSERT_FALSE(m3r.is_ok());
  EXPECT_NE(m3r.status().message().find("language_model.lm_head.weight"), std::string::npos);
  cfg.tie_word_embeddings = true;  // tied: the embedding doubles as the head
  EXPECT_TRUE(Model::load(cfg, src3, &be).is_ok());
}

}  // namespace
}  // namespace m3

// The engine's model interface (model/model.h) on the float32 MiniMax-M3 runner: several logits
// rows per slice, input embeddings at chosen tokens, hidden states of chosen layers, truncation
// after rejected tokens, and refusals of what is malformed.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/cpu_model_runner.h"
#include "tiny_model.h"

namespace m3 {
namespace {

using testing::random_tokens;

struct Runner {
  MiniMaxM3Config cfg = testing::tiny_config();
  testing::MemoryWeightSource src = testing::random_weights(cfg, 11);
  std::unique_ptr<MiniMaxM3ModelRunner> runner;

  Runner() {
    auto backend = std::make_unique<CpuBackend>(2);
    auto model = minimax_m3::Model::load(cfg, src, backend.get());
    EXPECT_TRUE(model.is_ok()) << model.status().to_string();
    auto r = MiniMaxM3ModelRunner::create_with_pages(std::move(backend), std::move(model).value(),
                                                     16);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    runner = std::move(r).value();
  }

  // One slice's output, every token's logits; its block table is 4 pages from `base`.
  ModelOutput run(const std::vector<int32_t>& tokens, int32_t base, int64_t start,
                  std::vector<InputEmbedding> embeddings = {},
                  std::vector<int32_t> capture = {}) {
    const std::vector<int32_t> pages = {base, base + 1, base + 2, base + 3};
    ModelStep step;
    ModelSlice& s = step.slices.emplace_back();
    s.tokens = tokens;
    s.start_pos = start;
    s.block_table = pages;
    for (int32_t i = 0; i < static_cast<int32_t>(tokens.size()); ++i) s.logits_rows.push_back(i);
    s.embeddings = std::move(embeddings);
    step.capture_layers = std::move(capture);
    ModelOutput out;
    Status st = runner->forward(step, out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return out;
  }
};

TEST(ModelSeams, EveryRowOfASliceEqualsItsOwnPrefix) {
  Runner r;
  const int64_t V = r.cfg.vocab_size;
  auto tokens = random_tokens(9, V, 3);
  ModelOutput all = r.run(tokens, 0, 0);
  ASSERT_EQ(all.logits[0].size(), tokens.size() * V);
  // Row i equals the last row of the prefix tokens[0..i] run alone (other pages).
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + i + 1);
    ModelOutput one = r.run(prefix, 4, 0);
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(all.logits[0][i * V + v], one.logits[0][i * V + v]) << "row " << i;
    }
  }
}

TEST(ModelSeams, InputEmbeddingReplacesTheTokenEmbedding) {
  Runner r;
  const int64_t V = r.cfg.vocab_size, hd = r.cfg.hidden_size;
  auto tokens = random_tokens(6, V, 5);
  ModelOutput plain = r.run(tokens, 0, 0);
  // The embedding table's own row for token 2, supplied for a placeholder token: bitwise equal.
  const auto& table = r.src.tensors.at("language_model.model.embed_tokens.weight").data;
  std::vector<float> row(table.begin() + tokens[2] * hd, table.begin() + (tokens[2] + 1) * hd);
  std::vector<int32_t> placeholder = tokens;
  placeholder[2] = (tokens[2] + 1) % V;
  ModelOutput same = r.run(placeholder, 4, 0, {InputEmbedding{2, row}});
  EXPECT_EQ(plain.logits[0], same.logits[0]);
  // Another vector changes the rows from that token on, and none before it.
  std::vector<float> other(hd, 0.5f);
  ModelOutput changed = r.run(tokens, 8, 0, {InputEmbedding{2, other}});
  for (int64_t i = 0; i < 6; ++i) {
    const bool differs = !std::equal(plain.logits[0].begin() + i * V,
                                     plain.logits[0].begin() + (i + 1) * V,
                                     changed.logits[0].begin() + i * V);
    EXPECT_EQ(differs, i >= 2) << "row " << i;
  }
}

TEST(ModelSeams, CapturedLastLayerGivesTheLogitsThroughNormAndHead) {
  Runner r;
  const int64_t V = r.cfg.vocab_size, hd = r.cfg.hidden_size;
  const int32_t last = static_cast<int32_t>(r.cfg.num_hidden_layers - 1);
  auto tokens = random_tokens(5, V, 9);
  ModelOutput out = r.run(tokens, 0, 0, {}, {0, last});
  ASSERT_EQ(out.hidden.size(), 1u);
  ASSERT_EQ(out.hidden[0].size(), static_cast<size_t>(2 * 5 * hd));
  // Layer `last` is the second captured block; final norm + LM head in double precision.
  const auto& norm = r.src.tensors.at("language_model.model.norm.weight").data;
  const auto& head = r.src.tensors.at("language_model.lm_head.weight").data;
  for (int64_t t = 0; t < 5; ++t) {
    testing::ref::Vec h(out.hidden[0].begin() + (5 + t) * hd, out.hidden[0].begin() + (6 + t) * hd);
    testing::ref::gemma_norm(h, 0, hd, norm, r.cfg.rms_norm_eps);
    testing::ref::Vec logits = testing::ref::matvec(head, h, V, hd);
    // Float32 norm and head against double: a dot product of hd terms, relative 1e-5.
    for (int64_t v = 0; v < V; ++v) {
      const double got = out.logits[0][t * V + v];
      EXPECT_NEAR(got, logits[v], 1e-5 * std::max(1.0, std::abs(logits[v]))) << t << "," << v;
    }
  }
  // Capture does not change the logits.
  ModelOutput plain = r.run(tokens, 4, 0);
  EXPECT_EQ(plain.logits[0], out.logits[0]);
}

TEST(ModelSeams, TruncatedDraftTokensAreRewrittenCleanly) {
  Runner r;
  const int64_t V = r.cfg.vocab_size;
  auto tokens = random_tokens(10, V, 13);
  // Verify 4 draft tokens after a 6-token prefix, reject the last 3, append 3 other tokens.
  std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + 6);
  r.run(prefix, 0, 0);
  std::vector<int32_t> draft = {tokens[6], 1, 2, 3};
  r.run(draft, 0, 6);
  ASSERT_TRUE(r.runner->truncate(std::vector<int32_t>{0, 1, 2, 3}, 7).is_ok());
  std::vector<int32_t> rest(tokens.begin() + 7, tokens.end());
  ModelOutput after = r.run(rest, 0, 7);
  ModelOutput fresh = r.run(tokens, 4, 0);
  for (size_t i = 0; i < rest.size(); ++i) {
    for (int64_t v = 0; v < V; ++v) {
      ASSERT_EQ(after.logits[0][i * V + v], fresh.logits[0][(7 + i) * V + v]) << i;
    }
  }
}

TEST(ModelSeams, MalformedOptionalInputsAreRefused) {
  Runner r;
  auto tokens = random_tokens(3, r.cfg.vocab_size, 1);
  std::vector<int32_t> pages = {0};
  std::vector<float> short_vec(3, 0.0f);
  ModelStep step;
  ModelSlice& s = step.slices.emplace_back();
  s.tokens = tokens;
  s.block_table = pages;
  s.logits_rows = {2};
  s.embeddings = {InputEmbedding{1, short_vec}};
  ModelOutput out;
  EXPECT_EQ(r.runner->forward(step, out).code(), StatusCode::kInvalidArgument);
  s.embeddings.clear();
  step.capture_layers = {static_cast<int32_t>(r.cfg.num_hidden_layers)};
  EXPECT_EQ(r.runner->forward(step, out).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.runner->features().input_embeddings);
  EXPECT_TRUE(r.runner->features().hidden_capture);
}

}  // namespace
}  // namespace m3

// The draft's input features from the target's captured hidden states under both capture
// conventions (with Model::forward's capture_layers), and the whole path on the bundled m3-tiny
// target with a dummy draft: capture, fuse, commit, propose.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "dspark_reference.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/dspark/dspark_draft.h"
#include "model/minimax_m3/dspark/dspark_dummy_weights.h"
#include "model/minimax_m3/dspark/target_features.h"
#include "model/minimax_m3/model.h"

namespace m3 {
namespace {

using minimax_m3::Model;
using minimax_m3::PagedKvCache;
using minimax_m3::dspark::build_context_features;
using minimax_m3::dspark::capture_layers_for;
using minimax_m3::dspark::CaptureConvention;
using minimax_m3::dspark::DSparkConfig;

// One prefill of `tokens` with every row's logits and the draft's layers captured.
ModelOutput run_target(Model& model, CpuBackend& backend, const std::vector<int32_t>& tokens,
                       const std::vector<int32_t>& capture) {
  const MiniMaxM3Config& cfg = model.config();
  const int64_t pages =
      (static_cast<int64_t>(tokens.size()) + cfg.index_block_size - 1) / cfg.index_block_size;
  PagedKvCache cache(&backend, cfg, pages);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int64_t i = 0; i < pages; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ModelSlice slice;
  slice.tokens = tokens;
  slice.block_table = table;
  for (size_t i = 0; i < tokens.size(); ++i) slice.logits_rows.push_back(static_cast<int32_t>(i));
  ModelOutput out;
  Status st = model.forward(std::span<const ModelSlice>(&slice, 1), &cache, &out, capture);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TEST(DSparkFeatures, BothCaptureConventions) {
  const MiniMaxM3Config target = testing::dspark_target_config();
  const auto src = testing::random_weights(target, 21);
  CpuBackend backend(2);
  auto model = Model::load(target, src, &backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  DSparkConfig draft = testing::tiny_dspark_config();
  draft.target_layer_ids = {2, 0, 1};  // the last layer first: order is the config's
  const int64_t n = 9, hd = target.hidden_size, v = target.vocab_size;
  const auto tokens = testing::random_tokens(n, v, 4);
  const ModelOutput out = run_target(**model, backend, tokens, capture_layers_for(draft));
  ASSERT_EQ(out.hidden.size(), 1u);
  const std::vector<float>& captured = out.hidden[0];  // [3, n, hd]
  ASSERT_EQ(captured.size(), static_cast<size_t>(3 * n * hd));
  const std::vector<float> final_norm = src.get("language_model.model.norm.weight");

  auto raw =
      build_context_features(captured, n, draft, target, CaptureConvention::kLayerOutput, {});
  auto normed = build_context_features(captured, n, draft, target,
                                       CaptureConvention::kFinalNormLast, final_norm);
  ASSERT_TRUE(raw.is_ok()) << raw.status().to_string();
  ASSERT_TRUE(normed.is_ok()) << normed.status().to_string();
  std::vector<float> last_normed(static_cast<size_t>(n * hd));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t l = 0; l < 3; ++l) {
      for (int64_t i = 0; i < hd; ++i) {
        const float cap = captured[(l * n + t) * hd + i];
        // [t, l·hd + i]: entry l of token t is layer target_layer_ids[l]'s hidden state.
        ASSERT_EQ((*raw)[(t * 3 + l) * hd + i], cap);
        if (l != 0) {
          ASSERT_EQ((*normed)[(t * 3 + l) * hd + i], cap) << "only the last layer changes";
        }
      }
    }
    std::copy_n(normed->begin() + t * 3 * hd, hd, last_normed.begin() + t * hd);
  }
  // The normed entry is the target's final-norm output: through the lm_head it gives the target's
  // own logits, bit for bit (the same norm arithmetic and the same linear op).
  std::vector<float> logits(static_cast<size_t>(n * v));
  const std::vector<float>& lm_head = src.get("language_model.lm_head.weight");
  backend.linear({last_normed.data(), lm_head.data(), logits.data(), n, v, hd, false});
  EXPECT_EQ(logits, out.logits[0]);
  EXPECT_NE(std::vector<float>(raw->begin(), raw->begin() + hd),
            std::vector<float>(last_normed.begin(), last_normed.begin() + hd));

  // A last layer not listed: both conventions agree.
  DSparkConfig early = draft;
  early.target_layer_ids = {0, 1};
  const ModelOutput out2 = run_target(**model, backend, tokens, capture_layers_for(early));
  auto a =
      build_context_features(out2.hidden[0], n, early, target, CaptureConvention::kLayerOutput, {});
  auto b = build_context_features(out2.hidden[0], n, early, target,
                                  CaptureConvention::kFinalNormLast, final_norm);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(*a, *b);

  // Errors: a capture of the wrong size; a missing final norm weight.
  auto short_capture =
      build_context_features(std::span<const float>(captured).first(captured.size() - 1), n, draft,
                             target, CaptureConvention::kLayerOutput, {});
  ASSERT_FALSE(short_capture.is_ok());
  EXPECT_NE(short_capture.status().message().find("captured hidden states"), std::string::npos);
  auto no_norm =
      build_context_features(captured, n, draft, target, CaptureConvention::kFinalNormLast, {});
  ASSERT_FALSE(no_norm.is_ok());
  EXPECT_NE(no_norm.status().message().find("final norm"), std::string::npos);
}

using testing::m3_tiny_draft_config;

TEST(DSparkFeatures, DummyDraftOnTheBundledModel) {
  const std::string dir = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
  auto target_cfg = load_minimax_m3_config(dir);
  ASSERT_TRUE(target_cfg.is_ok()) << target_cfg.status().to_string();
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  CpuBackend backend(2);
  auto model = Model::load(*target_cfg, **ckpt, &backend);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const auto tokens = testing::random_tokens(40, target_cfg->vocab_size, 12);

  std::vector<std::vector<int32_t>> drafts;
  for (CaptureConvention conv : {CaptureConvention::kLayerOutput, CaptureConvention::kFinalNormLast,
                                 CaptureConvention::kLayerOutput}) {
    DSparkConfig cfg = m3_tiny_draft_config();
    cfg.capture = conv;
    minimax_m3::dspark::DummyDSparkWeightSource src(cfg, 7);
    auto draft = minimax_m3::dspark::DSparkDraft::load(
        cfg, *target_cfg, src, "dummy",
        minimax_m3::dspark::TargetSharedWeights::view_of((*model)->weights()), &backend);
    ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
    EXPECT_EQ((*draft)->config().rot_dim(), 16);  // the target's
    EXPECT_DOUBLE_EQ((*draft)->config().theta(), 1e4);
    // Prefill: the prompt but its last token is committed; the last token is the anchor.
    const std::vector<int32_t> prompt(tokens.begin(), tokens.end() - 1);
    const ModelOutput out = run_target(**model, backend, prompt, capture_layers_for(cfg));
    const std::vector<float> norm = [&] {
      std::vector<float> w(static_cast<size_t>(target_cfg->hidden_size));
      backend.copy_to_host(w.data(), (*model)->weights().final_norm.data(),
                           static_cast<int64_t>(w.size() * sizeof(float)));
      return w;
    }();
    auto features = build_context_features(out.hidden[0], static_cast<int64_t>(prompt.size()), cfg,
                                           *target_cfg, conv, norm);
    ASSERT_TRUE(features.is_ok()) << features.status().to_string();
    auto cache = (*draft)->new_cache();
    ASSERT_TRUE((*draft)
                    ->append_context(*features, static_cast<int64_t>(prompt.size()), cache.get())
                    .is_ok());
    auto p = (*draft)->propose(tokens.back(), *cache);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->anchor_position, static_cast<int64_t>(prompt.size()));
    ASSERT_EQ(p->tokens.size(), 7u);
    for (int32_t t : p->tokens) EXPECT_TRUE(t >= 0 && t < target_cfg->vocab_size);
    for (float x : p->logits) ASSERT_TRUE(std::isfinite(x));
    drafts.push_back(p->tokens);
  }
  EXPECT_EQ(drafts[0], drafts[2]) << "the same draft twice";
}

}  // namespace
}  // namespace m3

#include "model/minimax_m3/dspark/dspark_engine_draft.h"

#include <algorithm>
#include <filesystem>

#include "loader/checkpoint.h"
#include "model/minimax_m3/dspark/dspark_dummy_weights.h"
#include "model/minimax_m3/dspark/target_features.h"

namespace m3::minimax_m3::dspark {

namespace fs = std::filesystem;

namespace {

struct CacheState final : DraftState {
  std::unique_ptr<DSparkContextCache> cache;
  int64_t length() const override { return cache->length(); }
};

}  // namespace

DSparkEngineDraft::DSparkEngineDraft(std::unique_ptr<DSparkDraft> draft,
                                     const MiniMaxM3Config& target,
                                     std::vector<float> target_final_norm)
    : draft_(std::move(draft)), target_(target), final_norm_(std::move(target_final_norm)) {}

int32_t DSparkEngineDraft::block_size() const {
  return static_cast<int32_t>(draft_->config().block_size);
}

std::vector<int32_t> DSparkEngineDraft::capture_layers() const {
  return capture_layers_for(draft_->config());
}

std::unique_ptr<DraftState> DSparkEngineDraft::new_state() {
  auto s = std::make_unique<CacheState>();
  s->cache = draft_->new_cache();
  return s;
}

Status DSparkEngineDraft::append_context(DraftState& state, std::span<const float> captured,
                                         int64_t n) {
  auto& s = static_cast<CacheState&>(state);
  const std::span<const float> final_norm(final_norm_);
  M3_ASSIGN_OR_RETURN(std::vector<float> features,
                      build_context_features(captured, n, draft_->config(), target_,
                                             draft_->config().capture, final_norm));
  return draft_->append_context(features, n, s.cache.get());
}

Status DSparkEngineDraft::truncate(DraftState& state, int64_t new_length) {
  return static_cast<CacheState&>(state).cache->truncate(new_length);
}

Status DSparkEngineDraft::propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                                  std::vector<int32_t>* tokens) {
  auto& s = static_cast<CacheState&>(state);
  M3_ASSIGN_OR_RETURN(DSparkProposal p, draft_->propose(anchor, *s.cache, pick));
  *tokens = std::move(p.tokens);
  return Status::ok();
}

DSparkConfig default_dspark_config_for(const MiniMaxM3Config& target) {
  DSparkConfig c;  // the released layout
  c.hidden_size = target.hidden_size;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.vocab_size = target.vocab_size;
  c.intermediate_size = 2 * target.hidden_size;
  const int64_t L = target.num_hidden_layers;
  if (L < 60) {
    c.num_hidden_layers = 2;
    c.markov_rank = std::max<int64_t>(1, std::min<int64_t>(256, target.hidden_size / 4));
    c.sliding_window = 512;
  }
  if (c.noise_token_id >= c.vocab_size) c.noise_token_id = std::max<int64_t>(0, c.vocab_size - 6);
  if (L != 60) {
    // Up to 5 ids spread evenly over [1, L - 1] (the released draft's spacing, 14, at L = 60).
    c.target_layer_ids.clear();
    const int64_t n = std::max<int64_t>(1, std::min<int64_t>(5, L - 1));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = n == 1 ? L - 1 : 1 + (i * (L - 2)) / (n - 1);
      if (c.target_layer_ids.empty() || c.target_layer_ids.back() != id)
        c.target_layer_ids.push_back(id);
    }
  }
  c.source = "the default draft config for the target (--load-format dummy)";
  return c;
}

Result<DSparkConfig> resolve_dspark_config(const DSparkLoadOptions& o,
                                           const MiniMaxM3Config& target) {
  const std::string flag = "--speculative-draft-model-path '" + o.draft_dir + "'";
  const bool has_config = !o.draft_dir.empty() && fs::exists(fs::path(o.draft_dir) / "config.json");
  if (has_config) return load_dspark_config(o.draft_dir);
  if (o.dummy_weights) return default_dspark_config_for(target);
  return Status(StatusCode::kNotFound,
                flag +
                    ": no DSpark draft there (no config.json); give the draft's directory, or use "
                    "--load-format dummy (or --speculative-draft-load-format dummy) for random "
                    "draft weights");
}

Result<std::unique_ptr<DSparkEngineDraft>> load_dspark_engine_draft(const DSparkLoadOptions& o,
                                                                    const Model& target,
                                                                    Backend* backend) {
  return load_dspark_engine_draft(o, target.config(), target, backend);
}

Result<std::unique_ptr<DSparkEngineDraft>> load_dspark_engine_draft(
    const DSparkLoadOptions& o, const MiniMaxM3Config& target_cfg, const Model& first_rank,
    Backend* backend) {
  const std::string flag = "--speculative-draft-model-path '" + o.draft_dir + "'";
  const ModelWeights& tw = first_rank.weights();
  const int64_t H = target_cfg.hidden_size, V = target_cfg.vocab_size;
  if (tw.embed.size() != V * H || tw.lm_head.size() != V * H || tw.final_norm.size() != H) {
    return internal_error(flag + ": the target's embedding table, lm_head or final norm is "
                                 "split over ranks; the draft needs them whole (load the ranks "
                                 "with the whole lm_head on rank 0)");
  }
  M3_ASSIGN_OR_RETURN(DSparkConfig cfg, resolve_dspark_config(o, target_cfg));
  std::unique_ptr<WeightSource> src;
  if (o.dummy_weights) {
    src = std::make_unique<DummyDSparkWeightSource>(cfg, o.dummy_seed);
  } else {
    auto opened = Checkpoint::open(o.draft_dir);
    if (!opened.is_ok()) {
      return Status(opened.status().code(), flag + ": " + opened.status().message());
    }
    src = std::move(opened).value();
  }
  auto draft = DSparkDraft::load(cfg, target_cfg, *src,
                                 o.dummy_weights ? std::string("dummy draft weights") : o.draft_dir,
                                 TargetSharedWeights::view_of(tw), backend, o.attention);
  if (!draft.is_ok()) {
    return Status(draft.status().code(), flag + ": " + draft.status().message());
  }
  // The final norm to host memory (the target's weights may live on the GPU).
  std::vector<float> final_norm(static_cast<size_t>(H));
  backend->copy_to_host(final_norm.data(), tw.final_norm.data(),
                        static_cast<int64_t>(final_norm.size() * sizeof(float)));
  return std::make_unique<DSparkEngineDraft>(std::move(draft).value(), target_cfg,
                                             std::move(final_norm));
}

}  // namespace m3::minimax_m3::dspark

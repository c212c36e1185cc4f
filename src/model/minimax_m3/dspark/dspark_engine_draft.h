// DSparkDraft behind the engine's draft seam (model/draft_model.h), and its loading for
// `--speculative-algorithm DSPARK` (docs/dspark.md, "Engine"): the draft's config and weights from
// the draft directory (default <model>/dspark), or dummy weights at a shape derived from the
// target when --load-format dummy and the directory has no config.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "model/draft_model.h"
#include "model/minimax_m3/dspark/dspark_draft.h"
#include "model/minimax_m3/model.h"

namespace m3::minimax_m3::dspark {

class DSparkEngineDraft final : public DraftModel {
 public:
  // `target_final_norm` is the target's final norm weight [hidden] in host memory (the
  // final_norm_last convention applies it to the captured hidden states on the host).
  DSparkEngineDraft(std::unique_ptr<DSparkDraft> draft, const MiniMaxM3Config& target,
                    std::vector<float> target_final_norm);

  int32_t block_size() const override;
  std::vector<int32_t> capture_layers() const override;
  std::unique_ptr<DraftState> new_state() override;
  Status append_context(DraftState& state, std::span<const float> captured, int64_t n) override;
  Status truncate(DraftState& state, int64_t new_length) override;
  Status propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                 std::vector<int32_t>* tokens) override;

  DSparkDraft& draft() { return *draft_; }

 private:
  std::unique_ptr<DSparkDraft> draft_;
  MiniMaxM3Config target_;
  std::vector<float> final_norm_;
};

// A draft config for `target` when there is none to read (dummy weights): the released draft's
// layout scaled to the target (its hidden size, heads and vocabulary; up to 5 target layers
// spread from layer 1 to the last; 2 draft layers below 60 target layers, else 5).
DSparkConfig default_dspark_config_for(const MiniMaxM3Config& target);

struct DSparkLoadOptions {
  std::string draft_dir;       // --speculative-draft-model-path
  bool dummy_weights = false;  // --load-format dummy
  uint64_t dummy_seed = 0;
  // The block attention on a non-CPU backend (DSparkDraft::load); empty on the CPU backend.
  BlockAttentionFn attention;
};

// The draft's config as load_dspark_engine_draft reads it (the directory's config.json, else the
// default for `target` with dummy weights), before anything is loaded: the memory plan counts the
// draft from it.
Result<DSparkConfig> resolve_dspark_config(const DSparkLoadOptions& options,
                                           const MiniMaxM3Config& target);

// Loads the draft for a target `model` on `backend` (the target's backend: the CPU backend, or
// another with options.attention). Errors name the draft directory and
// --speculative-draft-model-path.
Result<std::unique_ptr<DSparkEngineDraft>> load_dspark_engine_draft(
    const DSparkLoadOptions& options, const Model& target, Backend* backend);
// The same for a target split over ranks (--tp): `target` is the whole model's config and
// `first_rank` rank 0's part, whose embedding table, lm_head and final norm must be whole (the
// draft reads those: the lm_head is split by vocabulary over the ranks unless rank 0 was loaded
// with ParallelLayout::whole_lm_head_on_rank0); the draft itself is not split and runs on
// `backend`.
Result<std::unique_ptr<DSparkEngineDraft>> load_dspark_engine_draft(
    const DSparkLoadOptions& options, const MiniMaxM3Config& target, const Model& first_rank,
    Backend* backend);

}  // namespace m3::minimax_m3::dspark

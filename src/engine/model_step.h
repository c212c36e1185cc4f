// StepPlan <-> ModelStep: what the engine hands the model for one step (one ModelSlice per
// planned slice, the last token's logits for the slices that need them) and the logits rows back
// in plan order for the sampler.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "sched/step_plan.h"

namespace m3 {

// The logits of one step in plan order, as the sampler reads them.
struct LogitsOut {
  int32_t vocab_size = 0;
  // [num_rows, vocab_size] float32, one row per slice with need_logits, in plan order: the logits
  // after the LAST token of that slice; without the rows the runner sampled itself (tokens).
  std::vector<float> data;
  // Empty, or one entry per slice with need_logits (plan order): the token the runner sampled
  // for that row, or -1 where the row's logits are in `data`.
  std::vector<int32_t> tokens;

  // Rows held in `data`.
  int32_t num_rows() const {
    return vocab_size > 0 ? static_cast<int32_t>(data.size() / vocab_size) : 0;
  }
  std::span<const float> row(int32_t i) const {
    return {data.data() + static_cast<size_t>(i) * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

// The model's batch for `plan`; spans point into `plan` (which must outlive the step).
// `sampling` (empty, or one entry per slice with need_logits): ModelSlice::sample, offered only
// where the slice asks for one row. `all_rows[i]`: slice i asks for the logits of every token
// (prompt logits), as does a verify slice (SeqSlice::num_draft > 0); else only a slice with
// need_logits asks, for its last token.
ModelStep model_step(const StepPlan& plan,
                     std::span<const std::optional<DeviceSampling>> sampling = {},
                     const std::vector<bool>& all_rows = {});

// Copies the last row of each slice with need_logits into `out` ([rows, vocab] in plan order);
// where the model sampled a row itself (mo.tokens), out.tokens gets the token and out.data
// skips the row. Output of the wrong shape for `step` is an internal error.
Status gather_step_logits(const StepPlan& plan, const ModelStep& step, const ModelOutput& mo,
                          int32_t vocab, LogitsOut& out);

}  // namespace m3

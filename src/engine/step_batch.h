// StepPlan <-> minimax_m3::Model::forward glue shared by the model runners (CPU float32 and the
// CUDA real-shape runner): one SequenceInput per slice (logits for the slice's last token when it
// needs them), and the logits rows back in plan order.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/model_runner.h"
#include "model/minimax_m3/model.h"
#include "sched/step_plan.h"

namespace m3 {

// The batch for Model::forward; spans point into `plan` (which must outlive the batch).
// `sampling` (empty, or one entry per slice with need_logits): SequenceInput::sample.
std::vector<minimax_m3::SequenceInput> step_batch(
    const StepPlan& plan, std::span<const std::optional<DeviceSampling>> sampling = {});

// Copies the logits of the slices with need_logits into `out` ([rows, vocab] in plan order);
// where the model sampled a row itself (fo.tokens), out.tokens gets the token and out.data
// skips the row.
// `who` names the runner in the internal error when a row has the wrong length.
Status gather_step_logits(const StepPlan& plan, const minimax_m3::ForwardOutput& fo, int32_t vocab,
                          const char* who, LogitsOut& out);

}  // namespace m3

// The engine's seam to a speculative draft model (docs/dspark.md, "Engine"): model-neutral, so the
// engine links no draft library. The draft reads hidden states the target captures
// (ModelStep::capture_layers) for every committed token, keeps per-sequence context in a
// DraftState, and proposes a block of tokens from the last committed token (the anchor).
//
// Positions: a state of length() L holds the context of the committed positions [0, L); the
// anchor is at position L and its own hidden states are not known yet.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3 {

class DraftState {
 public:
  virtual ~DraftState() = default;
  virtual int64_t length() const = 0;
};

// Picks slot `slot`'s token from that slot's draft logits [V]; the engine draws it under the
// request's sampling parameters and keeps the distribution it drew from (the q of verification).
using DraftTokenPicker = std::function<int32_t(std::span<const float> logits, int64_t slot)>;

class DraftModel {
 public:
  virtual ~DraftModel() = default;
  // Tokens proposed per step (B).
  virtual int32_t block_size() const = 0;
  // Target layers whose hidden states the draft reads, in the order append_context expects.
  virtual std::vector<int32_t> capture_layers() const = 0;
  virtual std::unique_ptr<DraftState> new_state() = 0;
  // Commits positions [length(), length() + n): `captured` is [capture_layers().size(), n,
  // hidden] (ModelOutput::hidden's layout for those tokens).
  virtual Status append_context(DraftState& state, std::span<const float> captured, int64_t n) = 0;
  // Rolls back to new_length <= length(); may refuse (then the caller starts a new state).
  virtual Status truncate(DraftState& state, int64_t new_length) = 0;
  // Proposes block_size() tokens after `anchor` (at position length()), slot by slot through
  // `pick` (each slot's logits may depend on the previous slot's token).
  virtual Status propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                         std::vector<int32_t>* tokens) = 0;
  // propose with the greedy picker: each slot's token the argmax of its logits, the lowest id on
  // ties (the sampler's greedy choice). A draft on a GPU overrides it to pick there without a
  // host round trip per slot; this default runs propose with that picker on the host.
  virtual Status propose_greedy(DraftState& state, int32_t anchor, std::vector<int32_t>* tokens) {
    return propose(
        state, anchor,
        [](std::span<const float> logits, int64_t) {
          return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                      logits.begin());
        },
        tokens);
  }
  // propose_greedy for several sequences ((*tokens)[i] is states[i]'s block; each state once). A
  // draft that runs them in one forward overrides it; this default proposes one after another.
  virtual Status propose_greedy_batch(std::span<DraftState* const> states,
                                      std::span<const int32_t> anchors,
                                      std::vector<std::vector<int32_t>>* tokens) {
    if (states.size() != anchors.size())
      return invalid_argument("[draft] propose_greedy_batch: " + std::to_string(states.size()) +
                              " states and " + std::to_string(anchors.size()) + " anchors");
    tokens->assign(states.size(), {});
    for (size_t i = 0; i < states.size(); ++i)
      M3_RETURN_IF_ERROR(propose_greedy(*states[i], anchors[i], &(*tokens)[i]));
    return Status::ok();
  }
};

}  // namespace m3

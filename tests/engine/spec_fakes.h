// Fakes for speculative decoding in the engine: a FakeModel that returns "hidden states" encoding
// each token and its position (so a draft can check it is fed every committed position once, in
// order), and a draft over them whose proposals are random, the target's own continuation
// (oracle), or a perturbation of the target (partial acceptance).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "fake_model.h"
#include "model/draft_model.h"

namespace m3::testing {

class CapturingFakeModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  ModelFeatures features() const override { return {false, true}; }
  Status forward(const ModelStep& step, ModelOutput& out) override {
    M3_RETURN_IF_ERROR(FakeModel::forward(step, out));
    out.hidden.assign(step.slices.size(), {});
    const size_t L = step.capture_layers.size();
    const size_t H = static_cast<size_t>(hidden_size());
    for (size_t i = 0; i < step.slices.size(); ++i) {
      const ModelSlice& s = step.slices[i];
      const size_t T = s.tokens.size();
      std::vector<float>& h = out.hidden[i];
      h.assign(L * T * H, 0.0f);
      for (size_t l = 0; l < L; ++l) {
        for (size_t t = 0; t < T; ++t) {
          h[(l * T + t) * H + 0] = static_cast<float>(s.tokens[t]);
          h[(l * T + t) * H + 1] = static_cast<float>(s.start_pos + static_cast<int64_t>(t));
          h[(l * T + t) * H + 2] = static_cast<float>(step.capture_layers[l]);
        }
      }
    }
    return Status::ok();
  }
};

enum class DraftKind { kRandom, kOracle, kPerturbed };

class FakeDraft : public DraftModel {
 public:
  struct State : DraftState {
    std::vector<int32_t> tokens;
    int64_t length() const override { return static_cast<int64_t>(tokens.size()); }
  };

  FakeDraft(DraftKind kind, int32_t vocab, int32_t block)
      : kind_(kind), vocab_(vocab), block_(block) {}

  int32_t block_size() const override { return block_; }
  std::vector<int32_t> capture_layers() const override { return {1, 3}; }
  std::unique_ptr<DraftState> new_state() override { return std::make_unique<State>(); }
  Status append_context(DraftState& state, std::span<const float> captured, int64_t n) override {
    auto& s = static_cast<State&>(state);
    const size_t H = 8;
    if (captured.size() != 2 * static_cast<size_t>(n) * H)
      return internal_error("[fake_draft] captured " + std::to_string(captured.size()));
    for (int64_t t = 0; t < n; ++t) {
      const float* row = captured.data() + t * H;
      const float* row2 = captured.data() + (n + t) * H;
      if (row[1] != static_cast<float>(s.length()) || row[2] != 1.0f || row2[2] != 3.0f ||
          row2[0] != row[0]) {
        ++bad_context;
        return internal_error("[fake_draft] position " + std::to_string(row[1]) +
                              " appended at length " + std::to_string(s.length()));
      }
      s.tokens.push_back(static_cast<int32_t>(row[0]));
    }
    return Status::ok();
  }
  Status truncate(DraftState& state, int64_t new_length) override {
    auto& s = static_cast<State&>(state);
    if (new_length > s.length()) return internal_error("[fake_draft] truncate beyond the end");
    s.tokens.resize(static_cast<size_t>(new_length));
    return Status::ok();
  }
  Status propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                 std::vector<int32_t>* tokens) override {
    ++num_proposals;
    std::vector<int32_t> ctx = static_cast<State&>(state).tokens;
    ctx.push_back(anchor);
    tokens->clear();
    std::vector<float> logits(vocab_), noise(vocab_);
    for (int32_t k = 0; k < block_; ++k) {
      FakeModel::logits_for(ctx, vocab_, logits.data());
      if (kind_ != DraftKind::kOracle) {
        std::vector<int32_t> salted = ctx;
        salted.push_back(vocab_ + 17);
        FakeModel::logits_for(salted, vocab_, noise.data());
        const float mix = kind_ == DraftKind::kRandom ? 1.0f : 0.5f;
        for (int32_t v = 0; v < vocab_; ++v) logits[v] = (1 - mix) * logits[v] + mix * noise[v];
      }
      const int32_t t = pick(logits, k);
      if (t < 0 || t >= vocab_) return internal_error("[fake_draft] picked " + std::to_string(t));
      tokens->push_back(t);
      ctx.push_back(t);
    }
    return Status::ok();
  }

  // Counts the greedy entry point, then runs the default (propose with a host argmax picker).
  Status propose_greedy(DraftState& state, int32_t anchor, std::vector<int32_t>* tokens) override {
    ++num_greedy_proposals;
    return DraftModel::propose_greedy(state, anchor, tokens);
  }

  // Records the batch size, then runs the default (propose_greedy one state after another).
  Status propose_greedy_batch(std::span<DraftState* const> states,
                              std::span<const int32_t> anchors,
                              std::vector<std::vector<int32_t>>* tokens) override {
    max_greedy_batch = std::max<int64_t>(max_greedy_batch, static_cast<int64_t>(states.size()));
    return DraftModel::propose_greedy_batch(states, anchors, tokens);
  }

  int64_t num_proposals = 0;        // every proposal (propose_greedy runs propose too)
  int64_t num_greedy_proposals = 0;
  int64_t max_greedy_batch = 0;  // the most sequences of one propose_greedy_batch
  int64_t bad_context = 0;

 private:
  DraftKind kind_;
  int32_t vocab_, block_;
};

}  // namespace m3::testing

// The MiniMax-M3 text model (m3-architecture.md §2-§3) on any Backend: embeddings, decoder layers
// with dense or MSA block-sparse GQA attention and dense-MLP or MoE feed-forward, final norm and
// LM head. The model is stateless between calls; all sequence state lives in the paged KV cache
// and the block tables the caller passes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/kv_cache.h"
#include "model/minimax_m3/weights.h"
#include "sample/device_sampling.h"

namespace m3::minimax_m3 {

// New tokens of one sequence for one forward step (a prefill chunk, a decode token, or several
// draft tokens). The cache must already hold positions [0, start_pos) of this sequence; the step
// writes positions [start_pos, start_pos + tokens.size()). Positions are token indices in the
// sequence (HF's position_ids), which also anchor the sparse blocks.
struct SequenceInput {
  std::span<const int32_t> tokens;       // [T_i] token ids
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // page ids; must cover start_pos + T_i positions
  std::vector<int32_t> logits_rows;      // which of tokens (0-based) need logits, any order
  // Set (with exactly one logits row): the model may sample that row itself and return the token
  // instead of the logits (ForwardOutput::tokens); models that cannot ignore it.
  std::optional<DeviceSampling> sample;
};

// Logits for each sequence: logits[i] is [logits_rows.size(), vocab], rows in the order asked;
// except where tokens[i] >= 0 (tokens is empty or one per sequence): the model sampled sequence
// i's row (SequenceInput::sample) and logits[i] is empty.
struct ForwardOutput {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

class Model {
 public:
  // Loads weights (float32) onto `backend` (not owned; must outlive the model).
  static Result<std::unique_ptr<Model>> load(const MiniMaxM3Config& cfg, const WeightSource& src,
                                             Backend* backend);

  const MiniMaxM3Config& config() const { return cfg_; }
  Backend* backend() const { return backend_; }

  // Runs one step over several sequences at once. Linear layers run on all tokens together;
  // attention runs per sequence. On the CPU backend a sequence's logits are bitwise independent
  // of the other sequences in the batch. Errors (bad token id, block table too short, empty
  // input) leave the cache contents of untouched positions intact.
  Status forward(std::span<const SequenceInput> batch, PagedKvCache* cache, ForwardOutput* out);

 private:
  Model(const MiniMaxM3Config& cfg, Backend* backend) : cfg_(cfg), backend_(backend) {}

  MiniMaxM3Config cfg_;
  Backend* backend_;
  ModelWeights w_;
};

}  // namespace m3::minimax_m3

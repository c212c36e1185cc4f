// The one seam between the engine and any model: a step batch in (new tokens of several
// sequences over a paged KV cache), logits or sampled tokens out. Model-neutral: nothing here
// names an architecture or a device, so the engine includes this header alone and links no model
// library. Implementations live one folder per architecture (model/minimax_m3/ has the float32
// reference on any Backend and the CUDA path).
//
// The step carries what the next features need, so none of them needs another seam:
// - several logits rows per sequence (speculative verification, prompt scoring);
// - sampling next to the logits (DeviceSampling), for runners that can;
// - input embeddings for chosen token positions (image features at placeholder tokens);
// - hidden states of chosen layers returned per token (a draft model's input);
// - truncating a sequence's KV after rejected draft tokens;
// - a model spread over several ranks (the engine sees one runner either way).
// A runner states which optional inputs it honours (ModelFeatures); asked for one it lacks, it
// fails the step with kUnimplemented rather than ignoring it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "kv/kv_page_copier.h"
#include "sample/device_sampling.h"

namespace m3 {

// A supplied input vector that replaces the token embedding of one of a slice's tokens.
struct InputEmbedding {
  int32_t token_index = 0;        // into ModelSlice::tokens
  std::span<const float> values;  // [hidden_size]
};

// New tokens of one sequence for one step: a prefill chunk, a decode token, or draft tokens to
// verify. The cache already holds positions [0, start_pos) of this sequence; the step writes
// positions [start_pos, start_pos + tokens.size()) and attends over [0, position] for each token.
// Positions are token indices in the sequence (HF's position_ids).
struct ModelSlice {
  std::span<const int32_t> tokens;       // [T] token ids
  int64_t start_pos = 0;                 // position of tokens[0]
  std::span<const int32_t> block_table;  // page ids; covers start_pos + T positions
  std::vector<int32_t> logits_rows;      // which tokens (0-based) need logits, in this order
  // Set (with exactly one logits row): the runner may sample that row itself and return the
  // token (ModelOutput::tokens) instead of its logits. A permission, not an order.
  std::optional<DeviceSampling> sample;
  std::vector<InputEmbedding> embeddings;  // empty unless ModelFeatures::input_embeddings
  // Attention data parallelism (ModelRunner::dp_groups() > 1): the group whose requests and KV
  // pool the slice belongs to; block_table's page ids are that group's. 0 otherwise.
  int32_t dp_group = 0;
};

struct ModelStep {
  std::vector<ModelSlice> slices;
  // Decoder layers (0-based) whose output hidden state is returned for every token of every
  // slice (ModelOutput::hidden). Empty unless ModelFeatures::hidden_capture.
  std::vector<int32_t> capture_layers;
};

struct ModelOutput {
  // logits[i]: [slices[i].logits_rows.size(), vocab] row-major, in the order asked; empty where
  // tokens[i] >= 0.
  std::vector<std::vector<float>> logits;
  // Empty, or one per slice: the token the runner sampled for that slice's row, else -1.
  std::vector<int32_t> tokens;
  // Empty, or one per slice: [capture_layers.size(), slices[i].tokens.size(), hidden_size].
  std::vector<std::vector<float>> hidden;
};

// The optional inputs a runner honours.
struct ModelFeatures {
  bool input_embeddings = false;  // ModelSlice::embeddings
  bool hidden_capture = false;    // ModelStep::capture_layers
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t hidden_size() const = 0;
  // KV pages the runner holds memory for (page ids 0 .. num_kv_pages() - 1), each page_size()
  // tokens of every layer's K, V and indexer keys. With attention data parallelism, per group:
  // every group has a pool of this many pages.
  virtual int32_t num_kv_pages() const = 0;
  virtual int32_t page_size() const = 0;
  virtual ModelFeatures features() const { return {}; }
  // Whether forward() may sample the rows it is offered (ModelSlice::sample) on its device.
  virtual bool samples_on_device() const { return false; }
  // Ranks the model is spread over (tensor / expert parallel); the engine drives rank 0's runner,
  // which keeps the others in step.
  virtual int32_t num_ranks() const { return 1; }
  // Attention data-parallel groups (--enable-dp-attention --dp D): each group of num_ranks()/D
  // ranks runs attention for its own requests over its own KV pool, and the MoE layers run over
  // all ranks. Every slice names its group (ModelSlice::dp_group). 1: no attention data
  // parallelism.
  virtual int32_t dp_groups() const { return 1; }

  // Runs one step. Slices are independent sequences: a row must not depend on the other slices
  // (batch invariance; exact on the CPU reference). Called from the engine thread only. A non-ok
  // Status fails the step's requests, not the process; the cache positions the step did not
  // write are left intact.
  virtual Status forward(const ModelStep& step, ModelOutput& out) = 0;

  // Whether the runner can run further steps. A runner spread over ranks whose group broke (a
  // rank died, a collective timed out) answers unavailable for good, naming the rank and the
  // cause; the engine then fails every request and stops (Engine::failure()). The engine asks
  // after a failed step only.
  virtual Status health() const { return Status::ok(); }

  // Copies whole KV pages between the runner's pool and host memory for the host and disk tiers
  // of the prefix cache (--enable-hierarchical-cache; kv/kv_page_copier.h). Null: the runner
  // cannot, and the engine refuses the hierarchical cache. Owned by the runner.
  virtual KvPageCopier* kv_page_copier() { return nullptr; }

  // The sequence with `block_table` keeps positions [0, new_length); the KV (and indexer keys) of
  // later positions are stale from now on. A paged cache that reads only positions below a
  // sequence's length needs no work (the default); a runner that keeps derived per-sequence state
  // must drop it here.
  virtual Status truncate(std::span<const int32_t> block_table, int64_t new_length) {
    (void)block_table;
    (void)new_length;
    return Status::ok();
  }
};

}  // namespace m3

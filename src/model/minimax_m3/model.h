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
#include "model/model.h"

namespace m3::minimax_m3 {

// A step's batch and output are the engine's model-neutral ones (model/model.h).
using SequenceInput = ModelSlice;
using ForwardOutput = ModelOutput;

class Model {
 public:
  // Loads weights (float32) onto `backend` (not owned; must outlive the model). With
  // tp.ranks > 1 this is rank tp.rank's part (tensor_parallel.h): config() is then the rank's
  // (its heads and widths, which its KV cache is made for), forward() all-reduces the partial
  // sums through tp.comm (and with tp.ep > 1 moves tokens to their experts by all-to-all,
  // expert_parallel_moe.h), and every rank must run the same steps. With tp.dp > 1 (attention
  // data parallelism) the rank runs attention for its group's slices only (ModelSlice::dp_group ==
  // tp.dp_rank()), all-reduced over tp.attn_comm, over its cache (its group's pool), and the
  // feed-forward blocks on every group's tokens over all ranks; forward() then returns logits and
  // captured hidden states for its group's slices only (the others' stay empty). The backend's
  // buffers must be host memory for the communicator (the CPU backend).
  static Result<std::unique_ptr<Model>> load(const MiniMaxM3Config& cfg, const WeightSource& src,
                                             Backend* backend, const ParallelLayout& tp = {});

  const MiniMaxM3Config& config() const { return cfg_; }
  Backend* backend() const { return backend_; }
  // The loaded weights (a draft model shares the embedding table and lm_head).
  const ModelWeights& weights() const { return w_; }

  // Runs one step over several sequences at once. Linear layers run on all tokens together;
  // attention runs per sequence. On the CPU backend a sequence's logits are bitwise independent
  // of the other sequences in the batch. Supplied input embeddings replace the token embedding
  // of their tokens; `capture_layers` returns the residual stream after those decoder layers
  // (out->hidden). Errors (bad token id, block table too short, empty input, a bad embedding or
  // layer index) leave the cache contents of untouched positions intact. The model never
  // samples: SequenceInput::sample is ignored and out->tokens stays empty.
  Status forward(std::span<const SequenceInput> batch, PagedKvCache* cache, ForwardOutput* out,
                 std::span<const int32_t> capture_layers = {});

 private:
  Model(const MiniMaxM3Config& cfg, Backend* backend, const ParallelLayout& tp)
      : cfg_(cfg), backend_(backend), tp_(tp) {}
  // Sums a rank's partial hidden states [n] over the ranks of `over` (nothing with one rank).
  Status all_reduce(float* partial, int64_t n, comm::Communicator* over);
  // Attention data parallelism: `all` [sum(tokens), hd] becomes every group's rows in group order,
  // from each group's `own` [tokens[g], hd] rows (this rank's group's: own_tokens of them). A
  // collective over all ranks, one all-gather.
  Status gather_groups(const float* own, int64_t own_tokens, std::span<const int64_t> tokens,
                       float* all);
  // The LM head split by vocabulary over the ranks (tensor_parallel.h): `logits` [nr, V] becomes
  // the logits of this rank's (its group's) normed rows `xr` [nr, hd], which are rows
  // [own_first_row, own_first_row + nr) of every group's (group_rows[g] each). A collective over
  // all ranks (with attention data parallelism two: the rows' gather and the logits').
  Status lm_head_split(const float* xr, int64_t nr, std::span<const int64_t> group_rows,
                       int64_t own_first_row, float* logits);

  MiniMaxM3Config cfg_;
  Backend* backend_;
  ParallelLayout tp_;
  ModelWeights w_;
};

}  // namespace m3::minimax_m3

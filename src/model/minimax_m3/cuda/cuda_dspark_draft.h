// The DSpark draft on the real-shape CUDA path (docs/dspark.md, "CUDA"; m3-architecture.md §5.2),
// next to a CudaM3Model target on the same GPU and stream:
//
//  * weights as stored: the attention and MLP linears MXFP8 (q|k|v and gate|up fused by rows at
//    load), fc, the norms and the Markov tables bf16; the target's embedding table, lm_head and
//    final norm are the target's own device buffers (CudaM3Model::dev_weights);
//  * append_context: the captured target hidden states fused on the host (build_context_features,
//    both capture conventions), rounded to bf16, c = hidden_norm(fc(features)), and per layer the
//    K|V rows of the fused q|k|v matrix on c, k_norm + RoPE and the bf16 cache write in one launch
//    (rope/attention_inputs.h);
//  * propose: the B-row block through the layers with the MXFP8 split-K GEMVs (quant_gemv.h, one
//    pass over the weights for all B rows; the bf16 lm_head through cuBLASLt), the fused q/k norm + RoPE, the windowed bidirectional block attention
//    (dspark/block_attention.h, bf16 variant), SwiGLU-OAI, the target's lm_head, then the
//    sequential Markov correction on the device (dspark/markov.h), one slot at a time: through
//    propose, each corrected row copied to the host for the engine's picker; through
//    propose_greedy, each slot's argmax taken on the device and read by the next slot's
//    correction there, the B tokens copied back once; propose_greedy_batch does that for several
//    sequences in one forward (all their n·B rows through each linear and the lm_head at once);
//  * the context K/V in bf16 pages: each sequence's state takes plan().pages_per_sequence pages
//    of every layer (one allocation from the draft's caching allocator) at its first use and
//    gives them back when it goes; DSparkContextCache's bookkeeping without storage decides
//    which block goes to which page and what the window releases.
//
// Contexts of more than kDSparkGemvRows new positions go through PrefillGemm (dequantise +
// cuBLASLt).
// Not thread-safe: the engine thread only, like the target.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/weight_source.h"
#include "model/draft_model.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/dspark_cuda_plan.h"
#include "model/minimax_m3/dspark/dspark_config.h"

namespace m3::minimax_m3 {

struct CudaDSparkOptions {
  // At most this many sequences hold draft context memory at once (0: as many as fit). A
  // sequence beyond it, or one whose context does not fit the device, fails its first step with
  // resource_exhausted.
  int64_t max_sequences = 0;
  int64_t page_size = 128;
  // Random weights generated on the GPU in the released formats (--load-format dummy).
  bool dummy_weights = false;
  uint64_t dummy_seed = 0;
  // Benchmarks on a slice of the target's layers: the draft config is resolved against this
  // (whole) target config instead of the loaded target's, whose hidden size and vocabulary must
  // equal it. The draft's capture_layers() then name layers the slice may not have.
  const MiniMaxM3Config* resolve_against = nullptr;
};

// One propose's outputs, for tests and benchmarks: the tokens, the Markov-corrected logits the
// picker saw and the lm_head's logits before the correction ([B, V] each).
struct CudaDSparkProposal {
  std::vector<int32_t> tokens;
  std::vector<float> logits, base_logits;
};

// Time of a propose's phases on the GPU's timeline (CUDA events between them), summed over the
// layers, for benchmarks: filled by every propose after set_phase_timing(true). The chain of the
// host-picker path includes its per-slot copies, synchronisations and the picker's host time.
struct CudaDSparkPhaseTimes {
  double upload_embed_ms = 0;  // ids, positions and block table to the device; the embedding
  double qkv_rope_ms = 0;      // input norm, the q|k|v GEMV, q/k norm + RoPE
  double attention_ms = 0;     // the block attention
  double o_mlp_ms = 0;         // o_proj, post norm, gate|up, SwiGLU, down
  double lm_head_ms = 0;       // final norm and the lm_head over the B slots (one GEMM)
  double chain_ms = 0;         // the Markov corrections and the slots' picks
  double total_ms() const {
    return upload_embed_ms + qkv_rope_ms + attention_ms + o_mlp_ms + lm_head_ms + chain_ms;
  }
};

class CudaDSparkDraft final : public DraftModel {
 public:
  // `cfg` is resolved against the target's config and checked by plan_dspark_cuda. `src` holds
  // the draft's tensors (unused with dummy_weights); `where` names it in messages. The target
  // must outlive the draft.
  static Result<std::unique_ptr<CudaDSparkDraft>> load(dspark::DSparkConfig cfg,
                                                       CudaM3Model* target,
                                                       const WeightSource* src,
                                                       const std::string& where,
                                                       const CudaDSparkOptions& options);
  ~CudaDSparkDraft() override;

  int32_t block_size() const override;
  std::vector<int32_t> capture_layers() const override;
  std::unique_ptr<DraftState> new_state() override;
  Status append_context(DraftState& state, std::span<const float> captured, int64_t n) override;
  Status truncate(DraftState& state, int64_t new_length) override;
  Status propose(DraftState& state, int32_t anchor, const DraftTokenPicker& pick,
                 std::vector<int32_t>* tokens) override;

  // propose with its logits (the base logits are copied back only here).
  Result<CudaDSparkProposal> propose_detail(DraftState& state, int32_t anchor,
                                            const DraftTokenPicker& pick);
  // propose with the greedy picker (the argmax of each slot's corrected logits, the lowest index
  // on ties) chosen on the device: no host round trip per slot, one copy of the B tokens at the
  // end. The same tokens as propose with a host argmax picker.
  Status propose_greedy(DraftState& state, int32_t anchor, std::vector<int32_t>* tokens) override;

  // propose_greedy of several sequences in one draft forward: every row-wise step (the linears,
  // the lm_head) runs once over all their blocks' rows, the attention in one launch over the
  // sequences, the Markov chain slot by slot for all of them; (*tokens)[i] is states[i]'s block. The same tokens as
  // propose_greedy per sequence up to rounding (the GEMMs may pick other kernels at more rows).
  Status propose_greedy_batch(std::span<DraftState* const> states,
                              std::span<const int32_t> anchors,
                              std::vector<std::vector<int32_t>>* tokens) override;
  // The same, with the corrected logits [n, B, V] copied back too (tests).
  Status propose_greedy_batch(std::span<DraftState* const> states,
                              std::span<const int32_t> anchors,
                              std::vector<std::vector<int32_t>>* tokens,
                              std::vector<float>* logits);

  // Phase timing of the following proposes (CUDA events; off by default).
  void set_phase_timing(bool on);
  const CudaDSparkPhaseTimes& last_phase_times() const;
  // Commits already fused features [n, feature_width] (build_context_features' layout).
  Status append_features(DraftState& state, std::span<const float> features, int64_t n);

  const dspark::DSparkConfig& config() const;
  const DSparkCudaPlan& plan() const;
  int64_t weight_bytes() const;

  struct Impl;

 private:
  CudaDSparkDraft() = default;
  // pick null: the device greedy chain (propose_greedy).
  Result<CudaDSparkProposal> run_propose(DraftState& state, int32_t anchor,
                                         const DraftTokenPicker* pick, bool base_logits);
  std::unique_ptr<Impl> impl_;
};

// Up to this many rows a draft linear is a split-K GEMV; above, PrefillGemm, except in a
// batched propose, which runs its MXFP8 linears in up to kDSparkBatchGemvPasses GEMV passes of
// kDSparkGemvRows rows (reading the weights once a pass beats dequantising them all for a GEMM;
// an estimate, not measured).
constexpr int64_t kDSparkGemvRows = 16;
constexpr int64_t kDSparkBatchGemvPasses = 4;

}  // namespace m3::minimax_m3

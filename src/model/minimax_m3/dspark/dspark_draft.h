// The DSpark draft forward in float32 (m3-architecture.md §5.2 steps 1-6), on the CPU backend:
//
//  append_context  (steps 1-2) fused target features -> c = hidden_norm(fc(features)); per draft
//                  layer K = RoPE(k_norm(W_k c)), V = W_v c (no input norm on c), into the
//                  sequence's DSparkContextCache.
//  propose         (steps 3-6) the query block [Embed(anchor), Embed(noise) x (B-1)] at positions
//                  p..p+B-1 through the pre-norm layers (sliding-window attention over the context
//                  plus the block, bidirectional inside it; dense SwiGLU-OAI MLP), final norm, the
//                  target's lm_head, then the sequential Markov correction
//                  logits_k = base_k + markov_w2 · markov_w1[prev], prev = anchor, then d_{k-1}.
//
// Linear layers, norms, RoPE, the MLP and the embedding lookups are the backend's ops (the same
// as the target's); the block attention is dspark_attention.h's host function on the CPU backend
// and the caller's BlockAttentionFn elsewhere (the CUDA backend's kernel). The draft keeps
// no state between calls: everything per sequence is in its DSparkContextCache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/dspark/dspark_attention.h"
#include "model/minimax_m3/dspark/dspark_config.h"
#include "model/minimax_m3/dspark/dspark_kv_cache.h"
#include "model/minimax_m3/dspark/dspark_weights.h"

namespace m3::minimax_m3::dspark {

// Picks slot `slot`'s draft token from its Markov-corrected logits [V]. The distribution it draws
// from (after temperature, top-k, ...) is the q of rejection sampling; the caller keeps it.
using DraftSampler = std::function<int32_t(std::span<const float> logits, int64_t slot)>;

// The lowest id among the largest logits.
int32_t greedy_token(std::span<const float> logits);

struct DSparkProposal {
  int64_t anchor_position = 0;     // p
  std::vector<int32_t> tokens;     // [B]: d_k drafts position p + k + 1
  std::vector<float> logits;       // [B, V] Markov-corrected (what the sampler saw)
  std::vector<float> base_logits;  // [B, V] lm_head output before the correction
};

class DSparkDraft {
 public:
  // `cfg` is checked against `target` (resolve_with_target); `where` names the weight source in
  // messages. The target's shared weights must live on `backend` and outlive the draft. On the
  // CPU backend the block attention is the host block_attention; any other backend needs
  // `attention` (its kernel on that backend's stream), else the load is refused.
  static Result<std::unique_ptr<DSparkDraft>> load(DSparkConfig cfg, const MiniMaxM3Config& target,
                                                   const WeightSource& src,
                                                   const std::string& where,
                                                   TargetSharedWeights target_weights,
                                                   Backend* backend,
                                                   BlockAttentionFn attention = {});

  const DSparkConfig& config() const { return cfg_; }
  const DSparkWeights& weights() const { return w_; }
  // A context cache for one sequence (pages of `page_size` positions).
  std::unique_ptr<DSparkContextCache> new_cache(
      int64_t page_size = DSparkContextCache::kDefaultPageSize) const;

  // Commits the target features [n, feature_width()] of positions [cache->length(),
  // cache->length() + n) (build_context_features' layout).
  Status append_context(std::span<const float> features, int64_t n, DSparkContextCache* cache);

  // Drafts the block for `anchor` at position p = cache.length(). Without a sampler, greedy.
  Result<DSparkProposal> propose(int32_t anchor, DSparkContextCache& cache,
                                 const DraftSampler& sampler = {});

 private:
  DSparkDraft(DSparkConfig cfg, Backend* backend) : cfg_(std::move(cfg)), backend_(backend) {}
  float eps() const { return static_cast<float>(cfg_.rms_norm_eps); }

  DSparkConfig cfg_;
  Backend* backend_;
  DSparkWeights w_;
  TargetSharedWeights target_;
  BlockAttentionFn attention_;  // empty: the host block_attention (CPU backend)
};

}  // namespace m3::minimax_m3::dspark

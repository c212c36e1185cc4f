#include "model/minimax_m3/dspark/dspark_draft.h"

#include <cmath>

#include "model/minimax_m3/dspark/dspark_attention.h"

namespace m3::minimax_m3::dspark {
namespace {

template <typename T>
DeviceBuffer<T> upload(Backend* be, const T* host, int64_t n) {
  DeviceBuffer<T> b(be, n);
  if (n > 0) be->copy_to_device(b.data(), host, n * static_cast<int64_t>(sizeof(T)));
  return b;
}

const std::string kWho = "[model.minimax_m3.dspark] ";

}  // namespace

int32_t greedy_token(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

Result<std::unique_ptr<DSparkDraft>> DSparkDraft::load(
    DSparkConfig cfg, const MiniMaxM3Config& target, const WeightSource& src,
    const std::string& where, TargetSharedWeights target_weights, Backend* backend,
    BlockAttentionFn attention) {
  if (backend->kind() != DeviceKind::kCpu && !attention)
    return unimplemented(kWho + "the DSpark draft on " + backend->name() +
                         " needs that backend's block attention kernel (none given)");
  M3_RETURN_IF_ERROR(cfg.resolve_with_target(target));
  if (target_weights.embed == nullptr || target_weights.lm_head == nullptr ||
      target_weights.final_norm == nullptr)
    return invalid_argument(kWho + "the target's embedding, lm_head and final norm are needed");
  std::unique_ptr<DSparkDraft> d(new DSparkDraft(std::move(cfg), backend));
  M3_ASSIGN_OR_RETURN(d->w_, load_dspark_weights(src, d->cfg_, backend, where));
  d->target_ = std::move(target_weights);
  if (backend->kind() != DeviceKind::kCpu) d->attention_ = std::move(attention);
  return d;
}

std::unique_ptr<DSparkContextCache> DSparkDraft::new_cache(int64_t page_size) const {
  return std::make_unique<DSparkContextCache>(backend_, cfg_, page_size);
}

Status DSparkDraft::append_context(std::span<const float> features, int64_t n,
                                   DSparkContextCache* cache) {
  const DSparkConfig& c = cfg_;
  Backend* be = backend_;
  const int64_t width = c.feature_width(), hd = c.hidden_size, d = c.head_dim,
                nkv = c.num_key_value_heads;
  if (n < 0 || static_cast<int64_t>(features.size()) != n * width)
    return invalid_argument(kWho + "append_context: " + std::to_string(features.size()) +
                            " feature values for " + std::to_string(n) + " tokens of width " +
                            std::to_string(width));
  const int64_t start = cache->length(), end = start + n;
  if (end > int64_t{INT32_MAX} - c.block_size)
    return invalid_argument(kWho + "append_context: position " + std::to_string(end) +
                            " is out of range");
  M3_RETURN_IF_ERROR(cache->prepare_append(end));
  // Positions the window of no later query can reach are neither computed nor stored.
  const int64_t first = std::max(start, cache->first_needed_position(end));
  const int64_t m = end - first;
  if (m > 0) {
    std::vector<int32_t> pos(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(first + i);
    auto pos_d = upload(be, pos.data(), m);
    auto feat = upload(be, features.data() + (first - start) * width, m * width);
    const std::vector<int32_t>& table = cache->block_table();
    auto table_d = upload(be, table.data(), static_cast<int64_t>(table.size()));
    DeviceBuffer<float> ctx(be, m * hd), k(be, m * nkv * d), v(be, m * nkv * d);
    // c = hidden_norm(fc(features)): one c per token feeds every layer.
    be->linear({feat.data(), w_.fc.data(), ctx.data(), m, hd, width, false});
    be->rms_norm({ctx.data(), w_.hidden_norm.data(), ctx.data(), m, hd, eps(), c.use_gemma_norm});
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const DSparkLayerWeights& lw = w_.layers[static_cast<size_t>(l)];
      // No input_layernorm on c (the trainers' context projection).
      be->linear({ctx.data(), lw.wk.data(), k.data(), m, nkv * d, hd, false});
      be->linear({ctx.data(), lw.wv.data(), v.data(), m, nkv * d, hd, false});
      be->rms_norm({k.data(), lw.k_norm.data(), k.data(), m * nkv, d, eps(), c.use_gemma_norm});
      be->rope({k.data(), pos_d.data(), m, nkv, d, c.rot_dim(), c.rot_dim(), c.theta()});
      be->kv_write({cache->layer(l), k.data(), v.data(), nullptr, pos_d.data(), table_d.data(), m,
                    static_cast<int64_t>(table.size())});
    }
    be->synchronize();
  }
  cache->set_length(end);
  return Status::ok();
}

Result<DSparkProposal> DSparkDraft::propose(int32_t anchor, DSparkContextCache& cache,
                                            const DraftSampler& sampler) {
  const DSparkConfig& c = cfg_;
  Backend* be = backend_;
  const int64_t b = c.block_size, hd = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, inter = c.intermediate_size, vocab = c.vocab_size,
                rank = c.markov_rank;
  if (anchor < 0 || anchor >= vocab)
    return invalid_argument(kWho + "anchor token " + std::to_string(anchor) +
                            " outside the vocabulary [0, " + std::to_string(vocab) + ")");
  const int64_t p = cache.length();
  if (p + b > int64_t{INT32_MAX})
    return invalid_argument(kWho + "anchor position " + std::to_string(p) + " is out of range");

  std::vector<int32_t> ids(static_cast<size_t>(b), static_cast<int32_t>(c.noise_token_id));
  ids[0] = anchor;
  std::vector<int32_t> pos(static_cast<size_t>(b));
  for (int64_t k = 0; k < b; ++k) pos[static_cast<size_t>(k)] = static_cast<int32_t>(p + k);
  auto ids_d = upload(be, ids.data(), b);
  auto pos_d = upload(be, pos.data(), b);
  DeviceBuffer<float> x(be, b * hd), h(be, b * hd), y(be, b * hd);
  DeviceBuffer<float> q(be, b * nh * d), k(be, b * nkv * d), v(be, b * nkv * d),
      attn(be, b * nh * d);
  DeviceBuffer<float> gate_up(be, b * 2 * inter), act(be, b * inter);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float alpha = static_cast<float>(c.swiglu_alpha),
              limit = static_cast<float>(c.swiglu_limit);
  const bool gemma = c.use_gemma_norm;

  // Slot 0: the anchor; slots 1..B-1: the noise token; embeddings from the target's table.
  be->embedding({target_.embed, ids_d.data(), x.data(), b, vocab, hd});
  const std::vector<int32_t>& table = cache.block_table();
  // The table in the backend's memory (for the CPU backend host memory, as block_attention reads).
  auto table_d = upload(be, table.data(), static_cast<int64_t>(table.size()));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const DSparkLayerWeights& lw = w_.layers[static_cast<size_t>(l)];
    be->rms_norm({x.data(), lw.input_norm.data(), h.data(), b, hd, eps(), gemma});
    be->linear({h.data(), lw.wq.data(), q.data(), b, nh * d, hd, false});
    be->linear({h.data(), lw.wk.data(), k.data(), b, nkv * d, hd, false});
    be->linear({h.data(), lw.wv.data(), v.data(), b, nkv * d, hd, false});
    be->rms_norm({q.data(), lw.q_norm.data(), q.data(), b * nh, d, eps(), gemma});
    be->rms_norm({k.data(), lw.k_norm.data(), k.data(), b * nkv, d, eps(), gemma});
    be->rope({q.data(), pos_d.data(), b, nh, d, c.rot_dim(), c.rot_dim(), c.theta()});
    be->rope({k.data(), pos_d.data(), b, nkv, d, c.rot_dim(), c.rot_dim(), c.theta()});
    // The block K/V are transient: they are attended to here and never stored.
    const BlockAttentionParams ap{q.data(), k.data(), v.data(), cache.layer(l), table_d.data(),
                                  static_cast<int64_t>(table.size()), p, b, nh, c.sliding_window,
                                  scale, attn.data()};
    if (attention_) {
      M3_RETURN_IF_ERROR(attention_(ap));
    } else {
      be->synchronize();  // host code reads what the ops wrote
      block_attention(ap);
    }
    be->linear({attn.data(), lw.wo.data(), y.data(), b, hd, nh * d, false});
    be->add({x.data(), y.data(), x.data(), b * hd});
    be->rms_norm({x.data(), lw.post_norm.data(), h.data(), b, hd, eps(), gemma});
    be->linear({h.data(), lw.mlp_w13.data(), gate_up.data(), b, 2 * inter, hd, false});
    be->swiglu_oai({gate_up.data(), act.data(), b, inter, alpha, limit});
    be->linear({act.data(), lw.mlp_w2.data(), y.data(), b, hd, inter, false});
    be->add({x.data(), y.data(), x.data(), b * hd});
  }
  be->rms_norm({x.data(), w_.final_norm.data(), h.data(), b, hd, eps(), gemma});
  DeviceBuffer<float> logits(be, b * vocab);
  be->linear({h.data(), target_.lm_head, logits.data(), b, vocab, hd, false});

  DSparkProposal out;
  out.anchor_position = p;
  out.base_logits.resize(static_cast<size_t>(b * vocab));
  be->synchronize();
  be->copy_to_host(out.base_logits.data(), logits.data(),
                   b * vocab * static_cast<int64_t>(sizeof(float)));
  // Sequential Markov correction: slot k's bias is markov_w2 · markov_w1[prev], where prev is the
  // anchor for slot 0 and the previous slot's draft after it, so each slot waits for the last.
  DeviceBuffer<int32_t> prev_d(be, 1);
  DeviceBuffer<float> w1_row(be, rank);
  out.logits.resize(out.base_logits.size());
  int32_t prev = anchor;
  for (int64_t s = 0; s < b; ++s) {
    be->copy_to_device(prev_d.data(), &prev, sizeof(int32_t));
    be->embedding({w_.markov_w1.data(), prev_d.data(), w1_row.data(), 1, vocab, rank});
    float* row = logits.data() + s * vocab;
    be->linear({w1_row.data(), w_.markov_w2.data(), row, 1, vocab, rank, /*accumulate=*/true});
    be->synchronize();
    float* host_row = out.logits.data() + s * vocab;
    be->copy_to_host(host_row, row, vocab * static_cast<int64_t>(sizeof(float)));
    const std::span<const float> view(host_row, static_cast<size_t>(vocab));
    const int32_t tok = sampler ? sampler(view, s) : greedy_token(view);
    if (tok < 0 || tok >= vocab)
      return invalid_argument(kWho + "the sampler returned token " + std::to_string(tok) +
                              " for slot " + std::to_string(s) + ", outside the vocabulary");
    out.tokens.push_back(tok);
    prev = tok;
  }
  return out;
}

}  // namespace m3::minimax_m3::dspark

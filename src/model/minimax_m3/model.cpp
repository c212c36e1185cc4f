#include "model/minimax_m3/model.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "model/minimax_m3/expert_parallel_moe.h"

namespace m3::minimax_m3 {
namespace {

template <typename T>
DeviceBuffer<T> upload(Backend* be, const std::vector<T>& host) {
  DeviceBuffer<T> b(be, static_cast<int64_t>(host.size()));
  // Empty for an attention group without slices in the step (no rows, null buffers).
  if (!host.empty())
    be->copy_to_device(b.data(), host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
  return b;
}

}  // namespace

Result<std::unique_ptr<Model>> Model::load(const MiniMaxM3Config& cfg, const WeightSource& src,
                                           Backend* backend, const ParallelLayout& tp) {
  if (tp.ranks > 1) {
    if (tp.comm == nullptr || tp.comm->size() != tp.ranks || tp.comm->rank() != tp.rank)
      return invalid_argument("[model.minimax_m3] tensor-parallel rank " +
                              std::to_string(tp.rank) + " of " + std::to_string(tp.ranks) +
                              " needs a communicator of that rank and size");
    if (backend->name().rfind("cpu", 0) != 0)
      return unimplemented("[model.minimax_m3] tensor parallelism of the float32 model runs on "
                           "CPU ranks only");
    if (tp.dp > 1 && tp.ranks % tp.dp == 0 && tp.attn_tp() > 1 &&
        (tp.attn_comm == nullptr || tp.attn_comm->size() != tp.attn_tp() ||
         tp.attn_comm->rank() != tp.attn_tp_rank()))
      return invalid_argument("[model.minimax_m3] rank " + std::to_string(tp.rank) + " of " +
                              std::to_string(tp.ranks) + " under --dp " + std::to_string(tp.dp) +
                              " needs an attention-group communicator of rank " +
                              std::to_string(tp.attn_tp_rank()) + " and size " +
                              std::to_string(tp.attn_tp()));
  }
  M3_RETURN_IF_ERROR(cfg.validate());
  if (cfg.rotary_dim <= 0 || cfg.rotary_dim % 2 != 0 || cfg.rotary_dim > cfg.head_dim)
    return invalid_argument("[model.minimax_m3] rotary_dim " + std::to_string(cfg.rotary_dim) +
                            " must be even, positive and <= head_dim " +
                            std::to_string(cfg.head_dim));
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    return invalid_argument("[model.minimax_m3] num_attention_heads must be a multiple of "
                            "num_key_value_heads");
  bool any_sparse = false;
  for (AttentionKind k : cfg.layer_types) any_sparse |= k == AttentionKind::kSparse;
  if (any_sparse) {
    // One index head per KV group (§3.3); the selection of index head h serves KV head h.
    if (cfg.index_n_heads != cfg.num_key_value_heads)
      return unimplemented("[model.minimax_m3] index_n_heads " +
                           std::to_string(cfg.index_n_heads) + " != num_key_value_heads " +
                           std::to_string(cfg.num_key_value_heads));
    if (cfg.index_topk_blocks <= 0 || cfg.index_block_size <= 0)
      return invalid_argument("[model.minimax_m3] index_topk_blocks and index_block_size must be "
                              "positive");
  }
  if (cfg.num_experts_per_tok > cfg.num_local_experts)
    return invalid_argument("[model.minimax_m3] num_experts_per_tok > num_local_experts");
  M3_RETURN_IF_ERROR(check_tensor_parallel(cfg, tp.ranks, tp.ep, tp.dp));
  const MiniMaxM3Config local =
      tp.ranks > 1 ? rank_config(cfg, tp.rank, tp.ranks, tp.ep, tp.dp) : cfg;
  std::unique_ptr<Model> m(new Model(local, backend, tp));
  M3_ASSIGN_OR_RETURN(m->w_, load_weights(src, cfg, backend, tp));
  return m;
}

Status Model::all_reduce(float* partial, int64_t n, comm::Communicator* over) {
  if (over == nullptr || over->size() <= 1) return Status::ok();
  backend_->synchronize();
  return over->all_reduce(partial, n, comm::DataType::kF32, comm::ReduceOp::kSum);
}

Status Model::gather_groups(const float* own, int64_t own_tokens, std::span<const int64_t> tokens,
                            float* all) {
  const int64_t hd = cfg_.hidden_size, attn_tp = tp_.attn_tp();
  int64_t most = 0;
  for (int64_t t : tokens) most = std::max(most, t);
  // Every rank of a group holds the group's rows; rank a of the group sends the a-th of attn_tp
  // chunks of them (zero-padded to the largest group's), so each group's rows arrive once, as
  // consecutive chunks of the gathered buffer.
  const int64_t chunk = (most + attn_tp - 1) / attn_tp;
  std::vector<float> send(static_cast<size_t>(chunk * hd), 0.0f);
  const int64_t first = tp_.attn_tp_rank() * chunk;
  const int64_t rows = std::clamp<int64_t>(own_tokens - first, 0, chunk);
  backend_->synchronize();
  if (rows > 0)
    backend_->copy_to_host(send.data(), own + first * hd,
                           rows * hd * static_cast<int64_t>(sizeof(float)));
  std::vector<float> recv(static_cast<size_t>(tp_.ranks * chunk * hd));
  M3_RETURN_IF_ERROR(tp_.comm->all_gather(send.data(), recv.data(), chunk * hd,
                                          comm::DataType::kF32));
  int64_t at = 0;
  for (size_t g = 0; g < tokens.size(); ++g) {
    const float* from = recv.data() + static_cast<int64_t>(g) * attn_tp * chunk * hd;
    if (tokens[g] > 0)
      backend_->copy_to_device(all + at * hd, from,
                               tokens[g] * hd * static_cast<int64_t>(sizeof(float)));
    at += tokens[g];
  }
  return Status::ok();
}

Status Model::lm_head_split(const float* xr, int64_t nr, std::span<const int64_t> group_rows,
                            int64_t own_first_row, float* logits) {
  const int64_t hd = cfg_.hidden_size, vocab = cfg_.vocab_size, ranks = tp_.ranks;
  const int64_t width = vocab_slice(vocab, 0, ranks).count;  // the widest slice (rank 0's)
  int64_t all_rows = 0;
  for (int64_t n : group_rows) all_rows += n;
  // The head's input: this rank's rows, or under attention data parallelism every group's (in
  // group order, as the feed-forward blocks' input), since every rank holds a slice of every row's
  // logits.
  DeviceBuffer<float> x_all;
  const float* in = xr;
  if (tp_.dp > 1) {
    x_all = DeviceBuffer<float>(backend_, all_rows * hd);
    M3_RETURN_IF_ERROR(gather_groups(xr, nr, group_rows, x_all.data()));
    in = x_all.data();
  }
  // This rank's vocabulary rows, read in place from a whole head (rank 0 with a draft).
  // (rank_slices()'s vocab_begin/vocab_count; cfg_ is the rank's config, whose vocabulary is the
  // model's.)
  const VocabSlice mine = vocab_slice(vocab, tp_.rank, ranks);
  const int64_t my_begin = mine.begin, my_count = mine.count;
  const float* head = w_.lm_head.data() + (my_begin - w_.lm_head_first_row) * hd;
  // Each rank's logits [all_rows, vocab_count] padded to [all_rows, width], so one all-gather of
  // equal counts carries the slices: the padding is at most one column a row, against an
  // all_to_all_v's per-rank counts and displacements for the same data (the ranks' counts differ
  // by one at most). The zero columns are dropped when the slices are put in vocabulary order.
  // Every logit is the unsharded head's dot product of the same row (the CPU linear fixes each
  // element's summation order), so the gathered logits equal the unsharded head's bit for bit.
  DeviceBuffer<float> part(backend_, all_rows * my_count);
  backend_->linear({in, head, part.data(), all_rows, my_count, hd, false});
  backend_->synchronize();
  std::vector<float> host(static_cast<size_t>(all_rows * my_count));
  backend_->copy_to_host(host.data(), part.data(),
                         static_cast<int64_t>(host.size() * sizeof(float)));
  std::vector<float> send(static_cast<size_t>(all_rows * width), 0.0f);
  for (int64_t i = 0; i < all_rows; ++i)
    std::copy_n(host.data() + i * my_count, my_count, send.data() + i * width);
  std::vector<float> recv(static_cast<size_t>(ranks * all_rows * width));
  M3_RETURN_IF_ERROR(tp_.comm->all_gather(send.data(), recv.data(), all_rows * width,
                                          comm::DataType::kF32));
  // This rank's (its group's) rows [own_first_row, own_first_row + nr) of the gathered logits.
  if (nr == 0) return Status::ok();
  std::vector<float> full(static_cast<size_t>(nr * vocab));
  for (int64_t q = 0; q < ranks; ++q) {
    const VocabSlice v = vocab_slice(vocab, q, ranks);
    const float* from = recv.data() + q * all_rows * width;
    for (int64_t i = 0; i < nr; ++i)
      std::copy_n(from + (own_first_row + i) * width, v.count, full.data() + i * vocab + v.begin);
  }
  backend_->copy_to_device(logits, full.data(), static_cast<int64_t>(full.size() * sizeof(float)));
  return Status::ok();
}

Status Model::forward(std::span<const SequenceInput> batch, PagedKvCache* cache,
                      ForwardOutput* out, std::span<const int32_t> capture_layers) {
  const MiniMaxM3Config& c = cfg_;
  Backend* be = backend_;
  const int64_t hd = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, nix = c.index_n_heads, dix = c.index_head_dim,
                vocab = c.vocab_size, page = cache->page_size();
  if (page != c.index_block_size)
    return invalid_argument("[model.minimax_m3.forward] cache page size " + std::to_string(page) +
                            " != index_block_size " + std::to_string(c.index_block_size));

  // ---- Validate the whole batch and flatten this rank's slices: all of them, or with attention
  // data parallelism its group's. Every rank validates every slice, so a bad slice fails all
  // ranks before the first collective.
  const bool dp_attention = tp_.dp > 1;
  const int my_group = dp_attention ? tp_.dp_rank() : 0;
  std::vector<int64_t> group_tokens(static_cast<size_t>(std::max(tp_.dp, 1)), 0);
  std::vector<size_t> mine;  // the batch indices of this rank's slices
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> offsets = {0};
  std::vector<DeviceBuffer<int32_t>> tables;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    const std::string who = "[model.minimax_m3.forward] sequence " + std::to_string(s) + ": ";
    if (in.tokens.empty()) return invalid_argument(who + "no tokens");
    if (in.dp_group < 0 || in.dp_group >= std::max(tp_.dp, 1))
      return invalid_argument(who + "dp_group " + std::to_string(in.dp_group) + " outside [0, " +
                              std::to_string(std::max(tp_.dp, 1)) + ") (--dp " +
                              std::to_string(std::max(tp_.dp, 1)) + ")");
    group_tokens[static_cast<size_t>(in.dp_group)] += static_cast<int64_t>(in.tokens.size());
    if (in.start_pos < 0) return invalid_argument(who + "negative start_pos");
    int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    int64_t need = (end + page - 1) / page;
    if (static_cast<int64_t>(in.block_table.size()) < need)
      return invalid_argument(who + "block table has " + std::to_string(in.block_table.size()) +
                              " pages, positions up to " + std::to_string(end - 1) + " need " +
                              std::to_string(need));
    for (int32_t pg : in.block_table)
      if (pg < 0 || pg >= cache->num_pages())
        return invalid_argument(who + "page id " + std::to_string(pg) + " outside the cache (" +
                                std::to_string(cache->num_pages()) + " pages)");
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= vocab)
        return invalid_argument(who + "token id " + std::to_string(in.tokens[i]) +
                                " outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    for (int32_t r : in.logits_rows)
      if (r < 0 || r >= static_cast<int32_t>(in.tokens.size()))
        return invalid_argument(who + "logits row " + std::to_string(r) + " out of range");
    for (const InputEmbedding& e : in.embeddings) {
      if (e.token_index < 0 || e.token_index >= static_cast<int32_t>(in.tokens.size()))
        return invalid_argument(who + "input embedding for token " +
                                std::to_string(e.token_index) + " out of range");
      if (static_cast<int64_t>(e.values.size()) != hd)
        return invalid_argument(who + "input embedding of " + std::to_string(e.values.size()) +
                                " values; the hidden size is " + std::to_string(hd));
    }
    if (in.dp_group != my_group) continue;  // another attention group's slice
    mine.push_back(s);
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      ids.push_back(in.tokens[i]);
      positions.push_back(static_cast<int32_t>(in.start_pos + static_cast<int64_t>(i)));
    }
    offsets.push_back(static_cast<int64_t>(ids.size()));
    tables.push_back(upload(be, std::vector<int32_t>(in.block_table.begin(), in.block_table.end())));
  }
  // t_all: this rank's (its group's) tokens; t_ffn: the tokens the feed-forward blocks run on,
  // every group's under attention data parallelism. A group without slices has t_all = 0 and
  // still takes part in every collective over all ranks.
  const int64_t t_all = static_cast<int64_t>(ids.size());
  int64_t t_ffn = 0, own_first = 0;
  for (size_t g = 0; g < group_tokens.size(); ++g) {
    if (static_cast<int>(g) < my_group) own_first += group_tokens[g];
    t_ffn += group_tokens[g];
  }
  if (t_ffn == 0) return invalid_argument("[model.minimax_m3.forward] empty batch");
  std::vector<bool> capture(static_cast<size_t>(c.num_hidden_layers), false);
  for (int32_t layer : capture_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers)
      return invalid_argument("[model.minimax_m3.forward] capture layer " +
                              std::to_string(layer) + " outside [0, " +
                              std::to_string(c.num_hidden_layers) + ")");
    capture[static_cast<size_t>(layer)] = true;
  }
  out->hidden.assign(capture_layers.empty() ? 0 : batch.size(), {});
  comm::Communicator* attention_comm = dp_attention ? tp_.attn_comm : tp_.comm;

  // ---- Device scratch.
  auto ids_d = upload(be, ids), pos_d = upload(be, positions);
  DeviceBuffer<float> x(be, t_all * hd), h(be, t_all * hd), y(be, t_all * hd);
  DeviceBuffer<float> q(be, t_all * nh * d), k(be, t_all * nkv * d), v(be, t_all * nkv * d);
  DeviceBuffer<float> attn(be, t_all * nh * d);
  DeviceBuffer<float> iq, ik;
  DeviceBuffer<int32_t> sel;
  const int64_t topk = c.index_topk_blocks;
  if (nix > 0 && dix > 0) {
    iq = DeviceBuffer<float>(be, t_all * nix * dix);
    ik = DeviceBuffer<float>(be, t_all * dix);
    sel = DeviceBuffer<int32_t>(be, t_all * nix * topk);
  }
  int64_t max_inter = c.dense_intermediate_size;
  max_inter = std::max(max_inter, c.shared_intermediate_size * c.n_shared_experts);
  DeviceBuffer<float> gate_up(be, t_ffn * 2 * max_inter), act(be, t_ffn * max_inter);
  DeviceBuffer<float> router_logits(be, t_ffn * c.num_local_experts), shared(be, t_ffn * hd);
  DeviceBuffer<int32_t> topk_ids(be, t_ffn * c.num_experts_per_tok);
  DeviceBuffer<float> topk_w(be, t_ffn * c.num_experts_per_tok);
  // Attention data parallelism: every group's normed hidden states and feed-forward output.
  DeviceBuffer<float> h_ffn, y_ffn;
  DeviceBuffer<int32_t> own_rows_d;  // this group's rows of y_ffn
  if (dp_attention) {
    h_ffn = DeviceBuffer<float>(be, t_ffn * hd);
    y_ffn = DeviceBuffer<float>(be, t_ffn * hd);
    std::vector<int32_t> own_rows(static_cast<size_t>(t_all));
    for (int64_t i = 0; i < t_all; ++i) own_rows[i] = static_cast<int32_t>(own_first + i);
    own_rows_d = upload(be, own_rows);
  }
  float* ffn_in = dp_attention ? h_ffn.data() : h.data();
  float* ffn_out = dp_attention ? y_ffn.data() : y.data();

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float alpha = static_cast<float>(c.swiglu_alpha), limit = static_cast<float>(c.swiglu_limit);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto dense_mlp = [&](const float* in, const DeviceBuffer<float>& w13,
                       const DeviceBuffer<float>& w2, int64_t inter, float* dst) {
    be->linear({in, w13.data(), gate_up.data(), t_ffn, 2 * inter, hd, false});
    be->swiglu_oai({gate_up.data(), act.data(), t_ffn, inter, alpha, limit});
    be->linear({act.data(), w2.data(), dst, t_ffn, hd, inter, false});
  };

  if (t_all > 0) be->embedding({w_.embed.data(), ids_d.data(), x.data(), t_all, vocab, hd});
  for (size_t j = 0; j < mine.size(); ++j) {
    for (const InputEmbedding& e : batch[mine[j]].embeddings) {
      be->copy_to_device(x.data() + (offsets[j] + e.token_index) * hd, e.values.data(),
                         hd * static_cast<int64_t>(sizeof(float)));
    }
  }
  // Each captured layer's rows in capture_layers order: hidden[s] is [layers, tokens, hd].
  auto capture_after = [&](int64_t li) {
    for (size_t k = 0; k < capture_layers.size(); ++k) {
      if (capture_layers[k] != li) continue;
      be->synchronize();
      for (size_t j = 0; j < mine.size(); ++j) {
        const int64_t n = offsets[j + 1] - offsets[j];
        std::vector<float>& dst = out->hidden[mine[j]];
        dst.resize(capture_layers.size() * static_cast<size_t>(n * hd));
        be->copy_to_host(dst.data() + k * static_cast<size_t>(n * hd), x.data() + offsets[j] * hd,
                         n * hd * static_cast<int64_t>(sizeof(float)));
      }
    }
  };
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const LayerWeights& lw = w_.layers[li];
    KvLayerView kv = cache->layer(li);

    // Attention block: h = norm(x); q/k/v; per-head QK-norm, then partial RoPE (§2.3). Under
    // attention data parallelism only over this group's slices, all-reduced within the group (a
    // group without slices skips it, all its ranks alike).
    if (t_all > 0) {
      be->rms_norm({x.data(), lw.input_norm.data(), h.data(), t_all, hd, eps, true});
      be->linear({h.data(), lw.wq.data(), q.data(), t_all, nh * d, hd, false});
      be->linear({h.data(), lw.wk.data(), k.data(), t_all, nkv * d, hd, false});
      be->linear({h.data(), lw.wv.data(), v.data(), t_all, nkv * d, hd, false});
      be->rms_norm({q.data(), lw.q_norm.data(), q.data(), t_all * nh, d, eps, true});
      be->rms_norm({k.data(), lw.k_norm.data(), k.data(), t_all * nkv, d, eps, true});
      be->rope({q.data(), pos_d.data(), t_all, nh, d, c.rotary_dim, c.rotary_dim, c.rope_theta});
      be->rope({k.data(), pos_d.data(), t_all, nkv, d, c.rotary_dim, c.rotary_dim, c.rope_theta});
      if (lw.sparse) {
        // Indexer (§3.2): same h, Gemma norms per head, the same RoPE table truncated to Dix.
        be->linear({h.data(), lw.wiq.data(), iq.data(), t_all, nix * dix, hd, false});
        be->linear({h.data(), lw.wik.data(), ik.data(), t_all, dix, hd, false});
        be->rms_norm({iq.data(), lw.iq_norm.data(), iq.data(), t_all * nix, dix, eps, true});
        be->rms_norm({ik.data(), lw.ik_norm.data(), ik.data(), t_all, dix, eps, true});
        int64_t w = std::min(c.rotary_dim, dix);
        be->rope({iq.data(), pos_d.data(), t_all, nix, dix, c.rotary_dim, w, c.rope_theta});
        be->rope({ik.data(), pos_d.data(), t_all, 1, dix, c.rotary_dim, w, c.rope_theta});
      }
      for (size_t j = 0; j < mine.size(); ++j) {
        const int64_t o = offsets[j], n = offsets[j + 1] - offsets[j];
        const int64_t nb = static_cast<int64_t>(batch[mine[j]].block_table.size());
        const int32_t* table = tables[j].data();
        be->kv_write({kv, k.data() + o * nkv * d, v.data() + o * nkv * d,
                      lw.sparse ? ik.data() + o * dix : nullptr, pos_d.data() + o, table, n, nb});
        const int32_t* selected = nullptr;
        if (lw.sparse) {
          be->indexer_topk({iq.data() + o * nix * dix, kv, pos_d.data() + o, table,
                            sel.data() + o * nix * topk, n, nix, nb, topk, c.index_local_blocks,
                            c.index_init_blocks});
          selected = sel.data() + o * nix * topk;
        }
        be->paged_attention({q.data() + o * nh * d, kv, pos_d.data() + o, table, selected,
                             attn.data() + o * nh * d, n, nh, nb, nix, topk, scale});
      }
      be->linear({attn.data(), lw.wo.data(), y.data(), t_all, hd, nh * d, false});
      M3_RETURN_IF_ERROR(all_reduce(y.data(), t_all * hd, attention_comm));
      be->add({x.data(), y.data(), x.data(), t_all * hd});
    }

    // Feed-forward block (§2.4-§2.5), split over all ranks. Under attention data parallelism it
    // runs on every group's tokens (gathered in group order), and each rank keeps its group's
    // rows of the all-reduced output.
    if (t_all > 0) be->rms_norm({x.data(), lw.post_norm.data(), h.data(), t_all, hd, eps, true});
    if (dp_attention) M3_RETURN_IF_ERROR(gather_groups(h.data(), t_all, group_tokens, ffn_in));
    if (!lw.moe) {
      dense_mlp(ffn_in, lw.mlp_w13, lw.mlp_w2, c.dense_intermediate_size, ffn_out);
    } else {
      const int64_t ne = c.num_local_experts, kk = c.num_experts_per_tok;
      const float scaling = static_cast<float>(c.routed_scaling_factor);
      if (tp_.ep > 1) {
        // Experts placed over the expert-parallel ranks: tokens go to them by all-to-all.
        M3_RETURN_IF_ERROR(expert_parallel_moe(
            be, tp_, {ffn_in, lw.router.data(), lw.router_bias.data(),
                      lw.expert_w13_ptrs.data(), lw.expert_w2_ptrs.data(), ffn_out, t_ffn, hd,
                      c.intermediate_size, ne, kk, scaling, alpha, limit}));
      } else {
        be->linear({ffn_in, lw.router.data(), router_logits.data(), t_ffn, ne, hd, false});
        be->router_topk({router_logits.data(), lw.router_bias.data(), topk_ids.data(),
                         topk_w.data(), t_ffn, ne, kk, scaling});
        be->moe_experts({ffn_in, lw.expert_w13_ptrs.data(), lw.expert_w2_ptrs.data(),
                         topk_ids.data(), topk_w.data(), ffn_out, t_ffn, hd,
                         c.intermediate_size, ne, kk, alpha, limit});
      }
      if (lw.shared_inter > 0) {
        // The shared expert is always on and unscaled; HF adds it after the routed sum.
        dense_mlp(ffn_in, lw.shared_w13, lw.shared_w2, lw.shared_inter, shared.data());
        be->add({ffn_out, shared.data(), ffn_out, t_ffn * hd});
      }
    }
    M3_RETURN_IF_ERROR(all_reduce(ffn_out, t_ffn * hd, tp_.comm));
    if (dp_attention && t_all > 0) {
      be->gather_rows({ffn_out, own_rows_d.data(), y.data(), t_all, hd});
    }
    if (t_all > 0) be->add({x.data(), y.data(), x.data(), t_all * hd});
    if (capture[static_cast<size_t>(li)]) capture_after(li);
  }

  // ---- Final norm and LM head, only on the rows that need logits.
  std::vector<int32_t> rows;
  for (size_t j = 0; j < mine.size(); ++j)
    for (int32_t r : batch[mine[j]].logits_rows)
      rows.push_back(static_cast<int32_t>(offsets[j] + r));
  out->logits.assign(batch.size(), {});
  out->tokens.clear();  // this model never samples (SequenceInput::sample is a permission)
  // Every group's logits rows (every rank sees the whole batch): with the head split over ranks,
  // all ranks take part in its collectives when any group has rows.
  std::vector<int64_t> group_rows(static_cast<size_t>(std::max(tp_.dp, 1)), 0);
  int64_t all_rows = 0, own_first_row = 0;
  for (const SequenceInput& in : batch) {
    const int64_t n = static_cast<int64_t>(in.logits_rows.size());
    group_rows[static_cast<size_t>(in.dp_group)] += n;
    if (in.dp_group < my_group) own_first_row += n;
    all_rows += n;
  }
  const bool split_head = tp_.ranks > 1;
  if (split_head ? all_rows == 0 : rows.empty()) return Status::ok();
  const int64_t nr = static_cast<int64_t>(rows.size());
  DeviceBuffer<float> xr(be, nr * hd), logits(be, nr * vocab);
  if (nr > 0) {
    auto rows_d = upload(be, rows);
    be->gather_rows({x.data(), rows_d.data(), xr.data(), nr, hd});
    be->rms_norm({xr.data(), w_.final_norm.data(), xr.data(), nr, hd, eps, true});
  }
  if (!split_head) {
    be->linear({xr.data(), w_.lm_head.data(), logits.data(), nr, vocab, hd, false});
  } else {
    M3_RETURN_IF_ERROR(lm_head_split(xr.data(), nr, group_rows, own_first_row, logits.data()));
  }
  be->synchronize();
  int64_t r0 = 0;
  for (size_t s : mine) {
    int64_t n = static_cast<int64_t>(batch[s].logits_rows.size());
    out->logits[s].resize(static_cast<size_t>(n * vocab));
    be->copy_to_host(out->logits[s].data(), logits.data() + r0 * vocab,
                     n * vocab * static_cast<int64_t>(sizeof(float)));
    r0 += n;
  }
  return Status::ok();
}

}  // namespace m3::minimax_m3

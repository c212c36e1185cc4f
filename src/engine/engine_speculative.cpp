// Speculative decoding in the engine (docs/dspark.md, "Engine"): proposals before planning, the
// draft's context after each step, and verification of the slices [anchor, d_1..d_k].
#include <algorithm>
#include <string>

#include "engine/engine.h"
#include "engine/engine_contexts.h"
#include "sample/sampling_params.h"

namespace m3 {

namespace {

// Random streams of speculative decoding, above every sequence index (the ordinary sampler's
// streams), so no uniform is shared with ordinary sampling or between the three uses.
constexpr uint64_t kDraftStream = 1ull << 32;
constexpr uint64_t kAcceptStream = 2ull << 32;
constexpr uint64_t kResidualStream = 3ull << 32;
// Slots per verify round in a key's counter: (round, slot) -> round * kMaxSlots + slot.
constexpr uint64_t kMaxSlots = 1ull << 16;

}  // namespace

Status Engine::enable_speculative(std::unique_ptr<DraftModel> draft, SpeculativeOptions options) {
  if (started_) return internal_error("[engine] enable_speculative after start()");
  if (!draft) return invalid_argument("[engine] no draft model");
  const int32_t B = draft->block_size();
  if (B < 1 || B >= static_cast<int32_t>(kMaxSlots)) {
    return invalid_argument("[engine] the draft's block size " + std::to_string(B) +
                            " is outside [1, " + std::to_string(kMaxSlots - 1) + "]");
  }
  if (options.num_draft_tokens < 2 || options.num_draft_tokens > B + 1) {
    return invalid_argument(
        "--speculative-num-draft-tokens " + std::to_string(options.num_draft_tokens) +
        ": must be between 2 and the draft's block size + 1 = " + std::to_string(B + 1));
  }
  if (options.simulate_accept_length < 0 ||
      options.simulate_accept_length > options.num_draft_tokens) {
    return invalid_argument("--speculative-simulate-accept-length " +
                            std::to_string(options.simulate_accept_length) +
                            ": must be between 1 and --speculative-num-draft-tokens " +
                            std::to_string(options.num_draft_tokens));
  }
  if (!runner_->features().hidden_capture) {
    return invalid_argument(
        "--speculative-algorithm: this model runner does not return hidden states for a draft");
  }
  draft_capture_layers_ = draft->capture_layers();
  if (draft_capture_layers_.empty()) return invalid_argument("[engine] the draft reads no layers");
  draft_ = std::move(draft);
  spec_ = options;
  if (config_.scheduler.enable_prefix_cache) {
    for (int32_t g = 0; g < sched_->num_dp_groups(); ++g) {
      draft_features_.push_back(std::make_unique<DraftFeatureStore>(
          static_cast<int32_t>(draft_capture_layers_.size()), runner_->hidden_size(),
          config_.scheduler.page_size, sched_->pool(g).num_pages()));
    }
    // A speculative sequence uses the cached pages whose draft features are kept; the target
    // computes the rest again (and so captures their features).
    sched_->set_prefix_match_limit(
        [this](const SequenceState& seq, std::span<const PageId> matched) -> int32_t {
          auto owner = seq_owner_.find(seq.id);
          if (owner == seq_owner_.end() || !owner->second.first->speculative) {
            return static_cast<int32_t>(matched.size());
          }
          return features_of(seq).covered_prefix(matched);
        });
    sched_->set_page_dedup_hook([this](int32_t dp_group, PageId kept, PageId dropped,
                                       int32_t index) {
      draft_features_[static_cast<size_t>(dp_group)]->adopt(kept, dropped, index);
    });
  }
  spec_accept_length_counts_.assign(static_cast<size_t>(options.num_draft_tokens) + 1, 0);
  publish_stats();
  return Status::ok();
}

RngKey Engine::spec_key(const ReqCtx& req, const SeqCtx& seq, uint64_t kind, uint64_t slot) {
  return RngKey{req.seed, kind | static_cast<uint64_t>(seq.index),
                seq.spec_round * kMaxSlots + slot};
}

void Engine::propose_drafts() {
  std::vector<std::pair<RequestId, Status>> failed;
  // Greedy sequences that need a proposal get one propose_greedy_batch after the loop (a GPU
  // draft runs their blocks in one forward).
  struct Pending {
    ReqCtx* req;
    SeqCtx* seq;
    int64_t pos;
    int32_t anchor, num_drafts;
  };
  std::vector<Pending> greedy;
  for (auto& [id, owner] : seq_owner_) {
    ReqCtx* req = owner.first;
    SeqCtx* seq = owner.second;
    if (!req->speculative || seq->finished || !seq->draft) continue;
    const SequenceState* st = sched_->find(seq->id);
    // Only a decoding sequence whose draft holds every committed position: its next slice is the
    // anchor alone. Otherwise it decodes (or prefills) without a draft, which feeds the context.
    if (!st || st->phase != SeqPhase::kDecoding ||
        st->num_computed_tokens != st->num_tokens() - 1 ||
        seq->draft->length() != st->num_computed_tokens) {
      continue;
    }
    // No draft may run past max_tokens: the target's token after k drafts is the (k+1)-th.
    const int32_t num_drafts =
        std::min(spec_.num_draft_tokens - 1, req->max_tokens - seq->generated - 1);
    if (num_drafts <= 0) continue;
    const int64_t pos = st->num_computed_tokens;
    if (seq->proposal_pos != pos) {
      if (req->draft_params.temperature < kGreedyTemperature) {
        greedy.push_back({req, seq, pos, st->tokens.back(), num_drafts});
        continue;
      }
      Status s = propose_for(req, seq, pos, st->tokens.back(), num_drafts);
      if (!s.is_ok()) {
        failed.emplace_back(req->id, s);
        continue;
      }
    }
    sched_->set_draft(seq->id, seq->proposal);
  }
  if (!greedy.empty()) {
    std::vector<DraftState*> states;
    std::vector<int32_t> anchors;
    for (const Pending& g : greedy) {
      states.push_back(g.seq->draft.get());
      anchors.push_back(g.anchor);
    }
    std::vector<std::vector<int32_t>> tokens;
    const bool batched = draft_->propose_greedy_batch(states, anchors, &tokens).is_ok() &&
                         tokens.size() == greedy.size();
    for (size_t i = 0; i < greedy.size(); ++i) {
      const Pending& g = greedy[i];
      // A failed batch (e.g. one sequence's context found no memory) is retried one sequence at
      // a time, so only the sequences that fail on their own fail.
      Status s = batched ? set_proposal(g.seq, g.pos, g.num_drafts, std::move(tokens[i]), true)
                         : propose_for(g.req, g.seq, g.pos, g.anchor, g.num_drafts);
      if (!s.is_ok()) {
        failed.emplace_back(g.req->id, s);
        continue;
      }
      sched_->set_draft(g.seq->id, g.seq->proposal);
    }
  }
  for (auto& [id, why] : failed) cancel_request(id, FinishReason::kError, why);
}

Status Engine::propose_for(ReqCtx* req, SeqCtx* seq, int64_t anchor_pos, int32_t anchor,
                           int32_t num_drafts) {
  seq->proposal.clear();
  seq->proposal_q.assign(static_cast<size_t>(num_drafts), {});
  SamplerScratch scratch;
  // q_k is exactly the distribution d_k is drawn from: the request's temperature, top-k, top-p
  // and min-p over the draft's logits (greedy: the argmax), with its own random stream.
  auto pick = [&](std::span<const float> logits, int64_t slot) -> int32_t {
    if (slot >= num_drafts) return 0;  // beyond the verified drafts: never read
    if (static_cast<int32_t>(logits.size()) != vocab_size_) return -1;
    SampleInput in;
    in.logits = logits;
    in.params = &req->draft_params;
    std::vector<double>& q = seq->proposal_q[static_cast<size_t>(slot)];
    sampling_distribution(in, &scratch, &q);
    double total = 0.0;
    for (double v : q) total += v;
    const double u = uniform01(spec_key(*req, *seq, kDraftStream, static_cast<uint64_t>(slot)));
    return draw_from_mass(q, total, u);
  };
  std::vector<int32_t> tokens;
  // Greedy drafting (the draft params carry no logit processors, so it is the plain argmax) goes
  // through propose_greedy, which a GPU draft runs without copying each slot's logits back.
  const bool greedy = req->draft_params.temperature < kGreedyTemperature;
  if (greedy) {
    M3_RETURN_IF_ERROR(draft_->propose_greedy(*seq->draft, anchor, &tokens));
  } else {
    M3_RETURN_IF_ERROR(draft_->propose(*seq->draft, anchor, pick, &tokens));
  }
  return set_proposal(seq, anchor_pos, num_drafts, std::move(tokens), greedy);
}

Status Engine::set_proposal(SeqCtx* seq, int64_t anchor_pos, int32_t num_drafts,
                            std::vector<int32_t> tokens, bool greedy) {
  if (static_cast<int32_t>(tokens.size()) < num_drafts) {
    return internal_error("[engine] the draft proposed " + std::to_string(tokens.size()) +
                          " tokens, " + std::to_string(num_drafts) + " wanted");
  }
  for (int32_t k = 0; k < num_drafts; ++k) {
    if (tokens[k] < 0 || tokens[k] >= vocab_size_) {
      return internal_error("[engine] draft token " + std::to_string(tokens[k]) +
                            " outside the vocabulary");
    }
  }
  tokens.resize(static_cast<size_t>(num_drafts));
  if (greedy) {
    // q_k one-hot at the drafted token, as sampling_distribution gives for greedy.
    seq->proposal_q.assign(static_cast<size_t>(num_drafts), {});
    for (int32_t k = 0; k < num_drafts; ++k) {
      std::vector<double>& q = seq->proposal_q[static_cast<size_t>(k)];
      q.assign(static_cast<size_t>(vocab_size_), 0.0);
      q[static_cast<size_t>(tokens[k])] = 1.0;
    }
  }
  seq->proposal = std::move(tokens);
  seq->proposal_pos = anchor_pos;
  return Status::ok();
}

Status Engine::rebuild_draft_context(SeqCtx* seq, int64_t pos) {
  if (!seq->draft || pos < seq->draft->length()) {
    // A prefill from the start or from a prefix-cache hit (first admission or after preemption),
    // or a rollback: keep what the draft holds below `pos` if it can roll back, else start over.
    const bool kept = seq->draft && pos > 0 && draft_->truncate(*seq->draft, pos).is_ok();
    if (!kept) seq->draft = draft_->new_state();
    seq->proposal.clear();
    seq->proposal_pos = -1;
  }
  const int64_t have = seq->draft->length();
  if (pos == have) return Status::ok();
  // Positions [have, pos) came from the prefix cache: their features are in the store (the
  // scheduler matched only pages the store covers), in whole pages from position 0.
  const SequenceState* st = sched_->find(seq->id);
  const int64_t P = config_.scheduler.page_size;
  if (draft_features_.empty() || !st || pos % P != 0 ||
      features_of(*st).covered_prefix(st->pages) < pos / P) {
    return internal_error("[engine] the draft's context ends at " + std::to_string(have) +
                          "; the step computed position " + std::to_string(pos) +
                          " and the draft features of the positions between are not kept");
  }
  const std::vector<float> all = features_of(*st).read(st->pages, pos / P);
  // [L, pos, hd] -> [L, pos - have, hd]
  const size_t L = draft_capture_layers_.size();
  const size_t hd = static_cast<size_t>(runner_->hidden_size());
  const size_t n = static_cast<size_t>(pos - have);
  std::vector<float> rows(L * n * hd);
  for (size_t l = 0; l < L; ++l) {
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>((l * static_cast<size_t>(pos) +
                                                           static_cast<size_t>(have)) * hd),
                n * hd, rows.begin() + static_cast<std::ptrdiff_t>(l * n * hd));
  }
  return draft_->append_context(*seq->draft, rows, static_cast<int64_t>(n));
}

Status Engine::append_draft_context(SeqCtx* seq, const ModelOutput& out, size_t slice,
                                    int64_t start_pos, int32_t first_token, int32_t num_tokens) {
  const int64_t pos = start_pos + first_token;
  if (slice >= out.hidden.size()) return internal_error("[engine] no hidden states captured");
  const std::vector<float>& h = out.hidden[slice];
  const size_t L = draft_capture_layers_.size();
  const size_t hd = static_cast<size_t>(runner_->hidden_size());
  if (h.size() % (L * hd) != 0) {
    return internal_error("[engine] captured hidden states of " + std::to_string(h.size()) +
                          " values");
  }
  const size_t T = h.size() / (L * hd);
  if (static_cast<size_t>(first_token + num_tokens) > T) {
    return internal_error("[engine] captured " + std::to_string(T) + " tokens, " +
                          std::to_string(first_token + num_tokens) + " needed");
  }
  // The committed positions' features go with their pages, for later prefix-cache hits.
  if (!draft_features_.empty()) {
    if (const SequenceState* st = sched_->find(seq->id)) {
      features_of(*st).write(st->pages, pos, num_tokens, h, static_cast<int64_t>(T), first_token);
    }
  }
  M3_RETURN_IF_ERROR(rebuild_draft_context(seq, pos));
  // [L, T, hd] -> [L, num_tokens, hd] of tokens [first_token, first_token + num_tokens).
  std::vector<float> rows(L * static_cast<size_t>(num_tokens) * hd);
  for (size_t l = 0; l < L; ++l) {
    std::copy_n(h.begin() + static_cast<std::ptrdiff_t>((l * T + first_token) * hd),
                static_cast<size_t>(num_tokens) * hd,
                rows.begin() + static_cast<std::ptrdiff_t>(l * num_tokens * hd));
  }
  return draft_->append_context(*seq->draft, rows, num_tokens);
}

void Engine::invalidate_unrecorded_pages(const StepPlan& plan) {
  for (const SeqSlice& s : plan.seqs) {
    auto owner = seq_owner_.find(s.seq_id);
    if (owner != seq_owner_.end() && owner->second.first->speculative) continue;
    if (const SequenceState* st = sched_->find(s.seq_id)) {
      features_of(*st).invalidate(st->pages, s.start_pos, s.num_tokens());
    }
  }
}

std::vector<std::pair<RequestId, Status>> Engine::feed_draft_context(const StepPlan& plan,
                                                                     const ModelOutput& out) {
  std::vector<std::pair<RequestId, Status>> failed;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqSlice& s = plan.seqs[i];
    if (s.num_draft > 0) continue;  // committed once verified
    auto owner = seq_owner_.find(s.seq_id);
    if (owner == seq_owner_.end() || !owner->second.first->speculative) continue;
    Status st = append_draft_context(owner->second.second, out, i, s.start_pos, 0, s.num_tokens());
    if (!st.is_ok()) failed.emplace_back(s.request_id, st);
  }
  return failed;
}

std::vector<SampleResult> Engine::verify_slice(ReqCtx* req, SeqCtx* seq, const SeqSlice& slice,
                                               std::span<const float> logits,
                                               SamplerScratch* scratch,
                                               int32_t* num_accepted) const {
  const int32_t k = slice.num_draft;
  const size_t V = static_cast<size_t>(vocab_size_);
  M3_CHECK(logits.size() == static_cast<size_t>(k + 1) * V,
           "[engine.verify] " + std::to_string(logits.size()) + " logits for " +
               std::to_string(k + 1) + " rows");
  const std::span<const int32_t> drafts(slice.token_ids.data() + 1, static_cast<size_t>(k));
  M3_CHECK(seq->proposal.size() == static_cast<size_t>(k) &&
               std::equal(drafts.begin(), drafts.end(), seq->proposal.begin()),
           "[engine.verify] the slice's drafts are not the sequence's proposal");
  const SamplingParams& p = req->req.params;
  auto row = [&](int32_t i) { return logits.subspan(static_cast<size_t>(i) * V, V); };
  // p_i: the target's distribution at row i after every logits processor, with the drafts
  // before it counted as output (penalties, min_tokens), exactly as ordinary decoding would
  // sample there.
  PenaltyState history = seq->penalties;
  std::vector<std::vector<double>> target(static_cast<size_t>(k) + 1);
  for (int32_t i = 0; i <= k; ++i) {
    SampleInput in;
    in.logits = row(i);
    in.params = &p;
    in.penalties = &history;
    in.min_tokens_mask = req->min_tokens_mask;
    sampling_distribution(in, scratch, &target[static_cast<size_t>(i)]);
    if (i < k) history.add_output(drafts[i]);
  }
  VerifyResult v;
  const double u_residual = uniform01(spec_key(*req, *seq, kResidualStream, 0));
  if (spec_.simulate_accept_length > 0) {
    v.num_accepted = std::min(spec_.simulate_accept_length - 1, k);
    const std::vector<double>& pt = target[static_cast<size_t>(v.num_accepted)];
    double total = 0.0;
    for (double x : pt) total += x;
    v.next_token = draw_from_mass(pt, total, u_residual);
  } else {
    VerifyUniforms u;
    u.accept = [&](int32_t i) {
      return uniform01(spec_key(*req, *seq, kAcceptStream, static_cast<uint64_t>(i)));
    };
    u.residual = [&] { return u_residual; };
    v = verify_draft(spec_.method, drafts, seq->proposal_q, target, u);
  }
  *num_accepted = v.num_accepted;
  std::vector<SampleResult> out(static_cast<size_t>(v.num_accepted) + 1);
  for (int32_t i = 0; i <= v.num_accepted; ++i) {
    SampleResult& r = out[static_cast<size_t>(i)];
    r.token = i < v.num_accepted ? drafts[i] : v.next_token;
    if (p.logprobs) {
      r.logprob = static_cast<float>(raw_logprob(row(i), r.token));
      r.top_logprobs = raw_top_logprobs(row(i), p.top_logprobs);
    }
  }
  return out;
}

}  // namespace m3

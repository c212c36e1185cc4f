#include "sched/scheduler.h"

#include <algorithm>
#include <string>

namespace m3 {

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config) {
  M3_CHECK(config.page_size > 0, "[sched] page_size " + std::to_string(config.page_size));
  M3_CHECK(config.chunked_prefill_size > 0,
           "[sched] chunked_prefill_size " + std::to_string(config.chunked_prefill_size));
  M3_CHECK(config.max_running_requests > 0,
           "[sched] max_running_requests " + std::to_string(config.max_running_requests));
  pool_ = std::make_unique<PagePool>(config.num_pages);
  index_ = std::make_unique<RadixPrefixIndex>(pool_.get(), config.page_size);
}

Scheduler::~Scheduler() {
  // Sequences first (their references), then the index (its references), then the pool.
  for (auto& [id, seq] : seqs_) release_pages(seq.get());
  index_.reset();
}

Status Scheduler::add(SeqSpec spec) {
  if (spec.prompt.empty()) {
    return invalid_argument("[sched.add] sequence " + std::to_string(spec.id) + " has no tokens");
  }
  if (seqs_.count(spec.id)) {
    return invalid_argument("[sched.add] duplicate sequence id " + std::to_string(spec.id));
  }
  const int32_t need = num_pages_for_tokens(spec.prompt.size(), config_.page_size);
  if (need > pool_->num_pages()) {
    return invalid_argument("[sched.add] prompt of " + std::to_string(spec.prompt.size()) +
                            " tokens needs " + std::to_string(need) + " KV pages; the pool has " +
                            std::to_string(pool_->num_pages()));
  }
  auto seq = std::make_unique<Seq>();
  seq->id = spec.id;
  seq->request_id = spec.request_id;
  seq->seq_index = spec.seq_index;
  seq->num_prompt_tokens = static_cast<int32_t>(spec.prompt.size());
  seq->tokens = std::move(spec.prompt);
  seq->wait_for = spec.wait_for;
  seq->match_prefix = spec.match_prefix;
  seq->arrival = next_arrival_++;
  Seq* raw = seq.get();
  seqs_.emplace(raw->id, std::move(seq));
  insert_waiting(raw);
  return Status::ok();
}

void Scheduler::insert_waiting(Seq* seq) {
  seq->phase = SeqPhase::kWaiting;
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                             [](const Seq* a, const Seq* b) { return a->arrival < b->arrival; });
  waiting_.insert(it, seq);
}

void Scheduler::insert_running(Seq* seq) {
  auto it = std::upper_bound(running_.begin(), running_.end(), seq,
                             [](const Seq* a, const Seq* b) { return a->arrival < b->arrival; });
  running_.insert(it, seq);
}

bool Scheduler::ensure_free(int32_t num_pages) {
  const int32_t short_by = num_pages - pool_->num_free();
  if (short_by > 0) index_->evict(short_by);
  return pool_->num_free() >= num_pages;
}

void Scheduler::release_pages(Seq* seq) {
  for (PageId p : seq->pages) pool_->decref(p);
  seq->pages.clear();
  seq->num_indexed_pages = 0;
  seq->num_computed_tokens = 0;
}

void Scheduler::preempt(Seq* seq, StepPlan* plan) {
  // Recompute rather than swap: the freed pages stay in the prefix index as far as they were full,
  // so re-admission usually recomputes only the tail.
  release_pages(seq);
  ++seq->num_preemptions;
  ++counters_.num_preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  insert_waiting(seq);
  plan->preempted.push_back(seq->id);
}

bool Scheduler::dependency_pending(const Seq& seq) const {
  if (seq.wait_for < 0) return false;
  auto it = seqs_.find(seq.wait_for);
  if (it == seqs_.end()) return false;
  return it->second->phase != SeqPhase::kDecoding;
}

SeqSlice Scheduler::make_slice(const Seq& seq, int32_t num_new) const {
  SeqSlice s;
  s.seq_id = seq.id;
  s.request_id = seq.request_id;
  s.seq_index = seq.seq_index;
  s.start_pos = seq.num_computed_tokens;
  s.token_ids.assign(seq.tokens.begin() + s.start_pos, seq.tokens.begin() + s.start_pos + num_new);
  s.block_table = seq.pages;
  s.need_logits = s.end_pos() == seq.num_tokens();
  return s;
}

StepPlan Scheduler::plan() {
  StepPlan plan;
  plan.step_idx = step_idx_++;
  plan.page_size = config_.page_size;
  const int32_t P = config_.page_size;
  int32_t budget = config_.chunked_prefill_size;

  // 1. Running sequences, oldest first. Victims come from the back (newest), so a victim never
  // has a slice in this plan yet, except when the victim is the sequence being planned.
  for (size_t i = 0; i < running_.size(); ++i) {
    Seq* seq = running_[i];
    const int32_t remaining = seq->num_tokens() - seq->num_computed_tokens;
    M3_CHECK(remaining >= 1, "[sched.plan] sequence " + std::to_string(seq->id) +
                                 " has nothing to compute; the engine must append or remove it");
    const int32_t num_new = remaining == 1 ? 1 : std::min(remaining, budget);
    if (num_new == 0) continue;  // prefill budget spent: keep its pages, continue next step
    const int32_t need =
        num_pages_for_tokens(seq->num_computed_tokens + num_new, P) -
        static_cast<int32_t>(seq->pages.size());
    bool self_preempted = false;
    while (!ensure_free(need)) {
      Seq* victim = running_.back();
      preempt(victim, &plan);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the last running sequence
    M3_CHECK(pool_->alloc(need, &seq->pages), "[sched.plan] alloc after ensure_free");
    if (remaining > 1) {
      seq->phase = SeqPhase::kPrefilling;
      budget -= num_new;
    } else {
      seq->phase = SeqPhase::kDecoding;
    }
    plan.seqs.push_back(make_slice(*seq, num_new));
  }

  // 2. Admission, FCFS. Sequences preempted above are at their arrival position in the queue.
  for (size_t w = 0; w < waiting_.size();) {
    if (static_cast<int32_t>(running_.size()) >= config_.max_running_requests || budget <= 0) {
      break;
    }
    Seq* seq = waiting_[w];
    if (dependency_pending(*seq)) {
      ++w;  // waits for its leader's prefill; does not block the queue
      continue;
    }
    std::vector<PageId> matched;
    if (config_.enable_prefix_cache && seq->match_prefix) {
      matched = index_->match(seq->tokens, (seq->num_tokens() - 1) / P);
    }
    for (PageId p : matched) pool_->incref(p);  // before ensure_free can evict them
    const int32_t num_cached = static_cast<int32_t>(matched.size()) * P;
    const int32_t remaining = seq->num_tokens() - num_cached;
    const int32_t num_new = remaining == 1 ? 1 : std::min(remaining, budget);
    const int32_t need =
        num_pages_for_tokens(num_cached + num_new, P) - static_cast<int32_t>(matched.size());
    if (!ensure_free(need)) {
      for (PageId p : matched) pool_->decref(p);
      break;  // strict FCFS: younger requests do not overtake one that does not fit
    }
    seq->pages = std::move(matched);
    seq->num_indexed_pages = static_cast<int32_t>(seq->pages.size());
    seq->num_computed_tokens = num_cached;
    M3_CHECK(pool_->alloc(need, &seq->pages), "[sched.plan] alloc after ensure_free");
    if (seq->num_cached_prompt_tokens < 0) {
      seq->num_cached_prompt_tokens = std::min(num_cached, seq->num_prompt_tokens);
      counters_.num_prefix_hit_tokens += seq->num_cached_prompt_tokens;
    }
    seq->phase = remaining > 1 ? SeqPhase::kPrefilling : SeqPhase::kDecoding;
    if (remaining > 1) budget -= num_new;
    waiting_.erase(waiting_.begin() + w);
    insert_running(seq);
    plan.seqs.push_back(make_slice(*seq, num_new));
  }

  for (const SeqSlice& s : plan.seqs) {
    (s.is_decode() ? plan.num_tokens_decode : plan.num_tokens_prefill) += s.num_tokens();
  }
  ++counters_.num_steps;
  return plan;
}

void Scheduler::commit(const StepPlan& plan) {
  const int32_t P = config_.page_size;
  for (const SeqSlice& s : plan.seqs) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // removed between plan and commit (failed step)
    Seq* seq = it->second.get();
    M3_CHECK(seq->num_computed_tokens == s.start_pos,
             "[sched.commit] sequence " + std::to_string(seq->id) + " computed " +
                 std::to_string(seq->num_computed_tokens) + " but the slice starts at " +
                 std::to_string(s.start_pos));
    seq->num_computed_tokens = s.end_pos();
    if (seq->num_computed_tokens < seq->num_tokens()) {
      seq->phase = SeqPhase::kPrefilling;
    } else {
      seq->phase = SeqPhase::kDecoding;
    }
    if (!config_.enable_prefix_cache) continue;
    const int32_t num_full = seq->num_computed_tokens / P;
    if (num_full <= seq->num_indexed_pages) continue;
    std::vector<PageId> canonical = index_->insert(
        std::span<const int32_t>(seq->tokens.data(), static_cast<size_t>(num_full) * P),
        std::span<const PageId>(seq->pages.data(), num_full));
    for (int32_t i = seq->num_indexed_pages; i < num_full; ++i) {
      if (canonical[i] == seq->pages[i]) continue;
      // Another sequence indexed the same tokens first: share its page, free our duplicate.
      pool_->incref(canonical[i]);
      pool_->decref(seq->pages[i]);
      seq->pages[i] = canonical[i];
    }
    seq->num_indexed_pages = num_full;
  }
}

void Scheduler::append_token(SeqId id, int32_t token) {
  auto it = seqs_.find(id);
  M3_CHECK(it != seqs_.end(), "[sched.append_token] unknown sequence " + std::to_string(id));
  Seq* seq = it->second.get();
  M3_CHECK(seq->num_computed_tokens == seq->num_tokens(),
           "[sched.append_token] sequence " + std::to_string(id) + " still has " +
               std::to_string(seq->num_tokens() - seq->num_computed_tokens) +
               " tokens to compute");
  seq->tokens.push_back(token);
  seq->phase = SeqPhase::kDecoding;
}

bool Scheduler::remove(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Seq* seq = it->second.get();
  release_pages(seq);
  if (auto r = std::find(running_.begin(), running_.end(), seq); r != running_.end()) {
    running_.erase(r);
  }
  if (auto w = std::find(waiting_.begin(), waiting_.end(), seq); w != waiting_.end()) {
    waiting_.erase(w);
  }
  seqs_.erase(it);
  return true;
}

const SequenceState* Scheduler::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

std::vector<SeqId> Scheduler::running_ids() const {
  std::vector<SeqId> ids;
  for (const Seq* s : running_) ids.push_back(s->id);
  return ids;
}

std::vector<SeqId> Scheduler::waiting_ids() const {
  std::vector<SeqId> ids;
  for (const Seq* s : waiting_) ids.push_back(s->id);
  return ids;
}

}  // namespace m3

#include "sched/scheduler.h"

#include <algorithm>
#include <string>

namespace m3 {

Result<LoadBalanceMethod> parse_load_balance_method(const std::string& name) {
  if (name == "round_robin") return LoadBalanceMethod::kRoundRobin;
  if (name == "minimum_tokens") return LoadBalanceMethod::kMinimumTokens;
  if (name == "shortest_queue") return LoadBalanceMethod::kShortestQueue;
  return invalid_argument("--load-balance-method: unknown method '" + name +
                          "'; choices: round_robin, minimum_tokens, shortest_queue");
}

const char* load_balance_method_name(LoadBalanceMethod method) {
  switch (method) {
    case LoadBalanceMethod::kRoundRobin: return "round_robin";
    case LoadBalanceMethod::kMinimumTokens: return "minimum_tokens";
    case LoadBalanceMethod::kShortestQueue: return "shortest_queue";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerConfig& config) : config_(config) {
  M3_CHECK(config.page_size > 0, "[sched] page_size " + std::to_string(config.page_size));
  M3_CHECK(config.chunked_prefill_size > 0,
           "[sched] chunked_prefill_size " + std::to_string(config.chunked_prefill_size));
  M3_CHECK(config.chunked_prefill_size_while_decoding >= 0,
           "[sched] chunked_prefill_size_while_decoding " +
               std::to_string(config.chunked_prefill_size_while_decoding));
  M3_CHECK(config.max_running_requests > 0,
           "[sched] max_running_requests " + std::to_string(config.max_running_requests));
  M3_CHECK(config.num_dp_groups > 0,
           "[sched] num_dp_groups " + std::to_string(config.num_dp_groups));
  const int32_t D = config.num_dp_groups;
  // SGLang divides both flags by the DP size: each group gets its share, so a lock-step step
  // stays within the totals the memory plan sized the activations for. At least 1 each.
  group_max_running_ = std::max(1, config.max_running_requests / D);
  group_prefill_budget_ = std::max(1, config.chunked_prefill_size / D);
  if (config.chunked_prefill_size_while_decoding > 0)
    group_prefill_budget_while_decoding_ =
        std::max(1, config.chunked_prefill_size_while_decoding / D);
  groups_.resize(static_cast<size_t>(D));
  for (Group& g : groups_) {
    g.pool = std::make_unique<PagePool>(config.num_pages);
    g.index = std::make_unique<RadixPrefixIndex>(g.pool.get(), config.page_size);
  }
}

Scheduler::~Scheduler() {
  // Sequences first (their references), then the indexes (their references), then the pools.
  for (auto& [id, seq] : seqs_) release_pages(seq.get());
  for (Group& g : groups_) g.index.reset();
}

const Scheduler::Group& Scheduler::group(int32_t g) const {
  M3_CHECK(g >= 0 && g < num_dp_groups(), "[sched] DP group " + std::to_string(g) + " of " +
                                              std::to_string(num_dp_groups()));
  return groups_[static_cast<size_t>(g)];
}

int32_t Scheduler::num_running(int32_t dp_group) const {
  return static_cast<int32_t>(group(dp_group).running.size());
}

int32_t Scheduler::num_waiting(int32_t dp_group) const {
  return static_cast<int32_t>(group(dp_group).waiting.size());
}

int32_t Scheduler::num_running() const {
  int32_t n = 0;
  for (const Group& g : groups_) n += static_cast<int32_t>(g.running.size());
  return n;
}

int32_t Scheduler::num_waiting() const {
  int32_t n = 0;
  for (const Group& g : groups_) n += static_cast<int32_t>(g.waiting.size());
  return n;
}

int64_t Scheduler::num_live_tokens(int32_t dp_group) const {
  const Group& g = group(dp_group);
  int64_t n = 0;
  for (const Seq* s : g.running) n += s->num_tokens();
  for (const Seq* s : g.waiting) n += s->num_tokens();
  return n;
}

void Scheduler::flush_prefix_cache() {
  for (Group& g : groups_) g.index->evict_all();
}

Status Scheduler::enable_hicache(std::unique_ptr<HiCache> hicache) {
  if (num_dp_groups() != 1) {
    return invalid_argument("--enable-hierarchical-cache is not supported with attention data "
                            "parallelism (--enable-dp-attention)");
  }
  if (!config_.enable_prefix_cache) {
    return invalid_argument("--enable-hierarchical-cache needs the prefix cache, which is off "
                            "for this engine");
  }
  if (!seqs_.empty() || groups_[0].index->num_nodes() != 0) {
    return invalid_argument("[sched] HiCache must be enabled before any request");
  }
  groups_[0].index->set_hicache(std::move(hicache));
  return Status::ok();
}

std::span<const int32_t> Scheduler::cache_key(const Seq& seq, int32_t n,
                                              std::vector<int32_t>& scratch) {
  if (seq.prompt_key.empty()) return {seq.tokens.data(), static_cast<size_t>(n)};
  scratch.assign(seq.prompt_key.begin(),
                 seq.prompt_key.begin() + std::min<int32_t>(n, seq.num_prompt_tokens));
  for (int32_t i = seq.num_prompt_tokens; i < n; ++i) scratch.push_back(seq.tokens[size_t(i)]);
  return scratch;
}

int32_t Scheduler::place(const SeqSpec& spec) {
  const int32_t D = num_dp_groups();
  if (D == 1) return 0;
  if (spec.wait_for >= 0) {
    if (auto it = seqs_.find(spec.wait_for); it != seqs_.end()) return it->second->dp_group;
  }
  if (spec.request_id != 0 && spec.request_id == last_placed_request_) return last_placed_group_;
  int32_t best = 0;
  switch (config_.load_balance) {
    case LoadBalanceMethod::kRoundRobin:
      best = static_cast<int32_t>(round_robin_next_++ % static_cast<uint64_t>(D));
      break;
    case LoadBalanceMethod::kMinimumTokens:
      for (int32_t g = 1; g < D; ++g) {
        if (num_live_tokens(g) < num_live_tokens(best)) best = g;
      }
      break;
    case LoadBalanceMethod::kShortestQueue:
      for (int32_t g = 1; g < D; ++g) {
        if (num_running(g) + num_waiting(g) < num_running(best) + num_waiting(best)) best = g;
      }
      break;
  }
  return best;
}

Status Scheduler::add(SeqSpec spec) {
  if (spec.prompt.empty()) {
    return invalid_argument("[sched.add] sequence " + std::to_string(spec.id) + " has no tokens");
  }
  if (seqs_.count(spec.id)) {
    return invalid_argument("[sched.add] duplicate sequence id " + std::to_string(spec.id));
  }
  const int32_t need = num_pages_for_tokens(spec.prompt.size(), config_.page_size);
  if (need > config_.num_pages) {
    return invalid_argument("[sched.add] prompt of " + std::to_string(spec.prompt.size()) +
                            " tokens needs " + std::to_string(need) + " KV pages; the pool has " +
                            std::to_string(config_.num_pages) +
                            (num_dp_groups() > 1 ? " per DP group" : ""));
  }
  auto seq = std::make_unique<Seq>();
  seq->id = spec.id;
  seq->request_id = spec.request_id;
  seq->seq_index = spec.seq_index;
  seq->num_prompt_tokens = static_cast<int32_t>(spec.prompt.size());
  if (!spec.prompt_key.empty() && spec.prompt_key.size() != spec.prompt.size()) {
    return invalid_argument("[sched.add] sequence " + std::to_string(spec.id) + " has a prompt key of " +
                            std::to_string(spec.prompt_key.size()) + " values for " +
                            std::to_string(spec.prompt.size()) + " prompt tokens");
  }
  seq->tokens = std::move(spec.prompt);
  seq->prompt_key = std::move(spec.prompt_key);
  seq->wait_for = spec.wait_for;
  seq->match_prefix = spec.match_prefix;
  seq->arrival = next_arrival_++;
  seq->dp_group = place(spec);
  last_placed_request_ = spec.request_id;
  last_placed_group_ = seq->dp_group;
  Seq* raw = seq.get();
  seqs_.emplace(raw->id, std::move(seq));
  insert_waiting(raw);
  return Status::ok();
}

void Scheduler::insert_waiting(Seq* seq) {
  seq->phase = SeqPhase::kWaiting;
  std::deque<Seq*>& waiting = group_of(*seq).waiting;
  auto it = std::upper_bound(waiting.begin(), waiting.end(), seq,
                             [](const Seq* a, const Seq* b) { return a->arrival < b->arrival; });
  waiting.insert(it, seq);
}

void Scheduler::insert_running(Seq* seq) {
  std::vector<Seq*>& running = group_of(*seq).running;
  auto it = std::upper_bound(running.begin(), running.end(), seq,
                             [](const Seq* a, const Seq* b) { return a->arrival < b->arrival; });
  running.insert(it, seq);
}

bool Scheduler::ensure_free(Group& g, int32_t num_pages) {
  const int32_t short_by = num_pages - g.pool->num_free();
  if (short_by > 0) g.index->evict(short_by);
  return g.pool->num_free() >= num_pages;
}

void Scheduler::release_pages(Seq* seq) {
  PagePool& pool = *group_of(*seq).pool;
  for (PageId p : seq->pages) pool.decref(p);
  seq->pages.clear();
  seq->draft_tokens.clear();
  seq->num_indexed_pages = 0;
  seq->num_computed_tokens = 0;
}

void Scheduler::preempt(Seq* seq, StepPlan* plan) {
  // Recompute rather than swap: the freed pages stay in the prefix index as far as they were full,
  // so re-admission usually recomputes only the tail.
  release_pages(seq);
  ++seq->num_preemptions;
  ++counters_.num_preemptions;
  Group& g = group_of(*seq);
  ++g.counters.num_preemptions;
  g.running.erase(std::find(g.running.begin(), g.running.end(), seq));
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
  s.dp_group = seq.dp_group;
  s.need_logits = s.end_pos() == seq.num_tokens();
  if (s.need_logits && num_new == 1 && !seq.draft_tokens.empty()) {
    s.token_ids.insert(s.token_ids.end(), seq.draft_tokens.begin(), seq.draft_tokens.end());
    s.num_draft = static_cast<int32_t>(seq.draft_tokens.size());
  }
  return s;
}

StepPlan Scheduler::plan() {
  StepPlan plan;
  plan.step_idx = step_idx_++;
  plan.page_size = config_.page_size;
  // Every group plans its part of the one lock-step step; a group with nothing to do adds no
  // slices (the runner still runs the step for the others). While any sequence decodes, in any
  // group (the groups' steps are one), the prefill budget may be the smaller one.
  int32_t budget = group_prefill_budget_;
  if (group_prefill_budget_while_decoding_ > 0) {
    bool decoding = false;
    for (const Group& g : groups_)
      for (const Seq* s : g.running) decoding |= s->num_tokens() - s->num_computed_tokens == 1;
    if (decoding) budget = std::min(budget, group_prefill_budget_while_decoding_);
  }
  for (Group& g : groups_) plan_group(g, budget, &plan);
  for (const SeqSlice& s : plan.seqs) {
    (s.is_decode() ? plan.num_tokens_decode : plan.num_tokens_prefill) += s.num_tokens();
  }
  ++counters_.num_steps;
  return plan;
}

void Scheduler::plan_group(Group& g, int32_t budget, StepPlan* out) {
  StepPlan& plan = *out;
  const int32_t P = config_.page_size;
  std::vector<Seq*>& running = g.running;
  std::deque<Seq*>& waiting = g.waiting;
  PagePool* pool = g.pool.get();
  RadixPrefixIndex* index = g.index.get();

  // 1. Running sequences, oldest first. Victims come from the back (newest), so a victim never
  // has a slice in this plan yet, except when the victim is the sequence being planned.
  for (size_t i = 0; i < running.size(); ++i) {
    Seq* seq = running[i];
    const int32_t remaining = seq->num_tokens() - seq->num_computed_tokens;
    M3_CHECK(remaining >= 1, "[sched.plan] sequence " + std::to_string(seq->id) +
                                 " has nothing to compute; the engine must append or remove it");
    const int32_t num_new = remaining == 1 ? 1 : std::min(remaining, budget);
    if (num_new == 0) continue;  // prefill budget spent: keep its pages, continue next step
    if (remaining > 1) seq->draft_tokens.clear();
    // A verify slice writes its drafts' K/V too.
    const int32_t num_draft = static_cast<int32_t>(seq->draft_tokens.size());
    const int32_t need = num_pages_for_tokens(seq->num_computed_tokens + num_new + num_draft, P) -
                         static_cast<int32_t>(seq->pages.size());
    bool self_preempted = false;
    while (!ensure_free(g, need)) {
      Seq* victim = running.back();
      preempt(victim, &plan);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // it was the last running sequence
    M3_CHECK(pool->alloc(need, &seq->pages), "[sched.plan] alloc after ensure_free");
    if (remaining > 1) {
      seq->phase = SeqPhase::kPrefilling;
      budget -= num_new;
    } else {
      seq->phase = SeqPhase::kDecoding;
    }
    plan.seqs.push_back(make_slice(*seq, num_new));
  }

  // 2. Admission, FCFS. Sequences preempted above are at their arrival position in the queue.
  for (size_t w = 0; w < waiting.size();) {
    if (static_cast<int32_t>(running.size()) >= group_max_running_ || budget <= 0) {
      break;
    }
    Seq* seq = waiting[w];
    if (dependency_pending(*seq)) {
      ++w;  // waits for its leader's prefill; does not block the queue
      continue;
    }
    std::vector<PageId> matched;
    if (config_.enable_prefix_cache && seq->match_prefix) {
      // Referenced before ensure_free can evict them; with HiCache, host and disk hits are
      // copied back into device pages here, before the step that reads them. The key carries
      // each image's content hash at its placeholder positions.
      std::vector<int32_t> scratch;
      matched = index->acquire(cache_key(*seq, seq->num_tokens(), scratch),
                               (seq->num_tokens() - 1) / P);
    }
    if (prefix_match_limit_ && !matched.empty()) {
      const int32_t keep = prefix_match_limit_(*seq, matched);
      const size_t kept = static_cast<size_t>(
          std::clamp<int32_t>(keep, 0, static_cast<int32_t>(matched.size())));
      for (size_t i = kept; i < matched.size(); ++i) pool->decref(matched[i]);  // acquire's refs
      matched.resize(kept);
    }
    const int32_t num_cached = static_cast<int32_t>(matched.size()) * P;
    const int32_t remaining = seq->num_tokens() - num_cached;
    const int32_t num_new = remaining == 1 ? 1 : std::min(remaining, budget);
    const int32_t need =
        num_pages_for_tokens(num_cached + num_new, P) - static_cast<int32_t>(matched.size());
    if (!ensure_free(g, need)) {
      for (PageId p : matched) pool->decref(p);
      break;  // strict FCFS: younger requests do not overtake one that does not fit
    }
    seq->pages = std::move(matched);
    seq->num_indexed_pages = static_cast<int32_t>(seq->pages.size());
    seq->num_computed_tokens = num_cached;
    M3_CHECK(pool->alloc(need, &seq->pages), "[sched.plan] alloc after ensure_free");
    if (seq->num_cached_prompt_tokens < 0) {
      seq->num_cached_prompt_tokens = std::min(num_cached, seq->num_prompt_tokens);
      counters_.num_prefix_hit_tokens += seq->num_cached_prompt_tokens;
      g.counters.num_prefix_hit_tokens += seq->num_cached_prompt_tokens;
    }
    seq->phase = remaining > 1 ? SeqPhase::kPrefilling : SeqPhase::kDecoding;
    if (remaining > 1) budget -= num_new;
    waiting.erase(waiting.begin() + w);
    insert_running(seq);
    plan.seqs.push_back(make_slice(*seq, num_new));
  }
}

void Scheduler::commit(const StepPlan& plan) {
  for (const SeqSlice& s : plan.seqs) {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) continue;  // removed between plan and commit (failed step)
    Seq* seq = it->second.get();
    M3_CHECK(seq->num_computed_tokens == s.start_pos,
             "[sched.commit] sequence " + std::to_string(seq->id) + " computed " +
                 std::to_string(seq->num_computed_tokens) + " but the slice starts at " +
                 std::to_string(s.start_pos));
    // A verify slice computes its decode token; the drafts count once accepted
    // (append_verified).
    seq->num_computed_tokens = s.end_pos() - s.num_draft;
    seq->draft_tokens.clear();
    if (seq->num_computed_tokens < seq->num_tokens()) {
      seq->phase = SeqPhase::kPrefilling;
    } else {
      seq->phase = SeqPhase::kDecoding;
    }
    index_full_pages(seq);
  }
}

void Scheduler::index_full_pages(Seq* seq) {
  if (!config_.enable_prefix_cache) return;
  const int32_t P = config_.page_size;
  const int32_t num_full = seq->num_computed_tokens / P;
  if (num_full <= seq->num_indexed_pages) return;
  Group& g = group_of(*seq);
  std::vector<int32_t> scratch;
  std::vector<PageId> canonical = g.index->insert(
      cache_key(*seq, num_full * P, scratch),
      std::span<const PageId>(seq->pages.data(), num_full));
  for (int32_t i = seq->num_indexed_pages; i < num_full; ++i) {
    if (canonical[i] == seq->pages[i]) continue;
    // Another sequence indexed the same tokens first: share its page, free our duplicate.
    if (page_dedup_hook_) page_dedup_hook_(seq->dp_group, canonical[i], seq->pages[i], i);
    g.pool->incref(canonical[i]);
    g.pool->decref(seq->pages[i]);
    seq->pages[i] = canonical[i];
  }
  seq->num_indexed_pages = num_full;
}

bool Scheduler::set_draft(SeqId id, std::vector<int32_t> draft) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  Seq* seq = it->second.get();
  if (seq->phase != SeqPhase::kDecoding || seq->num_computed_tokens != seq->num_tokens() - 1)
    return false;
  seq->draft_tokens = std::move(draft);
  return true;
}

void Scheduler::append_verified(SeqId id, std::span<const int32_t> tokens, int32_t num_kv_valid) {
  auto it = seqs_.find(id);
  M3_CHECK(it != seqs_.end(), "[sched.append_verified] unknown sequence " + std::to_string(id));
  Seq* seq = it->second.get();
  M3_CHECK(seq->num_computed_tokens == seq->num_tokens() && !tokens.empty() && num_kv_valid >= 0 &&
               num_kv_valid < static_cast<int32_t>(tokens.size()),
           "[sched.append_verified] sequence " + std::to_string(id) + ": " +
               std::to_string(tokens.size()) + " tokens, " + std::to_string(num_kv_valid) +
               " with K/V, " + std::to_string(seq->num_tokens() - seq->num_computed_tokens) +
               " left to compute");
  seq->tokens.insert(seq->tokens.end(), tokens.begin(), tokens.end());
  seq->num_computed_tokens += num_kv_valid;
  seq->phase = SeqPhase::kDecoding;
  // The rejected drafts' pages (never indexed: they lie past the computed positions).
  const int32_t keep = num_pages_for_tokens(seq->num_computed_tokens, config_.page_size);
  PagePool& pool = *group_of(*seq).pool;
  while (static_cast<int32_t>(seq->pages.size()) > keep) {
    pool.decref(seq->pages.back());
    seq->pages.pop_back();
  }
  index_full_pages(seq);
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
  Group& g = group_of(*seq);
  if (auto r = std::find(g.running.begin(), g.running.end(), seq); r != g.running.end()) {
    g.running.erase(r);
  }
  if (auto w = std::find(g.waiting.begin(), g.waiting.end(), seq); w != g.waiting.end()) {
    g.waiting.erase(w);
  }
  seqs_.erase(it);
  return true;
}

const SequenceState* Scheduler::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

namespace {

// The ids of the sequences of every group's queue, merged by arrival.
template <typename Queue, typename GroupList>
std::vector<SeqId> ids_by_arrival(const GroupList& groups, Queue queue_of) {
  std::vector<const SequenceState*> seqs;
  for (const auto& g : groups) {
    for (const SequenceState* s : queue_of(g)) seqs.push_back(s);
  }
  std::sort(seqs.begin(), seqs.end(),
            [](const SequenceState* a, const SequenceState* b) { return a->arrival < b->arrival; });
  std::vector<SeqId> ids;
  for (const SequenceState* s : seqs) ids.push_back(s->id);
  return ids;
}

}  // namespace

std::vector<SeqId> Scheduler::running_ids() const {
  return ids_by_arrival(groups_, [](const Group& g) -> const auto& { return g.running; });
}

std::vector<SeqId> Scheduler::waiting_ids() const {
  return ids_by_arrival(groups_, [](const Group& g) -> const auto& { return g.waiting; });
}

}  // namespace m3

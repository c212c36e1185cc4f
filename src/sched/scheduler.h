// Continuous-batching scheduler: owns every sequence's state and the KV page pool (with the radix
// prefix index), and decides each step which tokens of which sequences to compute.
//
// Sequence life: waiting -> running (prefilling in chunks, then decoding one token per step) ->
// finished/cancelled; a running sequence may be preempted back to waiting (its pages are freed and
// it is recomputed later: prompt + tokens generated so far, usually mostly from the prefix cache).
//
// Per step (plan()):
//   1. Running sequences, oldest arrival first: a decoding sequence gets 1 token; a prefilling one
//      gets the next chunk within the prefill token budget (--chunked-prefill-size). If pages run
//      out (after evicting unreferenced cached pages), the NEWEST running sequence is preempted,
//      repeatedly, possibly the one being planned. The oldest request therefore always progresses:
//      no starvation, and no failure when pages run out.
//   2. Waiting sequences, oldest arrival first, while running < max_running and budget remains:
//      prefix-cache match, then the first chunk if its pages fit (no preemption for admission;
//      strict FCFS: admission stops at the first sequence that does not fit).
//
// Prefix cache and the last prompt token: a sequence needs the logits of its last known token, so
// at least that token must be computed. We match at most (num_tokens - 1) / P whole pages, so a
// full-prompt hit recomputes the last page (1..P tokens) instead of rewriting a shared page.
//
// After each model step, commit() advances the computed positions and indexes every page that has
// just become full, so concurrent requests with the same system prompt share pages as soon as the
// first chunk is done. Not thread-safe: the engine thread owns it.
//
// Attention data parallelism (num_dp_groups D > 1, SGLang's --enable-dp-attention --dp D): each
// group has its own page pool (num_pages pages, page ids 0 .. num_pages - 1 of that group), its
// own prefix index, and its own running and waiting queues. A sequence is placed on one group
// when it is added (--load-balance-method) and stays there: its pages, prefix matches, preemption
// and freeing all happen within its group. plan() runs the two passes above for every group with
// the group's share of the budgets (max_running_requests / D running sequences and
// chunked_prefill_size / D prefill tokens each, SGLang's division, so one lock-step step never
// exceeds the flags' totals) and returns one plan whose slices name their group (dp_group).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/page_pool.h"
#include "kv/radix_prefix_index.h"
#include "sched/step_plan.h"

namespace m3 {

// Which attention data-parallel group a new request goes to (--load-balance-method, SGLang's
// names). Ties go to the lowest group.
enum class LoadBalanceMethod : uint8_t {
  kRoundRobin,     // round_robin: groups in turn, one request each
  kMinimumTokens,  // minimum_tokens: fewest tokens of live sequences (running + waiting)
  kShortestQueue,  // shortest_queue: fewest live sequences (running + waiting)
};
// "round_robin" / "minimum_tokens" / "shortest_queue"; anything else is an invalid argument that
// names --load-balance-method and the choices.
Result<LoadBalanceMethod> parse_load_balance_method(const std::string& name);
const char* load_balance_method_name(LoadBalanceMethod method);

struct SchedulerConfig {
  int32_t num_pages = 0;                // KV pool size per DP group (kv_pages_for_budget / ...)
  int32_t page_size = kPageSize;
  // Prefill tokens per step, all groups together (each group plans its share, see the header
  // comment); decode tokens ride along.
  int32_t chunked_prefill_size = 8192;
  // Prefill tokens per step while any sequence decodes (all groups together; 0: as
  // chunked_prefill_size). A step runs as long as its costliest part, and an MoE prefill chunk
  // touches nearly every expert, so a smaller budget while streams decode keeps their inter-token
  // latency near idle at the price of arriving prompts' time to first token; prompts that arrive
  // when nothing decodes still prefill in chunked_prefill_size chunks.
  int32_t chunked_prefill_size_while_decoding = 0;
  // Running sequences, all groups together (n > 1 counts each sequence).
  int32_t max_running_requests = 256;
  bool enable_prefix_cache = true;
  int32_t num_dp_groups = 1;            // attention data-parallel groups (ModelRunner::dp_groups())
  LoadBalanceMethod load_balance = LoadBalanceMethod::kRoundRobin;
};

enum class SeqPhase : uint8_t { kWaiting, kPrefilling, kDecoding };

// Read-only view of a sequence for the engine and tests.
struct SequenceState {
  SeqId id = -1;
  RequestId request_id = 0;
  int32_t seq_index = 0;
  SeqPhase phase = SeqPhase::kWaiting;
  std::vector<int32_t> tokens;       // prompt ++ generated
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;   // positions whose K/V are in `pages`
  BlockTable pages;
  int32_t num_indexed_pages = 0;     // leading pages known to the prefix index
  // Prompt tokens served from the prefix cache at the FIRST admission (usage.cached_tokens);
  // -1 until admitted. Re-admissions after preemption do not change it.
  int32_t num_cached_prompt_tokens = -1;
  int32_t num_preemptions = 0;
  uint64_t arrival = 0;              // submission order; lower = older = higher priority
  SeqId wait_for = -1;               // admit only once this sequence has finished its prefill
  bool match_prefix = true;          // false: every position is computed (prompt logits)
  int32_t dp_group = 0;              // attention data-parallel group, fixed when added
  // The prefix-cache key of the prompt positions (SeqSpec::prompt_key); empty: the tokens.
  std::vector<int32_t> prompt_key;
  // Draft tokens to verify with the next decode slice (set_draft); cleared by plan's commit and
  // by preemption.
  std::vector<int32_t> draft_tokens;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens; }
};

struct SeqSpec {
  SeqId id = -1;
  RequestId request_id = 0;
  int32_t seq_index = 0;
  std::vector<int32_t> prompt;  // non-empty
  // n > 1: siblings wait for the first sequence's prefill, then share its full prompt pages
  // through the prefix index instead of computing the prompt n times. -1 = no dependency.
  SeqId wait_for = -1;
  // False: never served from the prefix cache, so every prompt position is computed (a request
  // that wants the logits of every prompt position).
  bool match_prefix = true;
  // Empty, or one value per prompt token: what the prefix cache matches and indexes instead of
  // the prompt's token ids (generated tokens are keyed by their ids). Positions whose input is
  // not their token's embedding (image features at placeholder tokens) get values derived from
  // what they hold, so equal tokens with other inputs never share KV.
  std::vector<int32_t> prompt_key;
};

struct SchedulerCounters {
  uint64_t num_preemptions = 0;
  uint64_t num_prefix_hit_tokens = 0;  // tokens served from the cache at first admissions
  uint64_t num_steps = 0;              // engine-wide only (every group takes part in every step)
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerConfig& config() const { return config_; }

  // Queues a sequence on a DP group (see place()). Invalid argument for an empty prompt, a
  // duplicate id, or a prompt that can never fit the pool (needs more pages than a group has).
  Status add(SeqSpec spec);

  // Plans the next step (see the header comment). May preempt sequences (listed in the plan).
  StepPlan plan();

  // Records that `plan` was computed: advances computed positions and indexes newly full pages.
  // Call exactly once per plan, before append_token()/finish() for that step.
  void commit(const StepPlan& plan);

  // Appends a sampled token to a sequence whose slice needed logits in the committed step.
  void append_token(SeqId id, int32_t token);

  // Speculative decoding. set_draft: the next decode slice of this sequence (which must be
  // decoding, with only its last token left to compute) verifies `draft` after that token; the
  // plan allocates pages for all of them. Returns false, changing nothing, for a sequence in
  // another state.
  bool set_draft(SeqId id, std::vector<int32_t> draft);
  // After a committed verify slice: `tokens` are the emitted tokens (the accepted drafts, then the
  // target's next token), of which the first `num_kv_valid` have their K/V in the pages (the
  // accepted drafts). Advances the computed positions, indexes newly full pages, and gives back
  // the pages beyond the computed positions (the rejected drafts'). At most tokens.size() - 1
  // tokens may be K/V-valid: the last one is always left to compute.
  void append_verified(SeqId id, std::span<const int32_t> tokens, int32_t num_kv_valid);

  // Removes a sequence (finished, cancelled or failed) and releases its pages. Full pages stay in
  // the prefix index. Unknown ids are ignored (cancel may race with finish). Returns true if found.
  bool remove(SeqId id);

  const SequenceState* find(SeqId id) const;
  // All groups together; running_ids() and waiting_ids() are sorted by arrival.
  int32_t num_waiting() const;
  int32_t num_running() const;
  std::vector<SeqId> running_ids() const;
  std::vector<SeqId> waiting_ids() const;

  int32_t num_dp_groups() const { return static_cast<int32_t>(groups_.size()); }
  // Each group's running-sequence limit and prefill token budget per step.
  int32_t group_max_running() const { return group_max_running_; }
  int32_t group_prefill_budget() const { return group_prefill_budget_; }
  // The same while a sequence decodes (SchedulerConfig::chunked_prefill_size_while_decoding).
  int32_t group_prefill_budget_while_decoding() const {
    return group_prefill_budget_while_decoding_ > 0 ? group_prefill_budget_while_decoding_
                                                    : group_prefill_budget_;
  }
  const PagePool& pool(int32_t dp_group = 0) const { return *group(dp_group).pool; }
  const RadixPrefixIndex& prefix_index(int32_t dp_group = 0) const {
    return *group(dp_group).index;
  }
  int32_t num_running(int32_t dp_group) const;
  int32_t num_waiting(int32_t dp_group) const;
  // Tokens (prompt + generated) of the group's live sequences, running and waiting: the load
  // minimum_tokens balances.
  int64_t num_live_tokens(int32_t dp_group) const;
  // Limits a prefix-cache match at admission: called with the sequence and the pages the index
  // matched (leading pages of its tokens); the sequence uses only the first `return value` of
  // them (clamped to [0, matched.size()]) and computes the rest. The engine uses it for
  // speculative sequences, whose draft needs features the cache may not hold (docs/dspark.md).
  using PrefixMatchLimit =
      std::function<int32_t(const SequenceState& seq, std::span<const PageId> matched)>;
  void set_prefix_match_limit(PrefixMatchLimit limit) { prefix_match_limit_ = std::move(limit); }
  // Called when a sequence's newly full page duplicates one another sequence indexed first:
  // `kept` (the indexed page) replaces `dropped` (the sequence's, released next) as the
  // sequence's `index`-th page, both in attention group `dp_group`'s pool. The engine moves the
  // draft features it kept for `dropped`.
  using PageDedupHook =
      std::function<void(int32_t dp_group, PageId kept, PageId dropped, int32_t index)>;
  void set_page_dedup_hook(PageDedupHook hook) { page_dedup_hook_ = std::move(hook); }
  // Drops every cached page no live sequence holds, in every group (tests; "flush cache" admin
  // endpoint later). With HiCache the pages move to the lower tiers instead.
  void flush_prefix_cache();
  // Puts the host (and disk) tiers behind the prefix cache (--enable-hierarchical-cache): before
  // any sequence is added, with one DP group and the prefix cache on; invalid argument otherwise.
  // Admission then loads host and disk hits back into device pages (RadixPrefixIndex::acquire).
  Status enable_hicache(std::unique_ptr<HiCache> hicache);
  const HiCache* hicache() const { return groups_[0].index->hicache(); }
  // All groups together, and per group (num_steps is 0 there).
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerCounters& counters(int32_t dp_group) const { return group(dp_group).counters; }

 private:
  using Seq = SequenceState;
  // One attention data-parallel group's KV pool, prefix cache and queues.
  struct Group {
    std::unique_ptr<PagePool> pool;
    std::unique_ptr<RadixPrefixIndex> index;
    std::vector<Seq*> running;  // sorted by arrival
    std::deque<Seq*> waiting;   // sorted by arrival
    SchedulerCounters counters;
  };
  const Group& group(int32_t g) const;
  Group& group_of(const Seq& seq) { return groups_[static_cast<size_t>(seq.dp_group)]; }
  // The group a new sequence goes to: its leader's (wait_for) or its request's (the previous
  // sequence added with the same non-zero request id), so a request's n sequences share their
  // prompt pages; else the load-balance method's choice.
  int32_t place(const SeqSpec& spec);
  void plan_group(Group& g, int32_t budget, StepPlan* plan);
  bool ensure_free(Group& g, int32_t num_pages);  // evicts cached pages; no preemption
  void preempt(Seq* seq, StepPlan* plan);
  void release_pages(Seq* seq);
  void insert_waiting(Seq* seq);
  void insert_running(Seq* seq);
  bool dependency_pending(const Seq& seq) const;
  SeqSlice make_slice(const Seq& seq, int32_t num_new) const;
  void index_full_pages(Seq* seq);
  // The prefix-cache key of seq's first n tokens: its tokens, or its prompt_key followed by the
  // generated tokens (built in `scratch`).
  static std::span<const int32_t> cache_key(const Seq& seq, int32_t n,
                                            std::vector<int32_t>& scratch);

  SchedulerConfig config_;
  int32_t group_max_running_ = 0;
  int32_t group_prefill_budget_ = 0;
  int32_t group_prefill_budget_while_decoding_ = 0;  // 0: group_prefill_budget_
  std::vector<Group> groups_;
  std::unordered_map<SeqId, std::unique_ptr<Seq>> seqs_;
  uint64_t next_arrival_ = 0;
  uint64_t step_idx_ = 0;
  uint64_t round_robin_next_ = 0;
  RequestId last_placed_request_ = 0;
  int32_t last_placed_group_ = 0;
  SchedulerCounters counters_;
  PrefixMatchLimit prefix_match_limit_;
  PageDedupHook page_dedup_hook_;
};

}  // namespace m3

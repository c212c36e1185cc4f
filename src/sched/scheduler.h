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
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/page_pool.h"
#include "kv/radix_prefix_index.h"
#include "sched/step_plan.h"

namespace m3 {

struct SchedulerConfig {
  int32_t num_pages = 0;                // KV pool size (kv_pages_for_budget / _for_mem_fraction)
  int32_t page_size = kPageSize;
  int32_t chunked_prefill_size = 8192;  // prefill tokens per step; decode tokens ride along
  int32_t max_running_requests = 256;   // running sequences (n > 1 counts each sequence)
  bool enable_prefix_cache = true;
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
};

struct SchedulerCounters {
  uint64_t num_preemptions = 0;
  uint64_t num_prefix_hit_tokens = 0;  // tokens served from the cache at first admissions
  uint64_t num_steps = 0;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerConfig& config() const { return config_; }

  // Queues a sequence. Invalid argument for an empty prompt, a duplicate id, or a prompt that
  // can never fit the pool (needs more pages than exist).
  Status add(SeqSpec spec);

  // Plans the next step (see the header comment). May preempt sequences (listed in the plan).
  StepPlan plan();

  // Records that `plan` was computed: advances computed positions and indexes newly full pages.
  // Call exactly once per plan, before append_token()/finish() for that step.
  void commit(const StepPlan& plan);

  // Appends a sampled token to a sequence whose slice needed logits in the committed step.
  void append_token(SeqId id, int32_t token);

  // Removes a sequence (finished, cancelled or failed) and releases its pages. Full pages stay in
  // the prefix index. Unknown ids are ignored (cancel may race with finish). Returns true if found.
  bool remove(SeqId id);

  const SequenceState* find(SeqId id) const;
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  std::vector<SeqId> running_ids() const;
  std::vector<SeqId> waiting_ids() const;

  const PagePool& pool() const { return *pool_; }
  const RadixPrefixIndex& prefix_index() const { return *index_; }
  // Drops every cached page no live sequence holds (tests; "flush cache" admin endpoint later).
  void flush_prefix_cache() { index_->evict_all(); }
  const SchedulerCounters& counters() const { return counters_; }

 private:
  using Seq = SequenceState;
  bool ensure_free(int32_t num_pages);  // evicts cached pages; no preemption
  void preempt(Seq* seq, StepPlan* plan);
  void release_pages(Seq* seq);
  void insert_waiting(Seq* seq);
  void insert_running(Seq* seq);
  bool dependency_pending(const Seq& seq) const;
  SeqSlice make_slice(const Seq& seq, int32_t num_new) const;

  SchedulerConfig config_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<RadixPrefixIndex> index_;
  std::unordered_map<SeqId, std::unique_ptr<Seq>> seqs_;
  std::vector<Seq*> running_;  // sorted by arrival
  std::deque<Seq*> waiting_;   // sorted by arrival
  uint64_t next_arrival_ = 0;
  uint64_t step_idx_ = 0;
  SchedulerCounters counters_;
};

}  // namespace m3

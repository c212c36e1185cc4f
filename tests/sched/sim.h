// Scheduler simulation harness (style-anchors.md §6): a scripted "model" appends token
// 1000 + position for every sequence that needs logits; sequences finish after max_new tokens.
// describe() renders a step as a compact string so tests read as tables of expected states.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "sched/scheduler.h"

namespace m3::sim {

struct Sim {
  explicit Sim(SchedulerConfig c) : sched(c) {}

  Scheduler sched;
  std::map<SeqId, int32_t> max_new;  // finish after this many generated tokens
  std::map<SeqId, std::vector<int32_t>> finished_tokens;
  std::vector<int32_t> prefill_per_step;
  int32_t free_after_plan = 0;  // pool free pages right after planning (before finishes)

  void add(SeqId id, std::vector<int32_t> prompt, int32_t new_tokens, SeqId wait_for = -1) {
    SeqSpec s;
    s.id = id;
    s.request_id = static_cast<RequestId>(id);
    s.prompt = std::move(prompt);
    s.wait_for = wait_for;
    ASSERT_TRUE(sched.add(std::move(s)).is_ok());
    max_new[id] = new_tokens;
  }

  // One step: plan, commit, append scripted tokens, finish. Returns the plan.
  StepPlan step() {
    StepPlan plan = sched.plan();
    free_after_plan = sched.pool().num_free();
    sched.commit(plan);
    prefill_per_step.push_back(plan.num_tokens_prefill);
    for (const SeqSlice& s : plan.seqs) {
      if (!s.need_logits) continue;
      sched.append_token(s.seq_id, 1000 + s.end_pos());
      const SequenceState* st = sched.find(s.seq_id);
      if (st->num_generated() >= max_new[s.seq_id]) {
        finished_tokens[s.seq_id] = st->tokens;
        sched.remove(s.seq_id);
      }
    }
    return plan;
  }

  // "A[0,8) B[8,10)* | pre:C | free 3": slices with positions, '*' = logits, preempted ids, free
  // pages once the step is planned (before finished sequences release theirs).
  static std::string describe(const StepPlan& plan, int32_t num_free) {
    std::ostringstream os;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      const SeqSlice& s = plan.seqs[i];
      os << (i ? " " : "") << static_cast<char>('A' + s.seq_id) << "[" << s.start_pos << ","
         << s.end_pos() << ")" << (s.need_logits ? "*" : "");
    }
    if (!plan.preempted.empty()) {
      os << " | pre:";
      for (SeqId id : plan.preempted) os << static_cast<char>('A' + id);
    }
    os << " | free " << num_free;
    return os.str();
  }

  std::string step_str() {
    StepPlan plan = step();
    return describe(plan, free_after_plan);
  }

  // Every page's refcount equals the live sequences holding it plus one if indexed; no two live
  // sequences write the same page (only their last, partial page is written).
  void check_accounting() const {
    const PagePool& pool = sched.pool();
    std::map<PageId, int32_t> holders;
    std::set<PageId> written;
    std::vector<SeqId> ids = sched.running_ids();
    for (SeqId id : sched.waiting_ids()) ids.push_back(id);
    for (SeqId id : ids) {
      const SequenceState* s = sched.find(id);
      for (PageId p : s->pages) ++holders[p];
      if (s->phase == SeqPhase::kWaiting) {
        EXPECT_TRUE(s->pages.empty()) << "waiting holds pages";
      }
      // Pages at or past the first not-yet-full page are private to the sequence.
      const int32_t P = sched.config().page_size;
      for (size_t i = s->num_computed_tokens / P; i < s->pages.size(); ++i) {
        EXPECT_EQ(pool.refcount(s->pages[i]), 1) << "seq " << id << " writes a shared page";
        EXPECT_TRUE(written.insert(s->pages[i]).second);
      }
    }
    int32_t free_or_cached = 0;
    for (PageId p = 0; p < pool.num_pages(); ++p) {
      const int32_t expect = holders[p] + (pool.is_cached(p) ? 1 : 0);
      ASSERT_EQ(pool.refcount(p), expect) << "page " << p;
      if (expect == 0 || (holders[p] == 0 && pool.is_cached(p))) ++free_or_cached;
    }
    EXPECT_EQ(free_or_cached, pool.num_free() + pool.num_cached_only());
  }
};

inline std::vector<int32_t> tokens(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

}  // namespace m3::sim

// Random arrival/length mixes: budget and running limits hold every step, page accounting is
// exact every step, every sequence finishes within a bound (no starvation), the output does not
// depend on batching/preemption/caching, and every page returns to the pool.
#include <gtest/gtest.h>

#include <random>

#include "sim.h"

namespace m3 {
namespace {

struct Case {
  uint32_t seed;
  int32_t pages;
  int32_t budget;
  int32_t max_running;
  bool prefix;
};

class SchedulerProperty : public ::testing::TestWithParam<Case> {};

TEST_P(SchedulerProperty, InvariantsHoldOnRandomWorkloads) {
  const Case c = GetParam();
  std::mt19937 rng(c.seed);
  SchedulerConfig cfg;
  cfg.num_pages = c.pages;
  cfg.page_size = 4;
  cfg.chunked_prefill_size = c.budget;
  cfg.max_running_requests = c.max_running;
  cfg.enable_prefix_cache = c.prefix;
  sim::Sim s(cfg);

  const int32_t num_seqs = 40;
  const int32_t max_tokens_total = c.pages * 4;  // each sequence alone fits the pool
  std::map<SeqId, std::vector<int32_t>> expected;
  SeqId next = 0;
  int step = 0;
  std::map<SeqId, int> arrival_step;
  while (next < num_seqs || s.sched.num_running() + s.sched.num_waiting() > 0) {
    // Arrivals: 0-2 per step; prompts share prefixes (3 "system prompts") to exercise the cache.
    for (int k = rng() % 3; k > 0 && next < num_seqs; --k) {
      const int32_t sys = rng() % 3;
      const int32_t plen = 1 + rng() % 20;
      const int32_t gen = 1 + rng() % 12;
      if (plen + gen - 1 > max_tokens_total) continue;
      std::vector<int32_t> prompt;
      for (int32_t i = 0; i < plen; ++i) prompt.push_back(i < 9 ? sys * 100 + i : next * 7 + i);
      std::vector<int32_t> want = prompt;
      for (int32_t pos = plen; pos < plen + gen; ++pos) want.push_back(1000 + pos);
      expected[next] = want;
      arrival_step[next] = step;
      s.add(next, prompt, gen);
      ++next;
    }
    StepPlan plan = s.step();
    ++step;
    ASSERT_LE(plan.num_tokens_prefill, c.budget) << "step " << step;
    ASSERT_LE(s.sched.num_running(), c.max_running);
    std::set<SeqId> in_plan;
    for (const SeqSlice& sl : plan.seqs) {
      ASSERT_TRUE(in_plan.insert(sl.seq_id).second) << "sequence planned twice";
      ASSERT_EQ(static_cast<int32_t>(sl.block_table.size()),
                num_pages_for_tokens(sl.end_pos(), 4));
    }
    s.check_accounting();
    if (HasFatalFailure()) return;
    ASSERT_LT(step, 5000) << "no progress: starvation or livelock";
  }
  // Every sequence finished with the position-determined tokens.
  ASSERT_EQ(s.finished_tokens.size(), expected.size());
  for (const auto& [id, want] : expected) EXPECT_EQ(s.finished_tokens[id], want) << "seq " << id;
  const PagePool& pool = s.sched.pool();
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_free() + pool.num_cached_only(), pool.num_pages());
  s.sched.flush_prefix_cache();
  EXPECT_EQ(pool.num_free(), pool.num_pages());
  // The workloads are built to exercise the paths the invariants are about.
  if (c.pages <= 12) {
    EXPECT_GT(s.sched.counters().num_preemptions, 0u);
  }
  if (c.prefix) {
    EXPECT_GT(s.sched.counters().num_prefix_hit_tokens, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mixes, SchedulerProperty,
    ::testing::Values(Case{1, 64, 16, 8, true}, Case{2, 64, 16, 8, false},
                      Case{3, 12, 8, 16, true},  // tight pool: lots of preemption
                      Case{4, 12, 8, 16, false}, Case{5, 8, 4, 3, true},
                      Case{6, 30, 64, 32, true}, Case{7, 9, 1, 4, true}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return "seed" + std::to_string(i.param.seed) + "_pages" + std::to_string(i.param.pages) +
             "_budget" + std::to_string(i.param.budget) + (i.param.prefix ? "_prefix" : "");
    });

}  // namespace
}  // namespace m3

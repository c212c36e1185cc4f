// The scheduler with attention data-parallel groups (SchedulerConfig::num_dp_groups > 1): where
// sequences are placed, and that pages, prefix matches and preemption stay within a group.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "sched/scheduler.h"

namespace m3 {
namespace {

SchedulerConfig dp_config(int32_t groups, int32_t pages, LoadBalanceMethod method) {
  SchedulerConfig c;
  c.num_pages = pages;
  c.page_size = 4;
  c.chunked_prefill_size = 64;
  c.max_running_requests = 64;
  c.num_dp_groups = groups;
  c.load_balance = method;
  return c;
}

std::vector<int32_t> prompt(int32_t n, int32_t first) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(first + i);
  return p;
}

Status add(Scheduler& s, SeqId id, std::vector<int32_t> tokens, SeqId wait_for = -1,
           RequestId request_id = 0) {
  SeqSpec spec;
  spec.id = id;
  spec.request_id = request_id == 0 ? static_cast<RequestId>(id + 1) : request_id;
  spec.prompt = std::move(tokens);
  spec.wait_for = wait_for;
  return s.add(std::move(spec));
}

int32_t group_of(const Scheduler& s, SeqId id) { return s.find(id)->dp_group; }

// Checks the invariants of a planned step: every slice names a group, its pages are ids of that
// group's pool, and a page a slice writes (the pages under [start_pos, end_pos)) is in no other
// slice's block table of the same group. Returns the number of slices per group.
std::vector<int32_t> check_plan(const Scheduler& s, const StepPlan& plan) {
  const int32_t D = s.num_dp_groups();
  std::vector<int32_t> per_group(static_cast<size_t>(D), 0);
  std::map<std::pair<int32_t, PageId>, int32_t> holders;  // (group, page) -> slices holding it
  for (const SeqSlice& sl : plan.seqs) {
    EXPECT_GE(sl.dp_group, 0);
    EXPECT_LT(sl.dp_group, D);
    EXPECT_EQ(sl.dp_group, s.find(sl.seq_id)->dp_group);
    ++per_group[static_cast<size_t>(sl.dp_group)];
    for (PageId p : sl.block_table) {
      EXPECT_GE(p, 0);
      EXPECT_LT(p, s.pool(sl.dp_group).num_pages());
      ++holders[{sl.dp_group, p}];
    }
  }
  for (const SeqSlice& sl : plan.seqs) {
    const int32_t P = plan.page_size;
    for (int32_t i = sl.start_pos / P; i < (sl.end_pos() + P - 1) / P; ++i) {
      const PageId p = sl.block_table[static_cast<size_t>(i)];
      EXPECT_EQ((holders[{sl.dp_group, p}]), 1)
          << "page " << p << " of group " << sl.dp_group << " is written by sequence "
          << sl.seq_id << " and held by another sequence";
    }
  }
  return per_group;
}

// Commits a plan and feeds every slice that needs logits a token (1000 + position).
void commit_and_append(Scheduler& s, const StepPlan& plan) {
  s.commit(plan);
  for (const SeqSlice& sl : plan.seqs) {
    if (sl.need_logits) s.append_token(sl.seq_id, 1000 + sl.end_pos());
  }
}

TEST(SchedulerDp, LoadBalanceMethodNames) {
  for (const char* name : {"round_robin", "minimum_tokens", "shortest_queue"}) {
    auto m = parse_load_balance_method(name);
    ASSERT_TRUE(m.is_ok()) << name;
    EXPECT_EQ(std::string(load_balance_method_name(*m)), name);
  }
  auto bad = parse_load_balance_method("least_loaded");
  ASSERT_FALSE(bad.is_ok());
  for (const char* named : {"--load-balance-method", "least_loaded", "round_robin",
                            "minimum_tokens", "shortest_queue"}) {
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().message();
  }
}

TEST(SchedulerDp, OneGroupKeepsTheFlagsBudgets) {
  Scheduler s(dp_config(1, 16, LoadBalanceMethod::kRoundRobin));
  EXPECT_EQ(s.num_dp_groups(), 1);
  EXPECT_EQ(s.group_max_running(), 64);
  EXPECT_EQ(s.group_prefill_budget(), 64);
  Scheduler d(dp_config(4, 16, LoadBalanceMethod::kRoundRobin));
  EXPECT_EQ(d.group_max_running(), 16);  // SGLang: the flags divided by the DP size
  EXPECT_EQ(d.group_prefill_budget(), 16);
}

TEST(SchedulerDp, RoundRobinPlacesRequestsInTurnAndSiblingsWithTheirLeader) {
  Scheduler s(dp_config(2, 32, LoadBalanceMethod::kRoundRobin));
  ASSERT_TRUE(add(s, 0, prompt(6, 1)).is_ok());
  ASSERT_TRUE(add(s, 1, prompt(6, 1), /*wait_for=*/0).is_ok());      // n = 2, shares the prompt
  ASSERT_TRUE(add(s, 2, prompt(3, 50)).is_ok());
  ASSERT_TRUE(add(s, 3, prompt(3, 60), -1, /*request_id=*/100).is_ok());  // n = 2 without
  ASSERT_TRUE(add(s, 4, prompt(3, 60), -1, /*request_id=*/100).is_ok());  // sharing: same request
  ASSERT_TRUE(add(s, 5, prompt(3, 70)).is_ok());
  EXPECT_EQ(group_of(s, 0), 0);
  EXPECT_EQ(group_of(s, 1), 0);
  EXPECT_EQ(group_of(s, 2), 1);
  EXPECT_EQ(group_of(s, 3), 0);
  EXPECT_EQ(group_of(s, 4), 0);
  EXPECT_EQ(group_of(s, 5), 1);
  EXPECT_EQ(s.num_waiting(0), 4);
  EXPECT_EQ(s.num_waiting(1), 2);
  EXPECT_EQ(s.num_waiting(), 6);
  EXPECT_EQ(s.waiting_ids(), (std::vector<SeqId>{0, 1, 2, 3, 4, 5}));  // merged by arrival
}

TEST(SchedulerDp, MinimumTokensAndShortestQueueWeighTheGroupsLoad) {
  Scheduler t(dp_config(2, 64, LoadBalanceMethod::kMinimumTokens));
  ASSERT_TRUE(add(t, 0, prompt(30, 1)).is_ok());  // tie: group 0
  ASSERT_TRUE(add(t, 1, prompt(5, 100)).is_ok());
  ASSERT_TRUE(add(t, 2, prompt(5, 200)).is_ok());
  ASSERT_TRUE(add(t, 3, prompt(5, 300)).is_ok());
  EXPECT_EQ(group_of(t, 0), 0);
  for (SeqId id : {1, 2, 3}) EXPECT_EQ(group_of(t, id), 1) << id;  // 5, 10, 15 < 30 tokens
  EXPECT_EQ(t.num_live_tokens(0), 30);
  EXPECT_EQ(t.num_live_tokens(1), 15);
  // Tokens in use count too: run a step, then the group with fewer tokens gets the next one.
  StepPlan plan = t.plan();
  check_plan(t, plan);
  commit_and_append(t, plan);
  EXPECT_EQ(t.num_live_tokens(0), 31);
  EXPECT_EQ(t.num_live_tokens(1), 18);
  ASSERT_TRUE(add(t, 4, prompt(30, 400)).is_ok());
  EXPECT_EQ(group_of(t, 4), 1);  // 18 < 31
  ASSERT_TRUE(add(t, 5, prompt(5, 500)).is_ok());
  EXPECT_EQ(group_of(t, 5), 0);  // 31 < 48

  Scheduler q(dp_config(2, 64, LoadBalanceMethod::kShortestQueue));
  ASSERT_TRUE(add(q, 0, prompt(40, 1)).is_ok());
  ASSERT_TRUE(add(q, 1, prompt(5, 100)).is_ok());
  ASSERT_TRUE(add(q, 2, prompt(5, 200)).is_ok());  // 1 each: tie, group 0
  ASSERT_TRUE(add(q, 3, prompt(5, 300)).is_ok());
  EXPECT_EQ(group_of(q, 0), 0);
  EXPECT_EQ(group_of(q, 1), 1);
  EXPECT_EQ(group_of(q, 2), 0);
  EXPECT_EQ(group_of(q, 3), 1);
  q.remove(0);
  q.remove(2);
  ASSERT_TRUE(add(q, 4, prompt(5, 400)).is_ok());
  EXPECT_EQ(group_of(q, 4), 0);  // 0 sequences left in group 0, 2 in group 1
}

// Group 0 is full while group 1 has room: group 0's next request waits (placement is fixed), group
// 1's requests run, and preemption in group 0 never touches group 1.
TEST(SchedulerDp, PoolExhaustionAndPreemptionStayInTheirGroup) {
  Scheduler s(dp_config(2, 6, LoadBalanceMethod::kRoundRobin));  // 6 pages of 4 tokens a group
  ASSERT_TRUE(add(s, 0, prompt(20, 1)).is_ok());    // group 0: 5 pages
  ASSERT_TRUE(add(s, 1, prompt(4, 100)).is_ok());   // group 1
  ASSERT_TRUE(add(s, 2, prompt(8, 200)).is_ok());   // group 0: does not fit next to sequence 0
  ASSERT_TRUE(add(s, 3, prompt(4, 300)).is_ok());   // group 1
  StepPlan plan = s.plan();
  std::vector<int32_t> per_group = check_plan(s, plan);
  EXPECT_EQ(per_group, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(s.find(2)->phase, SeqPhase::kWaiting);
  EXPECT_EQ(s.find(2)->dp_group, 0);
  EXPECT_EQ(s.pool(0).num_free(), 1);
  EXPECT_EQ(s.pool(1).num_free(), 4);
  commit_and_append(s, plan);

  // Sequence 0 decodes into a sixth page, then needs a seventh: the only victim in its group is
  // itself (group 1's pages are not its to take).
  int preempted_at = -1;
  for (int step = 0; step < 12 && preempted_at < 0; ++step) {
    plan = s.plan();
    check_plan(s, plan);
    for (SeqId id : plan.preempted) {
      EXPECT_EQ(group_of(s, id), 0) << "preempted sequence " << id;
      preempted_at = step;
    }
    commit_and_append(s, plan);
  }
  EXPECT_GE(preempted_at, 0) << "group 0's pool never ran out";
  EXPECT_GT(s.counters(0).num_preemptions, 0u);
  EXPECT_EQ(s.counters(1).num_preemptions, 0u);
  EXPECT_EQ(s.counters().num_preemptions, s.counters(0).num_preemptions);
  EXPECT_EQ(s.find(1)->phase, SeqPhase::kDecoding);
  EXPECT_EQ(s.find(3)->phase, SeqPhase::kDecoding);
}

TEST(SchedulerDp, PrefixCacheHitsOnlyInItsGroup) {
  Scheduler s(dp_config(2, 32, LoadBalanceMethod::kRoundRobin));
  const std::vector<int32_t> shared = prompt(9, 1);  // 2 full pages + 1 token
  ASSERT_TRUE(add(s, 0, shared).is_ok());            // group 0
  StepPlan plan = s.plan();
  check_plan(s, plan);
  commit_and_append(s, plan);
  EXPECT_EQ(s.prefix_index(0).num_nodes(), 2);
  EXPECT_EQ(s.prefix_index(1).num_nodes(), 0);
  ASSERT_TRUE(add(s, 1, shared).is_ok());  // group 1: nothing cached there
  ASSERT_TRUE(add(s, 2, shared).is_ok());  // group 0: two pages cached
  EXPECT_EQ(group_of(s, 1), 1);
  EXPECT_EQ(group_of(s, 2), 0);
  plan = s.plan();
  check_plan(s, plan);
  EXPECT_EQ(s.find(1)->num_cached_prompt_tokens, 0);
  EXPECT_EQ(s.find(2)->num_cached_prompt_tokens, 8);
  EXPECT_EQ(s.find(2)->pages[0], s.find(0)->pages[0]);  // the same page of group 0's pool
  EXPECT_EQ(s.counters(0).num_prefix_hit_tokens, 8u);
  EXPECT_EQ(s.counters(1).num_prefix_hit_tokens, 0u);
  commit_and_append(s, plan);
  EXPECT_EQ(s.prefix_index(1).num_nodes(), 2);  // group 1 indexed its own copy
  s.remove(0);
  s.remove(1);
  s.remove(2);
  s.flush_prefix_cache();
  EXPECT_EQ(s.pool(0).num_free(), 32);
  EXPECT_EQ(s.pool(1).num_free(), 32);
}

TEST(SchedulerDp, AStepWithOneGroupEmptyAndPerGroupBudgets) {
  SchedulerConfig c = dp_config(2, 32, LoadBalanceMethod::kRoundRobin);
  c.chunked_prefill_size = 16;  // 8 prefill tokens per group and step
  c.max_running_requests = 2;   // 1 running sequence per group
  Scheduler s(c);
  ASSERT_TRUE(add(s, 0, prompt(20, 1)).is_ok());  // group 0
  StepPlan plan = s.plan();
  EXPECT_EQ(check_plan(s, plan), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(plan.num_tokens_prefill, 8);
  commit_and_append(s, plan);
  ASSERT_TRUE(add(s, 1, prompt(4, 100)).is_ok());  // group 1
  ASSERT_TRUE(add(s, 2, prompt(4, 200)).is_ok());  // group 0: its one running slot is taken
  plan = s.plan();
  EXPECT_EQ(check_plan(s, plan), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(plan.num_tokens_prefill, 12);
  EXPECT_EQ(s.find(2)->phase, SeqPhase::kWaiting);
  EXPECT_EQ(s.num_running(0), 1);
  EXPECT_EQ(s.num_running(1), 1);
}

// The groups' steps are one: a sequence decoding in group 0 caps group 1's prefill chunk too
// (chunked_prefill_size_while_decoding, divided over the groups like chunked_prefill_size).
TEST(SchedulerDp, DecodingInOneGroupCapsTheOthersPrefill) {
  SchedulerConfig c = dp_config(2, 32, LoadBalanceMethod::kRoundRobin);
  c.chunked_prefill_size = 32;                 // 16 per group
  c.chunked_prefill_size_while_decoding = 4;   // 2 per group while anything decodes
  Scheduler s(c);
  ASSERT_TRUE(add(s, 0, prompt(3, 1)).is_ok());  // group 0
  StepPlan plan = s.plan();
  EXPECT_EQ(plan.num_tokens_prefill, 3);
  commit_and_append(s, plan);                     // 0 now decodes
  ASSERT_TRUE(add(s, 1, prompt(12, 100)).is_ok());  // group 1
  plan = s.plan();
  EXPECT_EQ(check_plan(s, plan), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(plan.num_tokens_decode, 1);
  EXPECT_EQ(plan.num_tokens_prefill, 2);
  commit_and_append(s, plan);
  s.remove(0);                                    // nothing decodes: the group's 16 again
  plan = s.plan();
  EXPECT_EQ(plan.num_tokens_prefill, 10);
}

TEST(SchedulerDp, APromptLargerThanAGroupsPoolIsRefused) {
  Scheduler s(dp_config(2, 4, LoadBalanceMethod::kRoundRobin));
  Status st = add(s, 0, prompt(17, 1));
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("per DP group"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace m3

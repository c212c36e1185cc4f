// Step-by-step scheduler simulations: each test is a table of the expected plan per step.
#include <gtest/gtest.h>

#include "sim.h"

namespace m3 {
namespace {

using sim::Sim;
using sim::tokens;

SchedulerConfig config(int32_t pages, int32_t budget, int32_t max_running, bool prefix) {
  SchedulerConfig c;
  c.num_pages = pages;
  c.page_size = 4;
  c.chunked_prefill_size = budget;
  c.max_running_requests = max_running;
  c.enable_prefix_cache = prefix;
  return c;
}

TEST(SchedulerSim, ChunkedPrefillMixesWithDecode) {
  Sim s(config(16, 8, 4, false));
  s.add(0, tokens(0, 10), 3);  // A
  s.add(1, tokens(0, 3), 2);   // B
  const std::vector<std::string> expected = {
      "A[0,8) | free 14",            // budget 8 spent on A's first chunk; B waits
      "A[8,10)* B[0,3)* | free 12",  // A's last chunk (2) + B's whole prompt (3) <= 8
      "A[10,11)* B[3,4)* | free 12",  // both decode; B reaches 2 tokens and leaves
      "A[11,12)* | free 13",          // B's page is back; A finishes
      " | free 16",  // A finished last step
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.step_str(), expected[i]) << "step " << i;
    s.check_accounting();
  }
  EXPECT_EQ(s.finished_tokens[0],
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1010, 1011, 1012}));
}

// chunked_prefill_size_while_decoding: while any sequence decodes a prompt prefills in chunks of
// that budget; before anything decodes, and once nothing does, in chunked_prefill_size chunks.
TEST(SchedulerSim, SmallerPrefillBudgetWhileSequencesDecode) {
  SchedulerConfig c = config(32, 8, 4, false);
  c.chunked_prefill_size_while_decoding = 2;
  Sim s(c);
  s.add(0, tokens(0, 8), 3);    // A: one whole chunk (nothing decodes yet)
  const std::vector<std::string> first = {"A[0,8)* | free 30"};
  EXPECT_EQ(s.step_str(), first[0]);
  s.add(1, tokens(0, 9), 1);    // B arrives while A decodes: chunks of 2
  const std::vector<std::string> expected = {
      "A[8,9)* B[0,2) | free 28",
      "A[9,10)* B[2,4) | free 28",   // A's third token: it leaves
      "B[4,9)* | free 29",           // nothing decodes: the rest (5 <= 8) at once
      " | free 32",
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.step_str(), expected[i]) << "step " << i;
    s.check_accounting();
  }
}

TEST(SchedulerSim, PreemptsNewestAndRecomputesSameOutput) {
  Sim s(config(4, 16, 4, false));
  s.add(0, tokens(0, 6), 8);  // A
  s.add(1, tokens(0, 5), 8);  // B
  const std::vector<std::string> expected = {
      "A[0,6)* B[0,5)* | free 0",
      "A[6,7)* B[5,6)* | free 0",
      "A[7,8)* B[6,7)* | free 0",
      "A[8,9)* | pre:B | free 1",  // A needs a 3rd page: newest (B) is preempted, pages freed
      "A[9,10)* | free 1",         // B's 8 tokens need 2 pages: it waits
      "A[10,11)* | free 1",
      "A[11,12)* | free 1",
      "A[12,13)* | free 0",        // A takes its 4th page and finishes
      "B[0,8)* | free 2",          // B recomputes prompt + its 3 tokens in one chunk
      "B[8,9)* | free 1",
      "B[9,10)* | free 1",
      "B[10,11)* | free 1",
      "B[11,12)* | free 1",
      " | free 4",
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.step_str(), expected[i]) << "step " << i;
    s.check_accounting();
  }
  // The scripted model's token depends only on the position: recompute changed nothing.
  std::vector<int32_t> b = tokens(0, 5);
  for (int32_t pos = 5; pos < 13; ++pos) b.push_back(1000 + pos);
  EXPECT_EQ(s.finished_tokens[1], b);
  EXPECT_EQ(s.sched.counters().num_preemptions, 1u);
  EXPECT_EQ(s.sched.pool().num_free(), 4);
}

TEST(SchedulerSim, PrefixHitSkipsCachedPagesButRecomputesTheLastToken) {
  Sim s(config(16, 64, 4, true));
  s.add(0, tokens(0, 10), 1);  // A: computes and indexes pages [0..3], [4..7]
  EXPECT_EQ(s.step_str(), "A[0,10)* | free 13");  // then A finishes: page 3 freed
  EXPECT_EQ(s.sched.pool().num_cached_only(), 2);
  EXPECT_EQ(s.sched.prefix_index().num_nodes(), 2);

  std::vector<int32_t> b = tokens(0, 10);
  b.push_back(50);
  b.push_back(51);
  s.add(1, b, 1);               // B: shares both pages, computes [8,12)
  s.add(2, tokens(0, 8), 1);    // C: whole prompt is cached; recomputes its last page [4,8)
  EXPECT_EQ(s.step_str(), "B[8,12)* C[4,8)* | free 12");
  EXPECT_EQ(s.sched.find(1), nullptr);  // finished after 1 token
  EXPECT_EQ(s.sched.counters().num_prefix_hit_tokens, 8u + 4u);
  EXPECT_EQ(s.finished_tokens[1].back(), 1012);
  EXPECT_EQ(s.finished_tokens[2].back(), 1008);
  s.check_accounting();
  // B indexed its third page; C's page [4..7] duplicated A's and was swapped to it.
  EXPECT_EQ(s.sched.prefix_index().num_nodes(), 3);
  EXPECT_EQ(s.sched.pool().num_cached_only(), 3);
  EXPECT_EQ(s.sched.pool().num_free(), 13);
  s.sched.flush_prefix_cache();
  EXPECT_EQ(s.sched.pool().num_free(), 16);
}

TEST(SchedulerSim, CachedTokensRecordedAtFirstAdmissionOnly) {
  Sim s(config(16, 64, 4, true));
  s.add(0, tokens(0, 9), 1);
  s.step();
  s.add(1, tokens(0, 9), 1);
  StepPlan p = s.sched.plan();
  EXPECT_EQ(s.sched.find(1)->num_cached_prompt_tokens, 8);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].start_pos, 8);
  EXPECT_EQ(p.seqs[0].block_table.size(), 3u);
  EXPECT_EQ(p.seqs[0].block_table[0], 0);  // A's pages
  EXPECT_EQ(p.seqs[0].block_table[1], 1);
}

TEST(SchedulerSim, SiblingsWaitForLeaderPrefillThenShareItsPages) {
  Sim s(config(16, 64, 4, true));
  s.add(0, tokens(0, 9), 2);                      // A: leader (n = 2)
  s.add(1, tokens(0, 9), 2, /*wait_for=*/0);      // B: sibling
  EXPECT_EQ(s.step_str(), "A[0,9)* | free 13");   // B waits: A is prefilling
  EXPECT_EQ(s.step_str(), "A[9,10)* B[8,9)* | free 12");  // B reuses A's 2 full pages
  EXPECT_EQ(s.sched.find(1)->num_cached_prompt_tokens, 8);
  s.check_accounting();
}

TEST(SchedulerSim, MaxRunningRequestsCapsAdmission) {
  Sim s(config(32, 64, 2, false));
  s.add(0, tokens(0, 2), 2);
  s.add(1, tokens(0, 2), 2);
  s.add(2, tokens(0, 2), 2);
  EXPECT_EQ(s.step_str(), "A[0,2)* B[0,2)* | free 30");
  EXPECT_EQ(s.sched.num_waiting(), 1);
  EXPECT_EQ(s.step_str(), "A[2,3)* B[2,3)* | free 30");  // both finish after this step
  EXPECT_EQ(s.step_str(), "C[0,2)* | free 31");
}

TEST(SchedulerSim, StrictFcfsAdmissionDoesNotLetYoungerOvertake) {
  Sim s(config(4, 64, 8, false));
  s.add(0, tokens(0, 8), 5);  // A: 2 pages, then a 3rd for its decode
  EXPECT_EQ(s.step_str(), "A[0,8)* | free 2");
  s.add(1, tokens(0, 12), 1);  // B needs 3 pages: does not fit
  s.add(2, tokens(0, 2), 1);   // C would fit in the 1 free page but must not overtake B
  const std::vector<std::string> expected = {
      "A[8,9)* | free 1",
      "A[9,10)* | free 1",
      "A[10,11)* | free 1",
      "A[11,12)* | free 1",         // A finishes: 4 pages free
      "B[0,12)* C[0,2)* | free 0",  // B first, then C
  };
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.step_str(), expected[i]) << "step " << i + 1;
  }
}

TEST(SchedulerSim, RemoveFreesPagesImmediately) {
  Sim s(config(8, 64, 4, false));
  s.add(0, tokens(0, 10), 100);
  s.step();
  EXPECT_EQ(s.sched.pool().num_free(), 5);
  EXPECT_TRUE(s.sched.remove(0));
  EXPECT_EQ(s.sched.pool().num_free(), 8);
  EXPECT_FALSE(s.sched.remove(0));
  EXPECT_TRUE(s.sched.plan().empty());
}

TEST(SchedulerSim, AddRejectsWhatCanNeverRun) {
  Scheduler sched(config(2, 64, 4, false));
  SeqSpec empty;
  empty.id = 1;
  EXPECT_EQ(sched.add(empty).code(), StatusCode::kInvalidArgument);
  SeqSpec big;
  big.id = 2;
  big.prompt = tokens(0, 9);  // 3 pages > 2
  Status st = sched.add(big);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("3 KV pages"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace m3

// Verify slices in the scheduler: a decoding sequence with drafts gets [last token, drafts] with
// pages for all of them; after the step only the last token counts as computed, and
// append_verified advances by the accepted drafts, indexes full pages and gives the rejected
// drafts' pages back.
#include <gtest/gtest.h>

#include <numeric>

#include "sched/scheduler.h"

namespace m3 {
namespace {

TEST(SchedulerSpeculative, VerifySlicePagesAndAcceptance) {
  SchedulerConfig c;
  c.num_pages = 16;
  c.page_size = 4;
  c.chunked_prefill_size = 64;
  Scheduler s(c);
  std::vector<int32_t> prompt(6);
  std::iota(prompt.begin(), prompt.end(), 100);
  ASSERT_TRUE(s.add(SeqSpec{7, 1, 0, prompt, -1, true, {}}).is_ok());
  EXPECT_FALSE(s.set_draft(7, {1, 2}));  // not decoding yet
  StepPlan p = s.plan();
  ASSERT_EQ(p.seqs.size(), 1u);
  s.commit(p);
  s.append_token(7, 50);  // the prefill's token: the anchor at position 6
  ASSERT_TRUE(s.set_draft(7, {51, 52, 53, 54, 55}));

  p = s.plan();
  ASSERT_EQ(p.seqs.size(), 1u);
  const SeqSlice& v = p.seqs[0];
  EXPECT_EQ(v.token_ids, (std::vector<int32_t>{50, 51, 52, 53, 54, 55}));
  EXPECT_EQ(v.start_pos, 6);
  EXPECT_EQ(v.num_draft, 5);
  EXPECT_TRUE(v.need_logits && v.is_decode());
  EXPECT_EQ(p.num_tokens_decode, 6);
  EXPECT_EQ(v.block_table.size(), 3u);  // positions 0..11
  EXPECT_EQ(s.pool().num_free(), 13);
  s.commit(p);
  const SequenceState* st = s.find(7);
  EXPECT_EQ(st->num_computed_tokens, 7);  // the anchor only
  EXPECT_TRUE(st->draft_tokens.empty());

  // Two drafts accepted, then the target's token: K/V valid up to position 8.
  s.append_verified(7, std::vector<int32_t>{51, 52, 60}, 2);
  st = s.find(7);
  EXPECT_EQ(st->num_computed_tokens, 9);
  EXPECT_EQ(st->num_tokens(), 10);
  EXPECT_EQ(st->pages.size(), 3u);  // positions 0..8 need 3 pages: nothing to give back yet
  EXPECT_EQ(st->num_indexed_pages, 2);  // positions 0..7 are full pages
  EXPECT_EQ(s.pool().num_free(), 13);

  // Nothing accepted from a verify that reached a fourth page: that page goes back.
  ASSERT_TRUE(s.set_draft(7, {70, 71, 72, 73, 74}));
  p = s.plan();
  ASSERT_EQ(p.seqs[0].block_table.size(), 4u);  // positions 0..14
  EXPECT_EQ(s.pool().num_free(), 12);
  s.commit(p);
  s.append_verified(7, std::vector<int32_t>{61}, 0);
  st = s.find(7);
  EXPECT_EQ(st->num_computed_tokens, 10);
  EXPECT_EQ(st->pages.size(), 3u);
  EXPECT_EQ(s.pool().num_free(), 13);

  // Removing the sequence gives every page back, drafts set or not.
  ASSERT_TRUE(s.set_draft(7, {80}));
  s.remove(7);
  EXPECT_EQ(s.pool().num_used(), 0);
}

}  // namespace
}  // namespace m3

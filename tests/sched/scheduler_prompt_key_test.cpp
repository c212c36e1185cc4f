// SeqSpec::prompt_key: the prefix cache matches and indexes a prompt by its key, so positions
// whose input is not their token (image features) are shared only when their key values agree.
#include <gtest/gtest.h>

#include <numeric>

#include "sched/scheduler.h"

namespace m3 {
namespace {

// Prefills a sequence, then finishes it, leaving its full pages in the prefix index; returns the
// prompt tokens served from the cache at its admission.
int32_t run(Scheduler& s, SeqId id, const std::vector<int32_t>& prompt,
            const std::vector<int32_t>& key) {
  SeqSpec spec;
  spec.id = id;
  spec.request_id = uint64_t(id);
  spec.prompt = prompt;
  spec.prompt_key = key;
  EXPECT_TRUE(s.add(std::move(spec)).is_ok());
  StepPlan p = s.plan();
  EXPECT_EQ(p.seqs.size(), 1u);
  const int32_t cached = s.find(id)->num_cached_prompt_tokens;
  s.commit(p);
  s.append_token(id, 7);
  s.remove(id);
  return cached;
}

TEST(SchedulerPromptKey, SharesPagesOnlyWhereKeysAgree) {
  SchedulerConfig c;
  c.num_pages = 32;
  c.page_size = 4;
  c.chunked_prefill_size = 64;
  Scheduler s(c);
  std::vector<int32_t> prompt(13);
  std::iota(prompt.begin(), prompt.end(), 100);
  // Positions 4..7 hold "image A" or "image B": the same placeholder tokens, other keys.
  std::vector<int32_t> key_a = prompt, key_b = prompt;
  for (int i = 4; i < 8; ++i) key_a[size_t(i)] = -1000 - i, key_b[size_t(i)] = -2000 - i;

  EXPECT_EQ(run(s, 1, prompt, key_a), 0);
  EXPECT_EQ(run(s, 2, prompt, key_a), 12);  // all three full pages: same image
  EXPECT_EQ(run(s, 3, prompt, key_b), 4);   // only the page before the image
  EXPECT_EQ(run(s, 4, prompt, key_b), 12);  // image B's pages are cached now
  EXPECT_EQ(run(s, 5, prompt, {}), 4);      // plain tokens never match a keyed page
  // A key must cover the prompt exactly.
  SeqSpec bad;
  bad.id = 9;
  bad.prompt = prompt;
  bad.prompt_key = std::vector<int32_t>(5, 0);
  EXPECT_FALSE(s.add(std::move(bad)).is_ok());
}

}  // namespace
}  // namespace m3

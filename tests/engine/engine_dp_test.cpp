// The engine over a runner with attention data-parallel groups (ModelRunner::dp_groups() == 2):
// every group has its own paged KV store here, so a slice that names the wrong group, a page id
// of another group's pool, or a page written while another live sequence of its group holds it
// reads back the wrong context and changes the greedy output.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "engine_test_util.h"

namespace m3::testing {
namespace {

// Runs each group's slices on its own FakeModel (its own KV store) and puts the logits back in
// the step's order. Records, per step, the group of every slice, and counts broken invariants.
class DpFakeModel : public ModelRunner {
 public:
  DpFakeModel(int32_t groups, int32_t vocab, int32_t pages, int32_t page_size)
      : vocab_(vocab), pages_(pages), page_size_(page_size) {
    for (int32_t g = 0; g < groups; ++g) {
      group_models.push_back(std::make_unique<FakeModel>(vocab, pages, page_size));
    }
  }
  int32_t vocab_size() const override { return vocab_; }
  int32_t hidden_size() const override { return 8; }
  int32_t num_kv_pages() const override { return pages_; }
  int32_t page_size() const override { return page_size_; }
  int32_t dp_groups() const override { return static_cast<int32_t>(group_models.size()); }

  Status forward(const ModelStep& step, ModelOutput& out) override {
    const int32_t D = dp_groups();
    std::vector<ModelStep> parts(static_cast<size_t>(D));
    std::vector<std::vector<size_t>> index(static_cast<size_t>(D));  // part row -> step row
    std::vector<int32_t>& groups = step_groups.emplace_back();
    std::map<std::pair<int32_t, PageId>, int32_t> holders;
    for (size_t i = 0; i < step.slices.size(); ++i) {
      const ModelSlice& s = step.slices[i];
      groups.push_back(s.dp_group);
      if (s.dp_group < 0 || s.dp_group >= D) {
        ++bad_groups;
        return internal_error("[dp_fake_model] slice names group " + std::to_string(s.dp_group));
      }
      for (PageId p : s.block_table) {
        if (p < 0 || p >= pages_) ++pages_out_of_range;
        ++holders[{s.dp_group, p}];
      }
      parts[static_cast<size_t>(s.dp_group)].slices.push_back(s);
      index[static_cast<size_t>(s.dp_group)].push_back(i);
    }
    if (pages_out_of_range > 0) return internal_error("[dp_fake_model] page id out of range");
    // A page a slice writes must be its own in this step (shared prefix pages are full, never
    // written).
    for (const ModelSlice& s : step.slices) {
      const int32_t end = s.start_pos + static_cast<int32_t>(s.tokens.size());
      for (int32_t i = s.start_pos / page_size_; i < (end + page_size_ - 1) / page_size_; ++i) {
        if (holders[{s.dp_group, s.block_table[static_cast<size_t>(i)]}] != 1) ++shared_writes;
      }
    }
    out.logits.assign(step.slices.size(), {});
    out.tokens.clear();
    for (int32_t g = 0; g < D; ++g) {
      if (parts[static_cast<size_t>(g)].slices.empty()) continue;  // this group idles the step
      ModelOutput part;
      M3_RETURN_IF_ERROR(group_models[static_cast<size_t>(g)]->forward(parts[static_cast<size_t>(g)], part));
      const std::vector<size_t>& rows = index[static_cast<size_t>(g)];
      for (size_t j = 0; j < rows.size(); ++j) out.logits[rows[j]] = std::move(part.logits[j]);
    }
    return Status::ok();
  }

  int64_t corrupt_reads() const {
    int64_t n = 0;
    for (const auto& m : group_models) n += m->corrupt_reads;
    return n;
  }

  std::vector<std::unique_ptr<FakeModel>> group_models;
  std::vector<std::vector<int32_t>> step_groups;  // per step, each slice's group
  int64_t bad_groups = 0, pages_out_of_range = 0, shared_writes = 0;

 private:
  int32_t vocab_, pages_, page_size_;
};

struct DpEngine {
  std::unique_ptr<Engine> engine;
  DpFakeModel* model = nullptr;
};

DpEngine make_dp_engine(int32_t pages, LoadBalanceMethod method, int32_t max_running = 16,
                        int32_t budget = 32) {
  auto model = std::make_unique<DpFakeModel>(2, 50, pages, 4);
  DpEngine out;
  out.model = model.get();
  EngineConfig c;
  c.scheduler.page_size = 4;
  c.scheduler.chunked_prefill_size = budget;
  c.scheduler.max_running_requests = max_running;
  c.scheduler.load_balance = method;
  auto e = Engine::create(std::move(c), std::move(model));
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  out.engine = std::move(e).value();
  return out;
}

std::vector<int32_t> tokens_from(int32_t first, int32_t n) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((first + i * 7) % 50);
  return p;
}

RequestHandle submit_greedy(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerateRequest r;
  r.prompt_tokens = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  auto h = e.submit(std::move(r));
  EXPECT_TRUE(h.is_ok()) << h.status().to_string();
  return std::move(h).value();
}

// The groups the requests' sequences were placed on, read while they are live.
std::vector<int32_t> groups_of(const Engine& e, const std::vector<RequestHandle>& handles) {
  std::map<RequestId, int32_t> by_request;
  const Scheduler& s = e.scheduler();
  std::vector<SeqId> ids = s.running_ids();
  for (SeqId id : s.waiting_ids()) ids.push_back(id);
  for (SeqId id : ids) by_request[s.find(id)->request_id] = s.find(id)->dp_group;
  std::vector<int32_t> out;
  for (const RequestHandle& h : handles) {
    auto it = by_request.find(h.id());
    out.push_back(it == by_request.end() ? -1 : it->second);
  }
  return out;
}

// Every request's tokens are the greedy continuation of its own prompt (so each logits row came
// back to its own request), and the runner saw no broken invariant.
void expect_greedy_and_clean(const DpFakeModel& m, const std::vector<Outcome>& out,
                             const std::vector<std::vector<int32_t>>& prompts,
                             const std::vector<int32_t>& max_tokens) {
  ASSERT_EQ(out.size(), prompts.size());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(out[i].done) << "request " << i;
    EXPECT_TRUE(out[i].error.is_ok()) << out[i].error.to_string();
    const int32_t n = max_tokens.size() == 1 ? max_tokens[0] : max_tokens[i];
    EXPECT_EQ(out[i].tokens[0], greedy_reference(prompts[i], 50, n)) << "request " << i;
  }
  EXPECT_EQ(m.corrupt_reads(), 0);
  EXPECT_EQ(m.bad_groups, 0);
  EXPECT_EQ(m.pages_out_of_range, 0);
  EXPECT_EQ(m.shared_writes, 0);
}

TEST(EngineDp, RoundRobinPlacementAndOutputsInOrder) {
  DpEngine d = make_dp_engine(32, LoadBalanceMethod::kRoundRobin);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestHandle> handles;
  for (int32_t i = 0; i < 5; ++i) {
    prompts.push_back(tokens_from(3 * i + 1, 5 + i));
    handles.push_back(submit_greedy(*d.engine, prompts.back(), 6));
  }
  d.engine->step();
  EXPECT_EQ(groups_of(*d.engine, handles), (std::vector<int32_t>{0, 1, 0, 1, 0}));
  // Both groups in one step, each slice naming its group.
  ASSERT_FALSE(d.model->step_groups.empty());
  EXPECT_EQ(d.model->step_groups[0], (std::vector<int32_t>{0, 0, 0, 1, 1}));
  auto out = run_all(*d.engine, handles, {1, 1, 1, 1, 1});
  expect_greedy_and_clean(*d.model, out, prompts, {6});
  const EngineStats st = d.engine->stats();
  ASSERT_EQ(st.dp_groups.size(), 2u);
  EXPECT_EQ(st.kv_pages_total, 64);
  EXPECT_EQ(st.dp_groups[0].kv_pages_total, 32);
  EXPECT_EQ(st.dp_groups[1].kv_pages_total, 32);
}

TEST(EngineDp, MinimumTokensPlacement) {
  DpEngine d = make_dp_engine(32, LoadBalanceMethod::kMinimumTokens);
  std::vector<std::vector<int32_t>> prompts = {tokens_from(1, 30), tokens_from(2, 5),
                                               tokens_from(3, 5), tokens_from(4, 5)};
  std::vector<RequestHandle> handles;
  for (const auto& p : prompts) handles.push_back(submit_greedy(*d.engine, p, 4));
  d.engine->step();
  EXPECT_EQ(groups_of(*d.engine, handles), (std::vector<int32_t>{0, 1, 1, 1}));
  auto out = run_all(*d.engine, handles, {1, 1, 1, 1});
  expect_greedy_and_clean(*d.model, out, prompts, {4});
}

// Group 0's pool is full while group 1 has room: group 0's next request waits for its own group,
// group 1's run; group 0's sequences preempt each other, never group 1's.
TEST(EngineDp, PoolExhaustionAndPreemptionWithinAGroup) {
  DpEngine d = make_dp_engine(8, LoadBalanceMethod::kRoundRobin);  // 8 pages of 4 tokens a group
  std::vector<std::vector<int32_t>> prompts = {tokens_from(1, 12), tokens_from(2, 3),
                                               tokens_from(3, 12), tokens_from(4, 3)};
  // Group 0: 12 + 15 positions are 7 pages each, two of them do not fit in 8. Group 1: 3 + 3
  // positions, 2 pages each.
  const std::vector<int32_t> max_tokens = {16, 4, 16, 4};
  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < prompts.size(); ++i) {
    handles.push_back(submit_greedy(*d.engine, prompts[i], max_tokens[i]));
  }
  d.engine->step();
  EXPECT_EQ(groups_of(*d.engine, handles), (std::vector<int32_t>{0, 1, 0, 1}));
  auto out = run_all(*d.engine, handles, {1, 1, 1, 1});
  expect_greedy_and_clean(*d.model, out, prompts, max_tokens);
  const EngineStats st = d.engine->stats();
  ASSERT_EQ(st.dp_groups.size(), 2u);
  EXPECT_GT(st.dp_groups[0].num_preemptions_total, 0u);
  EXPECT_EQ(st.dp_groups[1].num_preemptions_total, 0u);
  EXPECT_EQ(st.num_preemptions_total, st.dp_groups[0].num_preemptions_total);

  // A request that one group's pool cannot hold at all is refused.
  GenerateRequest big;
  big.prompt_tokens = tokens_from(5, 30);
  big.params.max_tokens = 8;
  EXPECT_FALSE(d.engine->submit(std::move(big)).is_ok());
}

TEST(EngineDp, PrefixCacheHitsOnlyInItsGroupAndAStepWithOneGroupEmpty) {
  DpEngine d = make_dp_engine(32, LoadBalanceMethod::kRoundRobin);
  const std::vector<int32_t> shared = tokens_from(9, 13);  // 3 full pages + 1 token
  std::vector<RequestHandle> first;
  first.push_back(submit_greedy(*d.engine, shared, 3));  // group 0, alone: group 1 idles
  auto out0 = run_all(*d.engine, first, {1});
  for (const auto& groups : d.model->step_groups) {
    for (int32_t g : groups) EXPECT_EQ(g, 0);
  }
  EXPECT_EQ(out0[0].usage.cached_tokens, 0);
  std::vector<RequestHandle> next;
  next.push_back(submit_greedy(*d.engine, shared, 3));  // group 1: its cache is empty
  next.push_back(submit_greedy(*d.engine, shared, 3));  // group 0: hits the 3 pages
  auto out = run_all(*d.engine, next, {1, 1});
  EXPECT_EQ(out[0].usage.cached_tokens, 0);
  EXPECT_EQ(out[1].usage.cached_tokens, 12);
  expect_greedy_and_clean(*d.model, out, {shared, shared}, {3});
  EXPECT_EQ(out0[0].tokens[0], out[0].tokens[0]);
  const EngineStats st = d.engine->stats();
  ASSERT_EQ(st.dp_groups.size(), 2u);
  EXPECT_EQ(st.dp_groups[0].prefix_cache_hit_tokens_total, 12u);
  EXPECT_EQ(st.dp_groups[1].prefix_cache_hit_tokens_total, 0u);
  EXPECT_EQ(st.prefix_cache_hit_tokens_total, 12u);
}

TEST(EngineDp, OneGroupHasNoPerGroupStats) {
  FakeModel* model = nullptr;
  auto e = make_engine(EngineFixtureConfig{}, &model);
  EXPECT_EQ(e->scheduler().num_dp_groups(), 1);
  EXPECT_TRUE(e->stats().dp_groups.empty());
  EXPECT_EQ(e->stats().kv_pages_total, 64);
}

TEST(EngineDp, SchedulerGroupsMustMatchTheRunner) {
  EngineConfig c;
  c.scheduler.page_size = 4;
  c.scheduler.num_dp_groups = 4;
  auto e = Engine::create(std::move(c), std::make_unique<DpFakeModel>(2, 50, 8, 4));
  ASSERT_FALSE(e.is_ok());
  EXPECT_NE(e.status().message().find("data-parallel groups"), std::string::npos);
}

}  // namespace
}  // namespace m3::testing

// The golden fixtures (tests/fixtures/golden/*/expected.json: transformers, float32) under tensor
// and expert parallelism on CPU ranks: --tp 2, --tp 4 (KV heads replicated: the fixtures have 2),
// --ep 2 (= --tp 2 --ep 2), --ep 4 and --tp 4 --ep 2, and attention data parallelism
// --tp 4 --dp 2 (two attention groups of two ranks; the prompts alternate between the groups). Each layout must meet the reference with the
// unsharded path's checks and tolerances (golden_fixture.h, derived in golden_test.cpp): argmax
// per position away from near-ties, logits within kRelTol of the row's scale, greedy tokens up to
// the first near-tie.
//
// Why the unsharded tolerance holds: sharding only reorders float32 sums (a rank's heads or
// intermediate columns, then the all-reduce of the partial sums; under expert parallelism the
// routed experts are computed whole and summed in the unsharded slot order, see
// tensor_parallel_test.cpp). That moves logits by ~1e-6 of their scale on these sizes, ~50x
// below kRelTol = 5e-5, which was set at ~20x the unsharded path's own error. Under --dp the
// attention partial sums are added over a group's ranks and the feed-forward's over all of them;
// gathering the groups' rows and keeping a group's are copies, so the same holds.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "golden_fixture.h"
#include "loader/checkpoint.h"
#include "sharded_ranks.h"

namespace m3::golden {
namespace {

using minimax_m3::testing::Layout;
using minimax_m3::testing::ShardedModel;

class ShardedGoldenTest : public ::testing::TestWithParam<std::tuple<std::string, Layout>> {};

TEST_P(ShardedGoldenTest, MatchesReference) {
  const auto& [dir, layout] = GetParam();
  if (dir.empty()) GTEST_SKIP() << "no fixture with an expected.json under tests/fixtures/golden";
  json expected = read_json(fs::path(dir) / "expected.json");
  auto cfg = load_minimax_m3_config(dir);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const Status fits = minimax_m3::check_tensor_parallel(*cfg, layout.tp, layout.ep, layout.dp);
  if (!fits.is_ok()) GTEST_SKIP() << fits.to_string();
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  const int64_t vocab = cfg->vocab_size;

  int64_t pages = 1;
  for (const json& p : expected["prompts"])
    pages = std::max(pages, pages_for(*cfg, static_cast<int64_t>(p.at("ids").size()) +
                                                greedy_max_tokens(p)));
  ShardedModel model;
  const Status loaded = model.load(*cfg, **ckpt, layout, pages);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  std::vector<int32_t> table;
  for (int32_t pg = 0; pg < pages; ++pg) table.push_back(pg);

  int prompt_no = 0;
  double worst = 0;
  for (const json& p : expected["prompts"]) {
    const std::string tag = prompt_tag(dir, prompt_no++) + " " + layout.name();
    const std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    ModelSlice s;
    s.tokens = ids;
    s.block_table = table;
    // Under attention data parallelism the prompts take turns over the groups (the others run the
    // feed-forward blocks with no tokens of their own); the group's first rank has the logits.
    s.dp_group = (prompt_no - 1) % layout.dp;
    const size_t holder = model.first_of_group(s.dp_group);
    for (int32_t i = 0; i < n; ++i) s.logits_rows.push_back(i);
    std::vector<ModelOutput> out = model.forward({s});
    ASSERT_FALSE(::testing::Test::HasFailure()) << tag;
    const std::vector<float>& logits = out[holder].logits[0];
    ASSERT_EQ(static_cast<int64_t>(logits.size()), n * vocab) << tag;
    const double near_tie = near_tie_threshold(logits);

    ArgmaxCount argmax_count;
    ASSERT_NO_FATAL_FAILURE(check_argmax(p, logits, n, vocab, near_tie, tag, &argmax_count));
    ASSERT_NO_FATAL_FAILURE(for_each_logit_row(
        p, n, tag, [&](int64_t t, const std::vector<double>& ref, const std::string& what) {
          const RowError e = row_error(logits.data() + t * vocab, ref);
          worst = std::max(worst, e.worst);
          EXPECT_LE(e.worst, 1.0) << what << ": worst id " << e.id;
        }));

    // Greedy decoding on the ranks, one token per step.
    if (p.contains("greedy") && p["greedy"].is_object()) {
      const json& greedy = p["greedy"];
      const std::vector<int32_t> want = greedy.at("output_ids").get<std::vector<int32_t>>();
      const std::vector<double> gm = greedy.value("margins", std::vector<double>{});
      const size_t limit = greedy_compare_limit(want, gm, near_tie);
      std::vector<int32_t> got = {
          ::m3::testing::argmax(std::span<const float>(logits.data() + (n - 1) * vocab, vocab))};
      int64_t pos = n;
      std::vector<int32_t> next(1);
      while (got.size() < limit) {
        next[0] = got.back();
        s.tokens = next;
        s.start_pos = pos++;
        s.logits_rows = {0};
        std::vector<ModelOutput> step = model.forward({s});
        ASSERT_FALSE(::testing::Test::HasFailure()) << tag;
        got.push_back(::m3::testing::argmax(std::span<const float>(step[holder].logits[0])));
      }
      for (size_t i = 0; i < limit; ++i) ASSERT_EQ(got[i], want[i]) << tag << " greedy token " << i;
    }
  }
  std::printf("[ golden sharded ] %s %s: worst logit error %.3g of the tolerance\n",
              fs::path(dir).filename().string().c_str(), layout.name().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardedGoldenTest,
    ::testing::Combine(::testing::ValuesIn(fixture_names_or_placeholder()),
                       ::testing::Values(Layout{2, 1}, Layout{4, 1}, Layout{2, 2}, Layout{4, 4},
                                         Layout{4, 2}, Layout{4, 1, 2})),
    [](const ::testing::TestParamInfo<std::tuple<std::string, Layout>>& info) {
      const std::string& d = std::get<0>(info.param);
      std::string n = d.empty() ? "none" : fs::path(d).filename().string();
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n + "_" + std::get<1>(info.param).name();
    });

}  // namespace
}  // namespace m3::golden

// The golden fixtures on the GPU: every tests/fixtures/golden/<name>/ case (transformers float32
// reference, format in tests/fixtures/golden/README.md) and the bundled model's
// tests/fixtures/m3_tiny/golden.json cases run through CudaBackend (the float32 correctness
// path: cuBLASLt true-fp32 linears and the float32 kernels), with the same checks as the CPU
// tests (tests/model/golden_test.cpp, tests/model/m3_tiny_golden_test.cpp): per-position argmax
// and greedy tokens wherever the reference's top-1/top-2 margin exceeds twice the logit
// tolerance (near-ties: either answer is right and greedy comparison stops there), logits within
// kRelTol · max(1, max|ref|) (same derivation as the CPU test: both sides are float32 maths with
// different summation orders), and the m3-tiny greedy continuations token for token (their
// margins are >= 0.03, far above float32 differences).
//
// The repository root is M3_REPO_ROOT when that exists (built and run here), else the current
// directory (the GPU machine runs tools/device/run-all.sh from its copy of the repository).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../model/golden_fixture.h"
#include "cuda_test_util.h"
#include "model/minimax_m3/model_dir.h"
#include "../model/single_sequence.h"

namespace m3::golden {
namespace {

class CudaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGolden, MatchesReference) {
  const std::string dir = GetParam();
  if (dir.empty()) GTEST_SKIP() << "no fixture with an expected.json under tests/fixtures/golden";
  json expected = read_json(fs::path(dir) / "expected.json");
  ASSERT_TRUE(expected.contains("prompts") && expected["prompts"].is_array());
  Backend* backend = cuda_test::gpu();
  auto loaded = minimax_m3::load_model_dir(dir, backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;
  const int64_t vocab = cfg.vocab_size;
  minimax_m3::Model* model = loaded->model.get();
  int prompt_no = 0;
  for (const json& p : expected["prompts"]) {
    const std::string tag = prompt_tag(dir, prompt_no++);
    std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    const json& greedy = p.contains("greedy") ? p["greedy"] : json();
    const int64_t max_new = greedy_max_tokens(p);
    const int64_t pages = pages_for(cfg, n + max_new);
    minimax_m3::PagedKvCache cache(backend, cfg, pages);
    testing::SimplePagePool pool(pages);
    std::vector<float> logits;
    Status st = prefill_logits(model, &cache, &pool, ids, &logits);
    ASSERT_TRUE(st.is_ok()) << tag << ": " << st.to_string();
    auto row = [&](int64_t t) { return logits.data() + t * vocab; };
    const double near_tie = near_tie_threshold(logits);
    ArgmaxCount am;
    ASSERT_NO_FATAL_FAILURE(check_argmax(p, logits, n, vocab, near_tie, tag, &am));
    double worst = 0;
    ASSERT_NO_FATAL_FAILURE(for_each_logit_row(
        p, n, tag, [&](int64_t t, const std::vector<double>& ref, const std::string&) {
          worst = std::max(worst, row_error(row(t), ref).worst);
        }));
    EXPECT_LE(worst, 1.0) << tag << ": logits beyond the tolerance";
    int greedy_checked = 0;
    if (greedy.is_object()) {
      std::vector<int32_t> want = greedy.at("output_ids").get<std::vector<int32_t>>();
      std::vector<double> gm = greedy.value("margins", std::vector<double>{});
      testing::GenerateOptions opts;
      opts.max_tokens = max_new;
      opts.eos_token_ids = loaded->eos_token_ids;
      opts.ignore_eos = static_cast<int64_t>(want.size()) == max_new;
      auto got = testing::generate(model, &cache, &pool, ids, opts);
      ASSERT_TRUE(got.is_ok()) << tag << ": " << got.status().to_string();
      const size_t limit = greedy_compare_limit(want, gm, near_tie);
      ASSERT_GE(got->size(), limit) << tag;
      for (size_t i = 0; i < limit; ++i) ASSERT_EQ((*got)[i], want[i]) << tag << " greedy " << i;
      greedy_checked = static_cast<int>(limit);
    }
    std::printf(
        "[ cuda golden %-28s ] argmax %d/%d positions equal (%d near-ties skipped), "
        "greedy %d tokens equal, worst logit error %.3g of the tolerance\n",
        tag.c_str(), am.equal, am.checked, am.skipped, greedy_checked, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGolden, ::testing::ValuesIn(fixture_names_or_placeholder()),
                         fixture_test_name);

TEST(CudaM3TinyGolden, GreedyOutputEqualsTransformers) {
  const fs::path model_dir = m3_tiny_model_dir();
  const fs::path golden_path = m3_tiny_golden_path();
  ASSERT_TRUE(fs::exists(golden_path)) << "missing " << golden_path;
  json golden = read_json(golden_path);
  ASSERT_GE(golden.at("cases").size(), 5u);
  Backend* backend = cuda_test::gpu();
  auto loaded = minimax_m3::load_model_dir(model_dir.string(), backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;
  int equal = 0, total = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c.at("name");
    std::vector<int32_t> prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    std::vector<int32_t> want = c.at("output_ids").get<std::vector<int32_t>>();
    auto got =
        greedy_tokens(loaded->model.get(), backend, cfg, prompt, static_cast<int64_t>(want.size()));
    ASSERT_TRUE(got.is_ok()) << name << ": " << got.status().to_string();
    ++total;
    if (*got == want) ++equal;
    EXPECT_EQ(*got, want) << "case " << name << " (prompt " << prompt.size() << " tokens)";
  }
  std::printf("[ cuda golden m3-tiny                          ] %d/%d cases: greedy tokens equal "
              "to transformers\n",
              equal, total);
}

}  // namespace
}  // namespace m3::golden

// Golden tests: every tests/fixtures/golden/<name>/ with an expected.json (format:
// tests/fixtures/golden/README.md) is loaded through our loader (config.json + safetensors,
// dequantised to float32) and run on the CPU backend; per-position argmax, logits, greedy tokens
// and incremental decode are checked against the reference (transformers, float32).
//
// Tolerance (logits): |ours - ref| <= kRelTol · max(1, max|ref| over the vocab row).
// Both sides evaluate the same float32 maths with different summation orders. Our CPU path stays
// within ~1e-6 of the logit scale of an exact (double) evaluation on these model sizes
// (model_test.cpp measures it), and two float32 references (HF, and an independent re-implementation)
// agree to ~1e-6 of the scale (cross_check_max_abs_diff ~1e-5 at logits ~10). kRelTol = 5e-5 is
// ~20x the sum of the two, and still far below what a semantic error produces (a different block
// or expert choice, a wrong norm or RoPE pairing moves logits by O(0.1) or more).
// Argmax and greedy tokens must agree wherever the reference's top-1/top-2 margin exceeds twice
// the tolerance; at a closer near-tie either answer is right, and for greedy decoding the
// comparison stops there (the continuations may then legitimately diverge).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"
#include "model/minimax_m3/model_dir.h"
#include "single_sequence.h"

namespace m3::golden {
namespace {

double worst_ratio_ = 0;  // largest |err| / tol of the current prompt, for the log

// Worst |ours - ref| / tol over a row; reports the id.
void expect_row_close(const float* ours, const std::vector<double>& ref, const std::string& what) {
  const RowError e = row_error(ours, ref);
  worst_ratio_ = std::max(worst_ratio_, e.worst);
  EXPECT_LE(e.worst, 1.0) << what << ": worst id " << e.id << " ours " << ours[e.id] << " ref "
                          << ref[e.id] << " tol " << e.tol;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesReference) {
  const std::string dir = GetParam();
  if (dir.empty()) GTEST_SKIP() << "no fixture with an expected.json under tests/fixtures/golden";
  json expected = read_json(fs::path(dir) / "expected.json");
  ASSERT_TRUE(expected.contains("prompts") && expected["prompts"].is_array());

  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(dir, &backend);
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
    minimax_m3::PagedKvCache cache(&backend, cfg, pages);
    testing::SimplePagePool pool(pages);

    // One prefill, logits of every position.
    std::vector<float> logits;
    Status st = prefill_logits(model, &cache, &pool, ids, &logits);
    ASSERT_TRUE(st.is_ok()) << tag << ": " << st.to_string();
    auto row = [&](int64_t t) { return logits.data() + t * vocab; };
    const double near_tie = near_tie_threshold(logits);

    // Argmax per position, where the reference is not at a near-tie.
    ArgmaxCount argmax_count;
    ASSERT_NO_FATAL_FAILURE(check_argmax(p, logits, n, vocab, near_tie, tag, &argmax_count));

    // Logits: last position, selected positions, or all positions.
    ASSERT_NO_FATAL_FAILURE(for_each_logit_row(
        p, n, tag, [&](int64_t t, const std::vector<double>& ref, const std::string& what) {
          expect_row_close(row(t), ref, what);
        }));

    // Incremental decode and chunked prefill reproduce the one-shot prefill (bitwise on the CPU).
    for (int64_t chunk : {int64_t{1}, int64_t{7}}) {
      std::vector<float> inc;
      testing::SequenceRunner seq(model, &cache, &pool);
      Status st = seq.append(ids, chunk, true, &inc);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_TRUE(inc == logits) << tag << ": chunk " << chunk << " differs from one prefill";
    }

    // Greedy generation.
    if (greedy.is_object()) {
      std::vector<int32_t> want = greedy.at("output_ids").get<std::vector<int32_t>>();
      std::vector<double> gm = greedy.value("margins", std::vector<double>{});
      testing::GenerateOptions opts;
      opts.max_tokens = max_new;
      opts.eos_token_ids = loaded->eos_token_ids;
      // A reference that stopped early stopped at EOS; otherwise it ran to max_tokens.
      opts.ignore_eos = static_cast<int64_t>(want.size()) == max_new;
      auto got = testing::generate(model, &cache, &pool, ids, opts);
      ASSERT_TRUE(got.is_ok()) << tag << ": " << got.status().to_string();
      const size_t limit = greedy_compare_limit(want, gm, near_tie);
      ASSERT_GE(got->size(), limit) << tag;
      for (size_t i = 0; i < limit; ++i)
        ASSERT_EQ((*got)[i], want[i]) << tag << " greedy token " << i;
      if (limit == want.size()) {
        EXPECT_EQ(got->size(), want.size()) << tag;
      }
    }
    EXPECT_EQ(pool.num_free(), pages) << tag << ": pages leaked";
    std::printf(
        "[ golden ] %s: worst logit error %.3g of the tolerance; %d positions at a "
        "reference near-tie\n",
        tag.c_str(), worst_ratio_, argmax_count.skipped);
    worst_ratio_ = 0;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(fixture_names_or_placeholder()),
                         fixture_test_name);

}  // namespace
}  // namespace m3::golden

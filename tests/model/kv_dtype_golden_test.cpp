// The float32 forward over a bf16 / fp8_e4m3 / fp4_e2m1 KV cache (--kv-cache-dtype), against the
// same forward over the float32 cache: the golden fixtures (tests/fixtures/golden) and the
// bundled model's greedy cases (tests/fixtures/m3_tiny/golden.json).
//
// Error model. Each stored K, V and index-key element carries a rounding error of at most
// delta relative to the largest value it is scaled against (quant/kv_quant.h, kv_quant_test.cpp):
// bf16 2^-8 (of the element), fp8_e4m3 2^-4 (of the element, plus 2^-9 of the page-head scale),
// fp4_e2m1 17/16 x 1/6 (of the 16-element block's max). To first order, one layer's attention
// output then moves by at most delta relative to the values it mixes (a convex combination of
// perturbed V rows; the weights move by the perturbed scores, which the per-layer norms keep at
// the same relative size), and the residual stream and the head pass that on with gain at most 1
// relative to the logit scale. Over L layers: |logit' - logit| <= B = delta x L x max(1, max|logit|).
// Argmax and greedy tokens must then agree wherever the float32 top-1/top-2 margin exceeds 2B;
// the comparison of a greedy continuation stops at the first position below that (after it the
// continuations may legitimately differ). The measured deviation is printed against B.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"
#include "model/minimax_m3/model_dir.h"
#include "single_sequence.h"

namespace m3::golden {
namespace {

constexpr KvCacheDtype kDtypes[] = {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3,
                                    KvCacheDtype::kFp4E2M1};

double delta(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBF16: return std::ldexp(1.0, -8);
    case KvCacheDtype::kFp8E4M3: return std::ldexp(1.0, -4) * (1 + std::ldexp(1.0, -5));
    case KvCacheDtype::kFp4E2M1: return 17.0 / 16.0 / 6.0;
    case KvCacheDtype::kFloat32: return 0;
  }
  return 0;
}

// Logits of every position of one prefill of `ids` in a fresh cache of `dtype`.
std::vector<float> prefill(minimax_m3::Model* model, Backend* be, const MiniMaxM3Config& cfg,
                           const std::vector<int32_t>& ids, KvCacheDtype dtype) {
  const int64_t pages = pages_for(cfg, static_cast<int64_t>(ids.size()));
  minimax_m3::PagedKvCache cache(be, cfg, pages, dtype);
  testing::SimplePagePool pool(pages);
  std::vector<float> logits;
  Status st = prefill_logits(model, &cache, &pool, ids, &logits);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return logits;
}

struct RowStats {
  double dev = 0, scale = 1, margin = 0;
  int32_t argmax = 0;
};
RowStats row_stats(const float* ours, const float* ref, int64_t vocab) {
  RowStats s;
  float top1 = -INFINITY, top2 = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    s.dev = std::max(s.dev, double(std::fabs(ours[i] - ref[i])));
    s.scale = std::max(s.scale, double(std::fabs(ref[i])));
    if (ref[i] > top1) {
      top2 = top1;
      top1 = ref[i];
      s.argmax = int32_t(i);
    } else if (ref[i] > top2) {
      top2 = ref[i];
    }
  }
  s.margin = double(top1) - double(top2);
  return s;
}

class KvDtypeFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(KvDtypeFixtures, LogitsWithinTheBoundOfTheFloat32Cache) {
  const std::string dir = GetParam();
  if (dir.empty()) GTEST_SKIP() << "no fixture with an expected.json under tests/fixtures/golden";
  json expected = read_json(fs::path(dir) / "expected.json");
  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(dir, &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;
  const int64_t vocab = cfg.vocab_size;
  int prompt_no = 0;
  for (const json& p : expected["prompts"]) {
    const std::string tag = prompt_tag(dir, prompt_no++);
    const std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const std::vector<float> f32 =
        prefill(loaded->model.get(), &backend, cfg, ids, KvCacheDtype::kFloat32);
    for (KvCacheDtype d : kDtypes) {
      const std::vector<float> q = prefill(loaded->model.get(), &backend, cfg, ids, d);
      ASSERT_EQ(q.size(), f32.size());
      double worst = 0;
      int checked = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        const RowStats s = row_stats(q.data() + t * vocab, f32.data() + t * vocab, vocab);
        const double b = delta(d) * double(cfg.num_hidden_layers) * s.scale;
        worst = std::max(worst, s.dev / b);
        EXPECT_LE(s.dev, b) << tag << " " << kv_cache_dtype_name(d) << " position " << t;
        if (s.margin > 2 * b) {
          ++checked;
          EXPECT_EQ(testing::argmax(std::span<const float>(q.data() + t * vocab, vocab)),
                    s.argmax)
              << tag << " " << kv_cache_dtype_name(d) << " position " << t;
        }
      }
      std::printf("[ kv dtype ] %s %s: worst logit deviation %.3g of the bound; argmax checked at "
                  "%d of %zu positions\n",
                  tag.c_str(), kv_cache_dtype_name(d), worst, checked, ids.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvDtypeFixtures,
                         ::testing::ValuesIn(fixture_names_or_placeholder()), fixture_test_name);

// The bundled model: greedy continuations over each dtype's cache equal transformers' (which the
// float32 cache reproduces exactly, m3_tiny_golden_test.cpp) up to the first position whose
// float32 margin is at most 2B; the logits there stay within B of the float32 cache's.
TEST(KvDtypeM3Tiny, GreedyTokensEqualWhereTheMarginAllows) {
  std::ifstream in(m3_tiny_golden_path());
  ASSERT_TRUE(in) << "missing " << m3_tiny_golden_path();
  nlohmann::json golden = nlohmann::json::parse(in);
  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(m3_tiny_model_dir().string(), &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;
  const int64_t vocab = cfg.vocab_size;
  for (const auto& c : golden["cases"]) {
    const std::string name = c.at("name");
    const std::vector<int32_t> prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> want = c.at("output_ids").get<std::vector<int32_t>>();
    // The reference continuation teacher-forced through the float32 cache: its margins.
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), want.begin(), want.end() - 1);
    const std::vector<float> f32 =
        prefill(loaded->model.get(), &backend, cfg, all, KvCacheDtype::kFloat32);
    for (KvCacheDtype d : kDtypes) {
      const std::vector<float> q = prefill(loaded->model.get(), &backend, cfg, all, d);
      size_t limit = want.size();
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const size_t t = prompt.size() - 1 + i;
        const RowStats s = row_stats(q.data() + t * vocab, f32.data() + t * vocab, vocab);
        const double b = delta(d) * double(cfg.num_hidden_layers) * s.scale;
        worst = std::max(worst, s.dev / b);
        EXPECT_LE(s.dev, b) << name << " " << kv_cache_dtype_name(d) << " token " << i;
        if (s.margin <= 2 * b && limit == want.size()) limit = i;
      }
      auto got = greedy_tokens_with(loaded->model.get(), &backend, cfg, prompt,
                                    static_cast<int64_t>(want.size()), d);
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      size_t equal = 0;
      while (equal < want.size() && equal < got->size() && (*got)[equal] == want[equal]) ++equal;
      EXPECT_GE(equal, limit) << name << " " << kv_cache_dtype_name(d);
      std::printf("[ kv dtype ] m3-tiny %s %s: worst logit deviation %.3g of the bound; greedy "
                  "equal for %zu of %zu tokens (%zu required by the margins)\n",
                  name.c_str(), kv_cache_dtype_name(d), worst, equal, want.size(), limit);
    }
  }
}

}  // namespace
}  // namespace m3::golden

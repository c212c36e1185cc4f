// The float32 forward over a bf16 / fp8_e4m3 / fp4_e2m1 KV cache (--kv-cache-dtype): the golden
// fixtures (tests/fixtures/golden) and the bundled model's greedy cases
// (tests/fixtures/m3_tiny/golden.json).
//
// What is exact, and asserted exactly. Dequantisation is exact (quant/kv_quant.h), so the only
// difference from the float32 cache is the storage rounding of each K, V and index-key element.
// bf16 rounds each element on its own, so chunked prefill and token-by-token decode over a bf16
// cache store and read exactly what one prefill does: the logits must be equal bit for bit, as
// for float32. fp8 and fp4 share a scale per page and head, and a row written before the scale
// grew is re-encoded: exact above E4M3's subnormals, rounded once more below them (at most
// 2^-10 of the page-head scale, against the format's own 2^-4 of the element). So a decode that
// attends before the re-encoding sees values that differ from one prefill's only by that
// subnormal rounding, which is far smaller than the format's rounding D that separates the
// quantised run from the float32 one (D = the largest logit deviation between them, measured
// per position). Greedy tokens and argmax must therefore agree with the float32 cache's (and so
// with transformers', m3_tiny_golden_test.cpp) wherever the float32 top-1/top-2 margin exceeds
// 4D: 2D for the format's rounding, doubled for the decode path's extra subnormal rounding.
// A comparison of a greedy continuation stops at the first position below that margin.
//
// What is measured and printed: D against the logit scale, per prompt and dtype, and how many
// greedy tokens equal transformers' (docs/kv-cache-dtype.md quotes them). A first-order bound on
// D (delta x L of the logit scale, delta the format's relative rounding) does not hold here: the
// softmax amplifies score errors by the scores' size, and on long prompts a rounded index key can
// move a near-tied block into or out of the sparse selection.
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

// Logits of every position through token-by-token decode (chunk 1) or chunks of 7, in a fresh
// cache of `dtype`.
std::vector<float> incremental(minimax_m3::Model* model, Backend* be, const MiniMaxM3Config& cfg,
                               const std::vector<int32_t>& ids, KvCacheDtype dtype,
                               int64_t chunk) {
  const int64_t pages = pages_for(cfg, static_cast<int64_t>(ids.size()));
  minimax_m3::PagedKvCache cache(be, cfg, pages, dtype);
  testing::SimplePagePool pool(pages);
  testing::SequenceRunner seq(model, &cache, &pool);
  std::vector<float> logits;
  Status st = seq.append(ids, chunk, true, &logits);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return logits;
}

class KvDtypeFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(KvDtypeFixtures, DecodeAndChunkedPrefillAgreeWithOnePrefill) {
  const std::string dir = GetParam();
  if (dir.empty()) GTEST_SKIP() << "no fixture with an expected.json under tests/fixtures/golden";
  json expected = read_json(fs::path(dir) / "expected.json");
  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(dir, &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;
  const int64_t vocab = cfg.vocab_size;
  minimax_m3::Model* model = loaded->model.get();
  int prompt_no = 0;
  for (const json& p : expected["prompts"]) {
    const std::string tag = prompt_tag(dir, prompt_no++);
    const std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const std::vector<float> f32 = prefill(model, &backend, cfg, ids, KvCacheDtype::kFloat32);
    for (KvCacheDtype d : kDtypes) {
      const std::string what = tag + " " + kv_cache_dtype_name(d);
      const std::vector<float> one = prefill(model, &backend, cfg, ids, d);
      ASSERT_EQ(one.size(), f32.size());
      for (int64_t chunk : {int64_t{1}, int64_t{7}}) {
        const std::vector<float> inc = incremental(model, &backend, cfg, ids, d, chunk);
        ASSERT_EQ(inc.size(), one.size());
        if (d == KvCacheDtype::kBF16) {
          EXPECT_TRUE(inc == one) << what << ": chunk " << chunk << " differs from one prefill";
          continue;
        }
        int checked = 0;
        for (size_t t = 0; t < ids.size(); ++t) {
          const RowStats s = row_stats(one.data() + t * vocab, f32.data() + t * vocab, vocab);
          if (s.margin <= 4 * s.dev) continue;
          ++checked;
          EXPECT_EQ(testing::argmax(std::span<const float>(inc.data() + t * vocab, vocab)),
                    s.argmax)
              << what << " chunk " << chunk << " position " << t;
        }
        if (chunk == 1) {
          std::printf("[ kv dtype ] %s: decode argmax checked at %d of %zu positions\n",
                      what.c_str(), checked, ids.size());
        }
      }
      double worst = 0;
      for (size_t t = 0; t < ids.size(); ++t) {
        const RowStats s = row_stats(one.data() + t * vocab, f32.data() + t * vocab, vocab);
        worst = std::max(worst, s.dev / s.scale);
      }
      std::printf("[ kv dtype ] %s: largest logit deviation from the float32 cache %.3g of the "
                  "logit scale\n",
                  what.c_str(), worst);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvDtypeFixtures,
                         ::testing::ValuesIn(fixture_names_or_placeholder()), fixture_test_name);

// The bundled model: greedy continuations over an fp8 and an fp4 cache equal transformers' (which
// the float32 cache reproduces exactly, m3_tiny_golden_test.cpp) up to the first position whose
// float32 margin is at most 4D (bf16 is covered exactly by the fixtures above).
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
    for (KvCacheDtype d : {KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
      const std::vector<float> q = prefill(loaded->model.get(), &backend, cfg, all, d);
      size_t limit = want.size();
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const size_t t = prompt.size() - 1 + i;
        const RowStats s = row_stats(q.data() + t * vocab, f32.data() + t * vocab, vocab);
        worst = std::max(worst, s.dev / s.scale);
        if (s.margin <= 4 * s.dev && limit == want.size()) limit = i;
      }
      auto got = greedy_tokens_with(loaded->model.get(), &backend, cfg, prompt,
                                    static_cast<int64_t>(want.size()), d);
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      size_t equal = 0;
      while (equal < want.size() && equal < got->size() && (*got)[equal] == want[equal]) ++equal;
      EXPECT_GE(equal, limit) << name << " " << kv_cache_dtype_name(d);
      std::printf("[ kv dtype ] m3-tiny %s %s: largest logit deviation %.3g of the logit scale; "
                  "greedy equal for %zu of %zu tokens (%zu required by the margins)\n",
                  name.c_str(), kv_cache_dtype_name(d), worst, equal, want.size(), limit);
    }
  }
}

}  // namespace
}  // namespace m3::golden

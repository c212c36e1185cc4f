// The bundled model (models/m3-tiny) against the transformers reference: for every case in
// tests/fixtures/m3_tiny/golden.json (chat prompts rendered through the model's own template,
// greedy continuations from transformers in float32), our CPU engine must produce the same
// tokens, token for token. Both run float32 maths; the reference records the smallest top-1/top-2
// logit margin of each case (>= 0.03 for every case), far above the ~1e-5 differences of two
// float32 evaluations, so any disagreement is a real bug. One case is longer than
// topk_blocks x block_size, so MSA block selection is active there.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "golden_fixture.h"
#include "model/minimax_m3/model_dir.h"
#include "single_sequence.h"

namespace m3::golden {
namespace {

TEST(M3TinyGolden, GreedyOutputEqualsTransformers) {
  const fs::path golden_path = m3_tiny_golden_path();
  std::ifstream in(golden_path);
  ASSERT_TRUE(in) << "missing " << golden_path;
  nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GE(golden.at("cases").size(), 5u);

  CpuBackend backend(2);
  auto loaded = minimax_m3::load_model_dir(m3_tiny_model_dir().string(), &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const MiniMaxM3Config& cfg = loaded->config;

  bool saw_sparse_regime = false;
  for (const auto& c : golden["cases"]) {
    const std::string name = c.at("name");
    std::vector<int32_t> prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    std::vector<int32_t> want = c.at("output_ids").get<std::vector<int32_t>>();
    ASSERT_FALSE(want.empty()) << name;
    if (static_cast<int64_t>(prompt.size()) > cfg.index_topk_blocks * cfg.index_block_size)
      saw_sparse_regime = true;

    auto got = greedy_tokens(loaded->model.get(), &backend, cfg, prompt,
                             static_cast<int64_t>(want.size()));
    ASSERT_TRUE(got.is_ok()) << name << ": " << got.status().to_string();
    EXPECT_EQ(*got, want) << "case " << name << " (prompt " << prompt.size() << " tokens)";
  }
  EXPECT_TRUE(saw_sparse_regime) << "no golden case exercises MSA block selection";
}

}  // namespace
}  // namespace m3::golden

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
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/runner.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kRelTol = 5e-5;

fs::path repo_root() {
  const fs::path built = M3_REPO_ROOT;
  if (fs::exists(built / "tests" / "fixtures")) return built;
  return fs::current_path();
}

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = repo_root() / "tests" / "fixtures" / "golden";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && fs::exists(e.path() / "expected.json"))
      dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// Worst |ours - ref| / tol of a row (NaN counts as worst).
double row_ratio(const float* ours, const std::vector<double>& ref) {
  double scale = 1.0;
  for (double x : ref) scale = std::max(scale, std::abs(x));
  const double tol = kRelTol * scale;
  double worst = 0;
  for (size_t v = 0; v < ref.size(); ++v) {
    const double r = std::abs(ours[v] - ref[v]) / tol;
    if (!(r <= worst)) worst = r;
  }
  return worst;
}

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
    const std::string tag =
        fs::path(dir).filename().string() + " prompt " + std::to_string(prompt_no++);
    std::vector<int32_t> ids = p.at("ids").get<std::vector<int32_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    const json& greedy = p.contains("greedy") ? p["greedy"] : json();
    const int64_t max_new = greedy.is_object() ? greedy.value("max_tokens", 0) : 0;
    const int64_t pages = (n + max_new + cfg.index_block_size - 1) / cfg.index_block_size + 1;
    minimax_m3::PagedKvCache cache(backend, cfg, pages);
    minimax_m3::SimplePagePool pool(pages);
    std::vector<float> logits;
    {
      minimax_m3::SequenceRunner seq(model, &cache, &pool);
      Status st = seq.append(ids, 0, true, &logits);
      ASSERT_TRUE(st.is_ok()) << tag << ": " << st.to_string();
    }
    auto row = [&](int64_t t) { return logits.data() + t * vocab; };
    double scale = 1.0;
    for (float x : logits) scale = std::max(scale, static_cast<double>(std::abs(x)));
    const double near_tie = 2 * kRelTol * scale;
    std::vector<int32_t> want_argmax = p.at("argmax").get<std::vector<int32_t>>();
    ASSERT_EQ(static_cast<int64_t>(want_argmax.size()), n) << tag;
    std::vector<double> margins = p.value("argmax_margin", std::vector<double>{});
    int skipped = 0, checked = 0, equal = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int32_t got = minimax_m3::argmax(std::span<const float>(row(t), vocab));
      const double margin = t < static_cast<int64_t>(margins.size()) ? margins[t] : INFINITY;
      if (margin <= near_tie) {
        ++skipped;
        continue;
      }
      ++checked;
      equal += got == want_argmax[t];
      EXPECT_EQ(got, want_argmax[t]) << tag << " position " << t << " (ref margin " << margin
                                     << ")";
    }
    double worst = 0;
    if (p.contains("last_logits"))
      worst = std::max(worst, row_ratio(row(n - 1), p["last_logits"].get<std::vector<double>>()));
    if (p.contains("logits_at"))
      for (const auto& [pos, vals] : p["logits_at"].items()) {
        const int64_t t = std::stoll(pos);
        ASSERT_LT(t, n) << tag;
        worst = std::max(worst, row_ratio(row(t), vals.get<std::vector<double>>()));
      }
    if (p.contains("logits")) {
      const json& all = p["logits"];
      ASSERT_EQ(static_cast<int64_t>(all.size()), n) << tag;
      for (int64_t t = 0; t < n; ++t)
        worst = std::max(worst, row_ratio(row(t), all[t].get<std::vector<double>>()));
    }
    EXPECT_LE(worst, 1.0) << tag << ": logits beyond the tolerance";
    int greedy_checked = 0;
    if (greedy.is_object()) {
      std::vector<int32_t> want = greedy.at("output_ids").get<std::vector<int32_t>>();
      std::vector<double> gm = greedy.value("margins", std::vector<double>{});
      minimax_m3::GenerateOptions opts;
      opts.max_tokens = max_new;
      opts.eos_token_ids = loaded->eos_token_ids;
      opts.ignore_eos = static_cast<int64_t>(want.size()) == max_new;
      auto got = minimax_m3::generate(model, &cache, &pool, ids, opts);
      ASSERT_TRUE(got.is_ok()) << tag << ": " << got.status().to_string();
      size_t limit = want.size();
      for (size_t i = 0; i < gm.size() && i < want.size(); ++i)
        if (gm[i] <= near_tie) {
          limit = i + 1;
          break;
        }
      ASSERT_GE(got->size(), limit) << tag;
      for (size_t i = 0; i < limit; ++i) ASSERT_EQ((*got)[i], want[i]) << tag << " greedy " << i;
      greedy_checked = static_cast<int>(limit);
    }
    std::printf("[ cuda golden %-28s ] argmax %d/%d positions equal (%d near-ties skipped), "
                "greedy %d tokens equal, worst logit error %.3g of the tolerance\n",
                tag.c_str(), equal, checked, skipped, greedy_checked, worst);
  }
}

std::vector<std::string> fixture_names_or_placeholder() {
  auto d = fixture_dirs();
  if (d.empty()) d.push_back("");
  return d;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaGolden, ::testing::ValuesIn(fixture_names_or_placeholder()),
    [](const ::testing::TestParamInfo<std::string>& info) {
      std::string n = info.param.empty() ? "none" : fs::path(info.param).filename().string();
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(CudaM3TinyGolden, GreedyOutputEqualsTransformers) {
  const fs::path model_dir = repo_root() / "models" / "m3-tiny";
  const fs::path golden_path = repo_root() / "tests" / "fixtures" / "m3_tiny" / "golden.json";
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
    const int64_t tokens = static_cast<int64_t>(prompt.size() + want.size());
    const int64_t pages = (tokens + cfg.index_block_size - 1) / cfg.index_block_size + 1;
    minimax_m3::PagedKvCache cache(backend, cfg, pages);
    minimax_m3::SimplePagePool pool(pages);
    minimax_m3::GenerateOptions opts;
    opts.max_tokens = static_cast<int64_t>(want.size());
    opts.temperature = 0.0;
    opts.ignore_eos = true;
    auto got = minimax_m3::generate(loaded->model.get(), &cache, &pool, prompt, opts);
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
}  // namespace m3

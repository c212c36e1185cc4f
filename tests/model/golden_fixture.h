// Reading and checking the golden fixtures, shared by the CPU tests (golden_test.cpp,
// m3_tiny_golden_test.cpp) and the GPU test (tests/backend_cuda/cuda_golden_test.cpp):
// tests/fixtures/golden/<name>/expected.json (format in tests/fixtures/golden/README.md) and the
// bundled model's tests/fixtures/m3_tiny/golden.json.
//
// Tolerance (logits): |ours - ref| <= kRelTol · max(1, max|ref| over the vocab row); argmax and
// greedy tokens are compared wherever the reference's top-1/top-2 margin exceeds twice the
// tolerance at the prompt's logit scale (derivation in golden_test.cpp).
//
// The repository root is M3_REPO_ROOT when that holds the fixtures (built and run here), else the
// current directory (the GPU machine runs tools/device/run-all.sh from its copy of the repository).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "single_sequence.h"

namespace m3::golden {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kRelTol = 5e-5;

inline fs::path repo_root() {
  const fs::path built = M3_REPO_ROOT;
  if (fs::exists(built / "tests" / "fixtures")) return built;
  return fs::current_path();
}

inline fs::path m3_tiny_model_dir() { return repo_root() / "models" / "m3-tiny"; }
inline fs::path m3_tiny_golden_path() {
  return repo_root() / "tests" / "fixtures" / "m3_tiny" / "golden.json";
}

// Every tests/fixtures/golden/<name>/ with an expected.json, sorted.
inline std::vector<std::string> fixture_dirs() {
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

// fixture_dirs(), or one empty name that keeps the suite instantiated (the test skips it).
inline std::vector<std::string> fixture_names_or_placeholder() {
  auto d = fixture_dirs();
  if (d.empty()) d.push_back("");
  return d;
}

// Test name of a fixture directory: its name with non-alphanumerics as '_' ("none" for "").
inline std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.empty() ? "none" : fs::path(info.param).filename().string();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

inline json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// KV pages for a sequence of `tokens` tokens (one spare).
inline int64_t pages_for(const MiniMaxM3Config& cfg, int64_t tokens) {
  return (tokens + cfg.index_block_size - 1) / cfg.index_block_size + 1;
}

// "<fixture name> prompt <i>", for messages.
inline std::string prompt_tag(const std::string& dir, int i) {
  return fs::path(dir).filename().string() + " prompt " + std::to_string(i);
}

// One prefill of `ids` in a fresh sequence, logits of every position into *logits.
inline Status prefill_logits(minimax_m3::Model* model, minimax_m3::PagedKvCache* cache,
                             testing::SimplePagePool* pool, const std::vector<int32_t>& ids,
                             std::vector<float>* logits) {
  testing::SequenceRunner seq(model, cache, pool);
  return seq.append(ids, 0, true, logits);
}

// The logit tolerance of a reference row.
inline double row_tol(const std::vector<double>& ref) {
  double scale = 1.0;
  for (double x : ref) scale = std::max(scale, std::abs(x));
  return kRelTol * scale;
}

// Worst |ours - ref| / tol over a row (NaN counts as worst), with its id and the tolerance.
struct RowError {
  double worst = 0;
  size_t id = 0;
  double tol = 0;
};
inline RowError row_error(const float* ours, const std::vector<double>& ref) {
  RowError e;
  e.tol = row_tol(ref);
  for (size_t v = 0; v < ref.size(); ++v) {
    const double r = std::abs(ours[v] - ref[v]) / e.tol;
    if (!(r <= e.worst)) e.worst = r, e.id = v;
  }
  return e;
}

// Near-tie threshold: twice the logit tolerance at the logit scale of a prompt's logits.
inline double near_tie_threshold(const std::vector<float>& logits) {
  double scale = 1.0;
  for (float x : logits) scale = std::max(scale, static_cast<double>(std::abs(x)));
  return 2 * kRelTol * scale;
}

// Greedy tokens at most this prompt's "greedy.max_tokens" (0 without a greedy reference).
inline int64_t greedy_max_tokens(const json& p) {
  const json& greedy = p.contains("greedy") ? p["greedy"] : json();
  return greedy.is_object() ? greedy.value("max_tokens", 0) : 0;
}

// Argmax per position against p["argmax"], where the reference is not at a near-tie.
struct ArgmaxCount {
  int skipped = 0, checked = 0, equal = 0;
};
inline void check_argmax(const json& p, const std::vector<float>& logits, int64_t n, int64_t vocab,
                         double near_tie, const std::string& tag, ArgmaxCount* count) {
  std::vector<int32_t> want_argmax = p.at("argmax").get<std::vector<int32_t>>();
  ASSERT_EQ(static_cast<int64_t>(want_argmax.size()), n) << tag;
  std::vector<double> margins = p.value("argmax_margin", std::vector<double>{});
  for (int64_t t = 0; t < n; ++t) {
    const int32_t got =
        testing::argmax(std::span<const float>(logits.data() + t * vocab, vocab));
    const double margin = t < static_cast<int64_t>(margins.size()) ? margins[t] : INFINITY;
    if (margin <= near_tie) {
      ++count->skipped;
      continue;
    }
    ++count->checked;
    count->equal += got == want_argmax[t];
    EXPECT_EQ(got, want_argmax[t]) << tag << " position " << t << " (ref margin " << margin
                                   << ")";
  }
}

// The reference logit rows of a prompt (last position, selected positions, or all positions):
// fn(position, reference row, label).
inline void for_each_logit_row(
    const json& p, int64_t n, const std::string& tag,
    const std::function<void(int64_t, const std::vector<double>&, const std::string&)>& fn) {
  if (p.contains("last_logits"))
    fn(n - 1, p["last_logits"].get<std::vector<double>>(), tag + " last");
  if (p.contains("logits_at"))
    for (const auto& [pos, vals] : p["logits_at"].items()) {
      const int64_t t = std::stoll(pos);
      ASSERT_LT(t, n) << tag;
      fn(t, vals.get<std::vector<double>>(), tag + " position " + pos);
    }
  if (p.contains("logits")) {
    const json& all = p["logits"];
    ASSERT_EQ(static_cast<int64_t>(all.size()), n) << tag;
    for (int64_t t = 0; t < n; ++t)
      fn(t, all[t].get<std::vector<double>>(), tag + " position " + std::to_string(t));
  }
}

// How many greedy tokens to compare: all, or up to and including the first near-tie (the
// continuations may legitimately diverge after it).
inline size_t greedy_compare_limit(const std::vector<int32_t>& want, const std::vector<double>& gm,
                                   double near_tie) {
  size_t limit = want.size();
  for (size_t i = 0; i < gm.size() && i < want.size(); ++i)
    if (gm[i] <= near_tie) {
      limit = i + 1;
      break;
    }
  return limit;
}

// Greedy generation of `n` tokens after `prompt` (EOS ignored) in a fresh cache: the m3-tiny
// golden cases' settings.
// `kv_dtype`: the KV cache's storage (--kv-cache-dtype).
inline Result<std::vector<int32_t>> greedy_tokens_with(minimax_m3::Model* model, Backend* backend,
                                                       const MiniMaxM3Config& cfg,
                                                       const std::vector<int32_t>& prompt,
                                                       int64_t n, KvCacheDtype kv_dtype) {
  const int64_t pages = pages_for(cfg, static_cast<int64_t>(prompt.size()) + n);
  minimax_m3::PagedKvCache cache(backend, cfg, pages, kv_dtype);
  testing::SimplePagePool pool(pages);
  testing::GenerateOptions opts;
  opts.max_tokens = n;
  opts.temperature = 0.0;
  opts.ignore_eos = true;
  return testing::generate(model, &cache, &pool, prompt, opts);
}
inline Result<std::vector<int32_t>> greedy_tokens(minimax_m3::Model* model, Backend* backend,
                                                  const MiniMaxM3Config& cfg,
                                                  const std::vector<int32_t>& prompt, int64_t n) {
  return greedy_tokens_with(model, backend, cfg, prompt, n, KvCacheDtype::kFloat32);
}

}  // namespace m3::golden

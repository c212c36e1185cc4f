// `m3serve score` / `m3serve generate` end to end on a golden fixture: the exact JSON interface
// other tools parse, the numbers against expected.json, and clean failures on bad input.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

const std::string kFixture = std::string(M3_REPO_ROOT) + "/tests/fixtures/golden/sparse_moe";

struct CliRun {
  int rc = -1;
  std::string out;
};

// Runs m3serve with `args`; stdout captured, stderr folded in when `merge_stderr`.
CliRun run_cli(const std::string& args, bool merge_stderr = false) {
  std::string cmd = std::string(M3SERVE_BIN) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  CliRun r;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  int st = pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

json expected() {
  std::ifstream in(kFixture + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(Cli, ScoreMatchesFixture) {
  json p = expected()["prompts"][0];
  auto ids = p["ids"].get<std::vector<int>>();
  CliRun r = run_cli("score --model-path " + kFixture + " --prompt-ids " + join_ids(ids) +
                  " --output-format json --threads 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  json got = json::parse(r.out);
  EXPECT_EQ(got["argmax"].get<std::vector<int>>(), p["argmax"].get<std::vector<int>>());
  auto last = got["last_logits"].get<std::vector<double>>();
  auto want = p["last_logits"].get<std::vector<double>>();
  ASSERT_EQ(last.size(), want.size());
  double scale = 1;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (size_t v = 0; v < want.size(); ++v)
    ASSERT_NEAR(last[v], want[v], 5e-5 * scale) << "id " << v;  // golden_test.cpp's tolerance
}

TEST(Cli, GenerateGreedyMatchesFixture) {
  json p = expected()["prompts"][0];
  auto ids = p["ids"].get<std::vector<int>>();
  int max_tokens = p["greedy"]["max_tokens"].get<int>();
  CliRun r = run_cli("generate --model-path " + kFixture + " --prompt-ids " + join_ids(ids) +
                  " --max-tokens " + std::to_string(max_tokens) +
                  " --temperature 0 --ignore-eos --output-format json --device cpu");
  ASSERT_EQ(r.rc, 0) << r.out;
  json got = json::parse(r.out);
  EXPECT_EQ(got["output_ids"].get<std::vector<int>>(),
            p["greedy"]["output_ids"].get<std::vector<int>>());
}

TEST(Cli, SamplingIsSeeded) {
  std::string base = "generate --model-path " + kFixture +
                     " --prompt-ids 5,6,7 --max-tokens 6 --temperature 0.8 --ignore-eos";
  CliRun a = run_cli(base + " --seed 11"), b = run_cli(base + " --seed 11");
  ASSERT_EQ(a.rc, 0);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(json::parse(a.out)["output_ids"].size(), 6u);
}

TEST(Cli, BadInputFailsCleanly) {
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"score --model-path /nonexistent/dir --prompt-ids 1", "does not exist"},
      {"score --model-path " + kFixture + " --prompt-ids 1,x", "entry 2"},
      {"score --model-path " + kFixture + " --prompt-ids 1,100000", "not in the vocabulary"},
      // Without the CUDA backend: "not built with the CUDA backend"; with it but no GPU (CI):
      // "no usable GPU". Both name the flag.
      {"score --model-path " + kFixture + " --prompt-ids 1 --device cuda", "--device cuda: "},
      {"score --model-path " + kFixture + " --prompt-ids 1 --bogus", "unknown option"},
      {"score --prompt-ids 1", "required"},
      {"generate --model-path " + kFixture + " --prompt-ids 1 --max-tokens", "needs a value"},
      {"generate --model-path " + kFixture + " --prompt-ids 1 --temperature abc", "temperature"},
      {"generate --model-path " + std::string(M3_REPO_ROOT) + "/tests --prompt-ids 1",
       "config.json"},
  };
  for (const Case& c : cases) {
    CliRun r = run_cli(c.args, true);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.rc, -1) << c.args << " (crashed?)";
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << " printed: " << r.out;
  }
}

}  // namespace

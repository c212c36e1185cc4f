#include "core/json_depth.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <functional>
#include <random>
#include <string>

namespace m3 {
namespace {

TEST(JsonDepth, CountsArraysAndObjects) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("\"x\""), 0);
  EXPECT_EQ(json_nesting_depth("[]"), 1);
  EXPECT_EQ(json_nesting_depth("{\"a\":[1,{\"b\":[]}]}"), 4);
  EXPECT_EQ(json_nesting_depth("[[],[[]],[]]"), 3);
}

TEST(JsonDepth, IgnoresBracketsInsideStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{{"})"), 1);
  // An escaped quote does not end the string; an escaped backslash does not escape the quote.
  EXPECT_EQ(json_nesting_depth(R"(["\"[[[", [1]])"), 2);
  EXPECT_EQ(json_nesting_depth(R"(["\\", [[1]]])"), 3);
}

TEST(JsonDepth, StopsPastTheLimit) {
  const std::string deep(1'000'000, '[');
  EXPECT_EQ(json_nesting_depth(deep, 128), 129);
  EXPECT_TRUE(json_too_deep(deep));
  std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_FALSE(json_too_deep(ok));
  EXPECT_TRUE(json_too_deep("[" + ok + "]"));
}

// The scan agrees with the depth of what nlohmann builds, on random valid documents.
int built_depth(const nlohmann::json& j) {
  if (!j.is_structured()) return 0;
  int d = 0;
  for (const auto& child : j) d = std::max(d, built_depth(child));
  return d + 1;
}

TEST(JsonDepth, AgreesWithTheParserOnRandomDocuments) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::function<nlohmann::json(int)> make = [&](int budget) -> nlohmann::json {
      int kind = budget > 0 ? static_cast<int>(rng() % 5) : static_cast<int>(rng() % 2);
      if (kind == 0) return "s[{\"\\" + std::to_string(rng() % 100);
      if (kind == 1) return static_cast<int>(rng() % 100);
      nlohmann::json c = kind == 2 ? nlohmann::json::array() : nlohmann::json::object();
      int n = static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) {
        if (c.is_array())
          c.push_back(make(budget - 1));
        else
          c["k{" + std::to_string(i)] = make(budget - 1);
      }
      return c;
    };
    nlohmann::json doc = make(static_cast<int>(rng() % 12));
    EXPECT_EQ(json_nesting_depth(doc.dump(), 1000), built_depth(doc)) << doc.dump();
  }
}

}  // namespace
}  // namespace m3

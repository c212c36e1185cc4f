#include "engine/stop_strings.h"

#include <gtest/gtest.h>

namespace m3 {
namespace {

TEST(StopStrings, HoldsBackOnlyPossibleStopPrefixes) {
  StopStringFilter f({"</end>", "STOP"});
  EXPECT_EQ(f.push("hello <"), "hello ");  // "<" may start "</end>"
  EXPECT_EQ(f.push("/e"), "");
  EXPECT_EQ(f.push("x"), "</ex");          // not a stop after all
  EXPECT_EQ(f.push("ST"), "");
  EXPECT_EQ(f.push("OP and more"), "");    // matched: stop and the rest dropped
  ASSERT_TRUE(f.matched().has_value());
  EXPECT_EQ(f.matched_string(), "STOP");
  EXPECT_EQ(f.push("later"), "");
}

TEST(StopStrings, EarliestMatchWinsAcrossTokens) {
  StopStringFilter f({"bcd", "ab"});
  EXPECT_EQ(f.push("xa"), "x");
  EXPECT_EQ(f.push("bcd"), "");  // "ab" starts first
  EXPECT_EQ(f.matched_string(), "ab");
}

TEST(StopStrings, FlushReturnsHeldText) {
  StopStringFilter f({"abc"});
  EXPECT_EQ(f.push("xxab"), "xx");
  EXPECT_EQ(f.flush(), "ab");
}

TEST(StopStrings, Utf8CharactersAreNeverSplit) {
  StopStringFilter f;
  const std::string e_acute = "\xC3\xA9";     // é
  const std::string euro = "\xE2\x82\xAC";    // €
  EXPECT_EQ(f.push("a\xC3"), "a");
  EXPECT_EQ(f.push("\xA9"), e_acute);
  EXPECT_EQ(f.push("\xE2\x82"), "");
  EXPECT_EQ(f.push("\xAC!"), euro + "!");
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);  // 3 of 4 bytes of an emoji
  EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98\x80"), 0u);
}

TEST(StopStrings, MultibyteStopString) {
  StopStringFilter f({"\xE2\x82\xAC"});
  EXPECT_EQ(f.push("5 \xE2"), "5 ");
  EXPECT_EQ(f.push("\x82\xAC"), "");
  EXPECT_TRUE(f.matched().has_value());
}

}  // namespace
}  // namespace m3

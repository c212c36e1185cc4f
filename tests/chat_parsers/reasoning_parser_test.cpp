#include <gtest/gtest.h>

#include "chat/parsers/reasoning_parser_minimax_m3.h"
#include "parser_test_util.h"

namespace m3::chat {
namespace {

using Start = MiniMaxM3ReasoningParser::Start;

ReasoningDelta run(Start start, const std::vector<std::string>& chunks) {
  MiniMaxM3ReasoningParser p(start);
  ReasoningDelta all;
  for (const auto& c : chunks) {
    ReasoningDelta d = p.feed(c);
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  ReasoningDelta d = p.finish();
  all.reasoning += d.reasoning;
  all.content += d.content;
  return all;
}

ReasoningDelta run(Start start, std::string_view text) {
  return run(start, std::vector<std::string>{std::string(text)});
}

TEST(ReasoningParser, StartFromPrompt) {
  EXPECT_EQ(MiniMaxM3ReasoningParser::start_for_prompt("]~b]ai\n<mm:think>"), Start::kReasoning);
  EXPECT_EQ(MiniMaxM3ReasoningParser::start_for_prompt("]~b]ai\n<mm:think>\n"), Start::kReasoning);
  EXPECT_EQ(MiniMaxM3ReasoningParser::start_for_prompt("]~b]ai\n</mm:think>"), Start::kContent);
  EXPECT_EQ(MiniMaxM3ReasoningParser::start_for_prompt("]~b]ai\n"), Start::kAdaptive);
}

TEST(ReasoningParser, EnabledModeStartsInsideReasoning) {
  auto d = run(Start::kReasoning, "\nLet me think.\n</mm:think>\n\nThe answer is 4.");
  EXPECT_EQ(d.reasoning, "Let me think.");       // trimmed at both ends
  EXPECT_EQ(d.content, "\n\nThe answer is 4.");  // content whitespace is the caller's business
}

TEST(ReasoningParser, EnabledModeStrayLeadingCloserMeansEmptyReasoning) {
  auto d = run(Start::kReasoning, "</mm:think>Hi");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Hi");
}

TEST(ReasoningParser, EnabledModeWithoutCloserIsAllReasoning) {
  auto d = run(Start::kReasoning, "still thinking when max_tokens hit");
  EXPECT_EQ(d.reasoning, "still thinking when max_tokens hit");
  EXPECT_EQ(d.content, "");
}

TEST(ReasoningParser, AdaptiveWithOpener) {
  auto d = run(Start::kAdaptive, "  <mm:think>plan</mm:think>answer");
  EXPECT_EQ(d.reasoning, "plan");
  EXPECT_EQ(d.content, "answer");
}

TEST(ReasoningParser, AdaptiveBareCloserMeansNoReasoning) {
  auto d = run(Start::kAdaptive, "</mm:think>\n\nDirect answer.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "\n\nDirect answer.");
}

TEST(ReasoningParser, AdaptivePlainAnswer) {
  auto d = run(Start::kAdaptive, "Just text with <b>tags</b>.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Just text with <b>tags</b>.");
}

TEST(ReasoningParser, AdaptiveUndecidedPrefixWaits) {
  MiniMaxM3ReasoningParser p(Start::kAdaptive);
  auto d1 = p.feed("<mm:");
  EXPECT_TRUE(d1.empty());
  auto d2 = p.feed("think>abc");
  EXPECT_EQ(d2.reasoning, "abc");
  EXPECT_TRUE(p.in_reasoning());
  auto d3 = p.feed("</mm:th");
  EXPECT_TRUE(d3.empty());  // a possible closer is held back
  auto d4 = p.feed("ink>x");
  EXPECT_EQ(d4.content, "x");
  EXPECT_FALSE(p.in_reasoning());
}

TEST(ReasoningParser, DisabledModeStripsStrayCloser) {
  auto d = run(Start::kContent, "</mm:think>Answer");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Answer");
}

TEST(ReasoningParser, ToolCallInsideReasoningEndsIt) {
  std::string tc =
      "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"f\">]<]minimax[>[</invoke>";
  auto d = run(Start::kReasoning, "I should call f.\n" + tc);
  EXPECT_EQ(d.reasoning, "I should call f.");
  EXPECT_EQ(d.content, tc);  // passed on intact for the tool parser
  auto d2 = run(Start::kReasoning, "call it ]<]minimax[>[<invoke name=\"f\">");
  EXPECT_EQ(d2.reasoning, "call it");
  EXPECT_EQ(d2.content, "]<]minimax[>[<invoke name=\"f\">");
}

TEST(ReasoningParser, NamespaceMarkerAloneDoesNotEndReasoning) {
  auto d = run(Start::kReasoning, "a ]<]minimax[>[ b</mm:think>c");
  EXPECT_EQ(d.reasoning, "a ]<]minimax[>[ b");
  EXPECT_EQ(d.content, "c");
}

TEST(ReasoningParser, RepeatedOpenerDroppedAndLaterSegment) {
  auto d =
      run(Start::kReasoning, "<mm:think>one</mm:think>mid<mm:think>two</mm:think>end</mm:think>");
  EXPECT_EQ(d.reasoning, "onetwo");
  EXPECT_EQ(d.content, "midend");
}

TEST(ReasoningParser, PartialMarkerAtEndIsText) {
  auto d = run(Start::kReasoning, "thinking </mm:thi");
  EXPECT_EQ(d.reasoning, "thinking </mm:thi");
  auto d2 = run(Start::kAdaptive, "<mm:");
  EXPECT_EQ(d2.content, "<mm:");
}

TEST(ReasoningParser, ByteByByteEqualsWhole) {
  const char* cases[] = {
      "\nabc\n</mm:think>\n\nxyz",
      "<mm:think><mm:think>r</mm:think></mm:think>c",
      "r ]<]minimax[>[<tool_call>x",
      "</mm:think>",
      "",
      "  \n ",
  };
  for (Start s : {Start::kReasoning, Start::kAdaptive, Start::kContent}) {
    for (const char* c : cases) {
      auto whole = run(s, c);
      auto split = run(s, testing::bytes(c));
      EXPECT_EQ(whole.reasoning, split.reasoning) << c;
      EXPECT_EQ(whole.content, split.content) << c;
    }
  }
}

}  // namespace
}  // namespace m3::chat

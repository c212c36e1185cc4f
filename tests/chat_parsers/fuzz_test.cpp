// Random-chunking fuzz of the whole output pipeline (reasoning + tool calls): for every split of a
// model output into chunks, including several tokens per step as speculative decoding produces,
// the deltas must fold into exactly the message that parsing the whole output gives, with a valid
// delta sequence (each call begins with its name, indices in order) and no markup in content.
#include <gtest/gtest.h>

#include "parser_test_util.h"

namespace m3::chat {
namespace {

using json = nlohmann::json;
using testing::Message;
using Start = MiniMaxM3ReasoningParser::Start;

const std::string NS = "]<]minimax[>[";

std::string open(const std::string& t) {
  return NS + "<" + t + ">";
}
std::string close(const std::string& t) {
  return NS + "</" + t + ">";
}
std::string param(const std::string& k, const std::string& v) {
  return open(k) + v + close(k);
}
std::string invoke(const std::string& name, const std::string& body) {
  return NS + "<invoke name=\"" + name + "\">" + body + close("invoke");
}

json tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{
      "query":{"type":"string"},"limit":{"type":"integer"},"exact":{"type":"boolean"},
      "filters":{"type":"object","properties":{"lang":{"type":"string"},"year":{"type":"integer"}}},
      "sites":{"type":"array","items":{"type":"string"}}}}}},
    {"type":"function","function":{"name":"write","parameters":{"type":"object","properties":{
      "path":{"type":"string"},"text":{"type":"string"}}}}}
  ])");
}

std::vector<std::string> corpus() {
  std::string call1 =
      invoke("search", param("query", "weather in \"Paris\" <today>") + param("limit", "5") +
                           param("exact", "false") +
                           param("filters", param("lang", "fr") + param("year", "2024")) +
                           param("sites", param("item", "a.com") + param("item", "b.org")));
  std::string call2 =
      invoke("write", param("path", "/x/y.py") +
                          param("text", "def f(a, b):\n    return a < b\n# ]<] not a tag\n"));
  std::string call3 = invoke("unknown", param("n", "3") + param("obj", param("k", "v")));
  return {
      "plain answer, no markup at all",
      "\n<mm:think>\nI think.\n</mm:think>\n\nAnswer here.",
      "reasoning only, enabled mode</mm:think>\n\nThen the answer with ]<] brackets.",
      "</mm:think>\n\nNo reasoning.",
      "Let me look.\n" + open("tool_call") + "\n" + call1 + "\n" + close("tool_call"),
      "plan the calls</mm:think>\n" + open("tool_call") + "\n" + call1 + "\n" + call2 + "\n" +
          call3 + "\n" + close("tool_call") + "\nAll done.",
      "thinking then calling " + open("tool_call") + call2 + close("tool_call"),
      open("tool_call") + invoke("search", "") + close("tool_call") + open("tool_call") + call2 +
          close("tool_call"),
      "text " + call1 + " unwrapped " + call3,
      open("tool_call") + NS + "<invoke name=\"write\">" + open("path") + "/a" + NS +
          "<invoke name=\"search\">" + open("query") + "q" + close("invoke") + close("parameter"),
      "truncated " + open("tool_call") + NS + "<invoke name=\"search\">" + open("filters") +
          open("lang") + "e",
      "中文 reasoning 😀</mm:think>中文 answer " + open("tool_call") +
          invoke("write", param("text", "ü 😀 ç")) + close("tool_call"),
      "<mm:think>a</mm:think>b<mm:think>c</mm:think>d</mm:think>e",
  };
}

std::vector<OutputParserOptions> option_sets() {
  std::vector<OutputParserOptions> out;
  for (Start s : {Start::kReasoning, Start::kAdaptive, Start::kContent}) {
    for (int mode = 0; mode < 3; ++mode) {
      OutputParserOptions o;
      o.reasoning = mode != 1;
      o.reasoning_start = s;
      o.tools = mode != 2;
      o.tools_json = tools();
      out.push_back(o);
      o.continues_content = true;  // continue_final_message: leading whitespace kept
      out.push_back(o);
    }
  }
  return out;
}

void check_message(const Message& m, bool reasoning_on, bool tools_on) {
  for (const auto& c : m.calls) EXPECT_TRUE(json::accept(c.arguments)) << c.arguments;
  if (reasoning_on) {
    EXPECT_EQ(m.content.find("<mm:think>"), std::string::npos) << m.content;
    EXPECT_EQ(m.content.find("</mm:think>"), std::string::npos) << m.content;
  }
  if (tools_on) {
    EXPECT_EQ(m.content.find(NS), std::string::npos) << m.content;
  }
}

TEST(ParserFuzz, RandomChunkingMatchesWholeParse) {
  std::mt19937 rng(12345);
  int checked = 0;
  for (const auto& opt : option_sets()) {
    for (const auto& text : corpus()) {
      Message whole = testing::parse_whole(opt, text);
      check_message(whole, opt.reasoning, opt.tools);
      for (int trial = 0; trial < 60; ++trial) {
        std::vector<std::string> chunks;
        if (trial < 20) {
          chunks = testing::random_split(text, 1 + trial % 4 + 1, rng);  // 2-5 pieces, any byte
        } else if (trial < 40) {
          auto toks = testing::pseudo_tokens(text, rng);
          chunks = testing::group_steps(toks, 1 + trial % 8, rng);  // speculative steps of 1..8
        } else {
          std::uniform_int_distribution<int> len(1, 12);
          for (size_t i = 0; i < text.size();) {
            size_t n = std::min<size_t>(len(rng), text.size() - i);
            chunks.push_back(text.substr(i, n));
            i += n;
          }
        }
        OutputParser p(opt);
        Message m;
        std::string error;
        for (const auto& c : chunks) ASSERT_TRUE(testing::fold(p.feed(c), m, &error)) << error;
        ASSERT_TRUE(testing::fold(p.finish(), m, &error)) << error;
        ASSERT_EQ(m.reasoning, whole.reasoning) << text;
        ASSERT_EQ(m.content, whole.content) << text;
        ASSERT_EQ(m.calls.size(), whole.calls.size()) << text;
        for (size_t i = 0; i < m.calls.size(); ++i) ASSERT_EQ(m.calls[i], whole.calls[i]) << text;
        ++checked;
      }
      // Byte by byte, the hardest split.
      Message bytewise = testing::parse_chunks(opt, testing::bytes(text));
      ASSERT_EQ(bytewise, whole) << text;
    }
  }
  EXPECT_GT(checked, 5000);
}

TEST(ParserFuzz, ExpectedMessageForKnownOutput) {
  OutputParserOptions opt;
  opt.reasoning = true;
  opt.reasoning_start = Start::kReasoning;
  opt.tools = true;
  opt.tools_json = tools();
  Message m = testing::parse_whole(opt, corpus()[5]);
  EXPECT_EQ(m.reasoning, "plan the calls");
  EXPECT_EQ(m.content, "All done.");
  ASSERT_EQ(m.calls.size(), 3u);
  EXPECT_EQ(json::parse(m.calls[0].arguments),
            json::parse(R"({"query":"weather in \"Paris\" <today>","limit":5,"exact":false,
                "filters":{"lang":"fr","year":2024},"sites":["a.com","b.org"]})"));
  EXPECT_EQ(json::parse(m.calls[1].arguments)["text"],
            "def f(a, b):\n    return a < b\n# ]<] not a tag\n");
  EXPECT_EQ(m.calls[2].name, "unknown");
  EXPECT_EQ(json::parse(m.calls[2].arguments), json::parse(R"({"n":3,"obj":{"k":"v"}})"));
}

// Random well-formed outputs from a small grammar, fed in random speculative steps.
std::string random_output(std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 99);
  static const char* words[] = {"alpha", " beta", "\n",  " <x>", "\"q\"",
                                "ü",     " 10",   "]<]", " true"};
  auto text = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += words[pick(rng) % 9];
    return s;
  };
  std::string out;
  if (pick(rng) < 50) out += text(pick(rng) % 5) + "</mm:think>";
  out += text(pick(rng) % 4);
  int blocks = pick(rng) % 3;
  for (int b = 0; b < blocks; ++b) {
    out += open("tool_call") + "\n";
    int calls = 1 + pick(rng) % 3;
    for (int c = 0; c < calls; ++c) {
      std::string body;
      if (pick(rng) < 70) body += param("query", text(pick(rng) % 4));
      if (pick(rng) < 50) body += param("limit", std::to_string(pick(rng)));
      if (pick(rng) < 30) body += param("filters", param("lang", text(1)) + param("year", "7"));
      if (pick(rng) < 30) body += param("sites", param("item", text(1)) + param("item", text(2)));
      out += invoke(pick(rng) < 80 ? "search" : "other", body) + "\n";
    }
    out += close("tool_call") + text(pick(rng) % 3);
  }
  if (pick(rng) < 20) {  // truncation (max_tokens), at a UTF-8 character boundary
    size_t n = out.size() * (pick(rng) + 1) / 101;
    while (n > 0 && n < out.size() && (static_cast<unsigned char>(out[n]) & 0xC0) == 0x80) --n;
    out.resize(n);
  }
  return out;
}

// A continued assistant message keeps its continuation's leading whitespace, whichever parsers
// run; a fresh message's content is trimmed.
TEST(ParserFuzz, ContinuedContentKeepsLeadingWhitespace) {
  for (auto opt : option_sets()) {
    if (opt.reasoning && opt.reasoning_start == Start::kReasoning) continue;  // that is reasoning
    const bool continues = opt.continues_content;
    Message m = testing::parse_whole(opt, " and on.");
    EXPECT_EQ(m.content, continues ? " and on." : "and on.")
        << opt.reasoning << opt.tools << static_cast<int>(opt.reasoning_start);
    EXPECT_EQ(testing::parse_chunks(opt, testing::bytes(" and on.")), m);
  }
}

TEST(ParserFuzz, RandomGrammarOutputs) {
  std::mt19937 rng(777);
  OutputParserOptions opt;
  opt.reasoning = true;
  opt.reasoning_start = Start::kReasoning;
  opt.tools = true;
  opt.tools_json = tools();
  for (int i = 0; i < 2000; ++i) {
    std::string text = random_output(rng);
    Message whole = testing::parse_whole(opt, text);
    for (const auto& c : whole.calls) ASSERT_TRUE(json::accept(c.arguments)) << text;
    auto toks = testing::pseudo_tokens(text, rng);
    auto steps = testing::group_steps(toks, 6, rng);
    Message m;
    OutputParser p(opt);
    std::string error;
    for (const auto& s : steps) ASSERT_TRUE(testing::fold(p.feed(s), m, &error)) << error;
    ASSERT_TRUE(testing::fold(p.finish(), m, &error)) << error;
    std::string shown;
    for (const auto& st : steps) shown += "|" + st;
    ASSERT_EQ(m, whole) << text << "\nsteps: " << shown;
  }
}

}  // namespace
}  // namespace m3::chat

#include <gtest/gtest.h>

#include "chat/parsers/tool_parser_minimax_m3.h"
#include "parser_test_util.h"

namespace m3::chat {
namespace {

using json = nlohmann::json;
using testing::Message;

const std::string NS = "]<]minimax[>[";

std::string open(const std::string& t) {
  return NS + "<" + t + ">";
}
std::string close(const std::string& t) {
  return NS + "</" + t + ">";
}
std::string invoke(const std::string& name, const std::string& body) {
  return NS + "<invoke name=\"" + name + "\">" + body + close("invoke");
}
std::string param(const std::string& k, const std::string& v) {
  return open(k) + v + close(k);
}
std::string block(const std::string& invokes) {
  return open("tool_call") + "\n" + invokes + "\n" + close("tool_call");
}

json tools() {
  return json::parse(R"([
    {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
      "city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]},
      "days":{"type":"integer"},"lat":{"type":"number"},"precise":{"type":"boolean"},
      "tags":{"type":"array","items":{"type":"string"}},
      "opts":{"type":"object","properties":{"depth":{"type":"integer"},"name":{"type":"string"},
              "inner":{"type":"object","properties":{"x":{"type":"number"}}}}},
      "points":{"type":"array","items":{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}}}},
      "maybe":{"anyOf":[{"type":"integer"},{"type":"string"}]},
      "nullable_int":{"type":["integer","null"]},
      "ref":{"$ref":"#/$defs/Pt"},
      "free":{}
    },"$defs":{"Pt":{"type":"object","properties":{"x":{"type":"integer"}}}}}}},
    {"type":"function","function":{"name":"noargs","parameters":{"type":"object","properties":{}}}},
    {"type":"function","function":{"name":"write_file","parameters":{"type":"object","properties":{
      "path":{"type":"string"},"content":{"type":"string"}}}}}
  ])");
}

OutputParserOptions tool_opts() {
  OutputParserOptions o;
  o.tools = true;
  o.tools_json = tools();
  return o;
}

Message parse(const std::string& text) {
  return testing::parse_whole(tool_opts(), text);
}

json args(const Message& m, size_t i) {
  return json::parse(m.calls.at(i).arguments);
}

TEST(ToolParser, SingleCallWithContentAround) {
  auto m =
      parse("Let me check.\n" +
            block(invoke("get_weather", param("city", "Paris") + param("unit", "c"))) + "\nDone.");
  EXPECT_EQ(m.content, "Let me check.Done.");
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(m.calls[0].name, "get_weather");
  EXPECT_EQ(m.calls[0].arguments, R"({"city":"Paris","unit":"c"})");
}

TEST(ToolParser, SeveralInvokesAndBlocks) {
  auto m = parse(block(invoke("get_weather", param("city", "A")) + "\n" +
                       invoke("get_weather", param("city", "B"))) +
                 block(invoke("noargs", "")));
  ASSERT_EQ(m.calls.size(), 3u);
  EXPECT_EQ(args(m, 0), json({{"city", "A"}}));
  EXPECT_EQ(args(m, 1), json({{"city", "B"}}));
  EXPECT_EQ(m.calls[2].name, "noargs");
  EXPECT_EQ(m.calls[2].arguments, "{}");
  EXPECT_EQ(m.content, "");
}

TEST(ToolParser, TypedScalars) {
  auto m = parse(
      block(invoke("get_weather", param("days", "3") + param("lat", "48.85") +
                                      param("precise", "true") + param("nullable_int", "null"))));
  EXPECT_EQ(m.calls[0].arguments, R"({"days":3,"lat":48.85,"precise":true,"nullable_int":null})");
}

TEST(ToolParser, IntegerWrittenAsFloatAndPythonBooleans) {
  auto m = parse(block(invoke("get_weather", param("days", "1400.0") + param("precise", "False"))));
  EXPECT_EQ(args(m, 0), json({{"days", 1400}, {"precise", false}}));
}

TEST(ToolParser, StringSchemaKeepsNumericLookingText) {
  auto m = parse(block(invoke("get_weather", param("city", "10001"))));
  EXPECT_EQ(args(m, 0), json({{"city", "10001"}}));
}

TEST(ToolParser, WrongTypeFallsBackToJsonThenString) {
  auto m = parse(block(invoke("get_weather", param("days", "three") + param("lat", "[1,2]"))));
  EXPECT_EQ(args(m, 0), json::parse(R"({"days":"three","lat":[1,2]})"));
}

TEST(ToolParser, NestedObjectAndArrays) {
  std::string body = param("tags", param("item", "a") + param("item", "b")) +
                     param("opts", param("depth", "2") + param("name", "x y") +
                                       param("inner", param("x", "1.5"))) +
                     param("points", param("item", param("x", "1") + param("y", "2")) +
                                         param("item", param("x", "3") + param("y", "4")));
  auto m = parse(block(invoke("get_weather", body)));
  EXPECT_EQ(args(m, 0), json::parse(R"({"tags":["a","b"],"opts":{"depth":2,"name":"x y",
      "inner":{"x":1.5}},"points":[{"x":1,"y":2},{"x":3,"y":4}]})"));
}

TEST(ToolParser, NestedTagsWithNewlinesBetween) {
  std::string body = "\n" + open("tags") + "\n" + param("item", "a") + "\n" + param("item", "b") +
                     "\n" + close("tags") + "\n";
  auto m = parse(block(invoke("get_weather", body)));
  EXPECT_EQ(args(m, 0), json::parse(R"({"tags":["a","b"]})"));
}

TEST(ToolParser, AnyOfTypeListsAndRef) {
  auto m = parse(block(invoke("get_weather", param("maybe", "7") + param("ref", param("x", "5")))));
  EXPECT_EQ(args(m, 0), json::parse(R"({"maybe":7,"ref":{"x":5}})"));
  auto m2 = parse(block(invoke("get_weather", param("maybe", "seven"))));
  EXPECT_EQ(args(m2, 0), json::parse(R"({"maybe":"seven"})"));
}

TEST(ToolParser, NoSchemaInference) {
  auto m = parse(
      block(invoke("unknown_tool", param("n", "42") + param("s", "hello") + param("b", "true") +
                                       param("j", R"({"a":1})") + param("o", param("k", "v")) +
                                       param("l", param("item", "1") + param("item", "x")))));
  EXPECT_EQ(m.calls[0].name, "unknown_tool");
  EXPECT_EQ(args(m, 0), json::parse(R"({"n":42,"s":"hello","b":true,"j":{"a":1},"o":{"k":"v"},
      "l":[1,"x"]})"));
  auto m2 = parse(block(invoke("get_weather", param("free", "1"))));
  EXPECT_EQ(args(m2, 0), json::parse(R"({"free":1})"));
}

TEST(ToolParser, RawTextWithAngleBracketsQuotesAndNewlines) {
  std::string code = "if (a < b && c > d) {\n  print(\"hi\\n\");\n}\n<div>x</div>\n";
  auto m = parse(block(invoke("write_file", param("path", "/tmp/a.c") + param("content", code))));
  EXPECT_EQ(args(m, 0)["content"], code);
  EXPECT_EQ(args(m, 0)["path"], "/tmp/a.c");
}

TEST(ToolParser, UnicodeAndControlCharacters) {
  std::string s = "héllo wörld 中文 😀 tab\there \x01";
  auto m = parse(block(invoke("write_file", param("content", s))));
  EXPECT_EQ(args(m, 0)["content"], s);
}

TEST(ToolParser, InvokeWithoutWrapper) {
  auto m = parse("Sure. " + invoke("get_weather", param("city", "Rome")) + " Bye");
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(args(m, 0), json({{"city", "Rome"}}));
  EXPECT_EQ(m.content, "Sure.Bye");
}

TEST(ToolParser, RaggedInvokesWithoutClosingTags) {
  // A real M3 output: new <invoke>s before the previous closed, then stray closers.
  std::string text = open("tool_call") + "\n" + NS + "<invoke name=\"write_file\">" + open("path") +
                     "/a" + close("path") + NS + "<invoke name=\"write_file\">" + open("path") +
                     "/b" + close("path") + close("invoke") + close("parameter") + close("invoke");
  auto m = parse(text);
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(args(m, 0), json({{"path", "/a"}}));
  EXPECT_EQ(args(m, 1), json({{"path", "/b"}}));
  EXPECT_EQ(m.content, "");
}

TEST(ToolParser, MissingCloseTagsAreClosedByOuterTags) {
  std::string text = block(NS + "<invoke name=\"get_weather\">" + open("opts") + open("name") +
                           "abc" + close("opts") + close("invoke"));
  auto m = parse(text);
  EXPECT_EQ(args(m, 0), json::parse(R"({"opts":{"name":"abc"}})"));
}

TEST(ToolParser, TruncatedOutputStillGivesValidJson) {
  const std::string full =
      block(invoke("get_weather", param("city", "Paris") + param("tags", param("item", "x"))));
  for (size_t n = 0; n <= full.size(); ++n) {
    // Cut anywhere except inside a namespace marker, which is one token in the real vocabulary.
    size_t at = full.rfind(NS, n);
    if (at != std::string::npos && n > at && n < at + NS.size()) continue;
    auto m = parse(full.substr(0, n));
    for (const auto& c : m.calls) {
      EXPECT_TRUE(json::accept(c.arguments)) << "cut at " << n << ": " << c.arguments;
    }
    EXPECT_EQ(m.content.find("minimax"), std::string::npos) << "cut at " << n << ": " << m.content;
  }
}

TEST(ToolParser, SelfClosingAndEmptyValues) {
  auto m =
      parse(block(invoke("get_weather", NS + "<city/>" + param("unit", "") + param("days", ""))));
  EXPECT_EQ(args(m, 0), json::parse(R"({"city":"","unit":"","days":""})"));
}

TEST(ToolParser, StrayMarkersAndUnknownTagsInContentAreDropped) {
  auto m = parse("a" + NS + " b" + close("tool_call") + NS + "<foo>c");
  EXPECT_EQ(m.content, "a bc");
  EXPECT_TRUE(m.calls.empty());
}

TEST(ToolParser, AMarkerAndAngleBracketBeforeAnotherMarkerAreStray) {
  // m3-tiny forced into a call (tool_choice required) wrote a duplicate closer after a stray
  // "marker<": no key may be made of the marker's text.
  auto m = parse(open("tool_call") + "\n" + NS + "<invoke name=\"get_weather\">" +
                 param("city", "Lisbon") + NS + "<" + close("city") + close("invoke") + "\n" +
                 close("tool_call"));
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(args(m, 0), json({{"city", "Lisbon"}}));
  EXPECT_EQ(m.content, "");
  // The same inside a value and before a parameter: the stray pair is dropped, the tag after it read.
  m = parse(block(invoke("write_file", open("path") + "/a" + NS + "<" + close("path") + NS + "<" +
                                           param("content", "x<y"))));
  EXPECT_EQ(args(m, 0), json({{"path", "/a"}, {"content", "x<y"}}));
}

TEST(ToolParser, MarkerFollowedByLongTextIsNotATag) {
  std::string long_text(600, 'x');
  auto m = parse("a" + NS + "<" + long_text);
  EXPECT_EQ(m.content, "a<" + long_text);
}

TEST(ToolParser, ArgumentsStreamAsGenerated) {
  MiniMaxM3ToolParser p(tools());
  std::string streamed;
  bool saw_name = false;
  auto take = [&](const ToolParseDelta& d) {
    for (const auto& c : d.calls) {
      if (c.begins) saw_name = true;
      streamed += c.arguments;
    }
  };
  take(p.feed(open("tool_call") + NS + "<invoke name=\"write_file\">"));
  EXPECT_TRUE(saw_name);
  EXPECT_EQ(streamed, "{");
  take(p.feed(open("content")));
  EXPECT_EQ(streamed, R"({"content":")");
  take(p.feed("line one\nline"));
  EXPECT_EQ(streamed, R"({"content":"line one\nline)");
  take(p.feed(" two]<]mini"));  // a possible marker is held back
  EXPECT_EQ(streamed, R"({"content":"line one\nline two)");
  take(p.feed("max[>[</content>"));
  EXPECT_EQ(streamed, R"({"content":"line one\nline two")");
  take(p.feed(close("invoke")));
  EXPECT_EQ(streamed, R"({"content":"line one\nline two"})");
}

TEST(ToolParser, ContentOnlyWithoutMarkupPassesThrough) {
  auto m = parse("  Hello <world> & ]<] friends  ");
  EXPECT_EQ(m.content, "Hello <world> & ]<] friends");
}

TEST(ConvertScalar, Rules) {
  json integer = {{"type", "integer"}};
  json number = {{"type", "number"}};
  json boolean = {{"type", "boolean"}};
  json str = {{"type", "string"}};
  EXPECT_EQ(minimax_m3_convert_scalar(" 12 ", &integer), "12");
  EXPECT_EQ(minimax_m3_convert_scalar("12.5", &integer), "12.5");  // JSON fallback
  EXPECT_EQ(minimax_m3_convert_scalar("-3e2", &number), "-300.0");
  EXPECT_EQ(minimax_m3_convert_scalar("TRUE", &boolean), "true");
  EXPECT_EQ(minimax_m3_convert_scalar(" x ", &str), "\" x \"");
  EXPECT_EQ(minimax_m3_convert_scalar("null", nullptr), "null");
  EXPECT_EQ(minimax_m3_convert_scalar("None", nullptr), "null");
  EXPECT_EQ(minimax_m3_convert_scalar("[1, 2]", nullptr), "[1,2]");
  EXPECT_EQ(minimax_m3_convert_scalar("plain", nullptr), "\"plain\"");
}

}  // namespace
}  // namespace m3::chat

namespace m3::chat {
namespace {

// Generated text is untrusted too: an argument value nested past the JSON limit is not walked as
// JSON (which would recurse once per level), it stays the string the model wrote.
TEST(ToolParserHostile, DeeplyNestedArgumentValueStaysAString) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Message m = parse(block(invoke("get_weather", param("free", deep) + param("tags", deep))));
  ASSERT_EQ(m.calls.size(), 1u);
  json args = json::parse(m.calls[0].arguments);
  EXPECT_EQ(args["free"], deep);
  EXPECT_EQ(args["tags"], deep);
  // Within the limit, the same value is JSON.
  const std::string ok = std::string(100, '[') + std::string(100, ']');
  m = parse(block(invoke("get_weather", param("free", ok))));
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_TRUE(json::parse(m.calls[0].arguments)["free"].is_array());
}

}  // namespace
}  // namespace m3::chat

// Turns MiniMax-M3 tool-call XML (m3-architecture.md §7.3) into OpenAI tool calls, incrementally.
//
//   ]<]minimax[>[<tool_call>
//   ]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Paris]<]minimax[>[</city>...
//   ]<]minimax[>[</invoke>
//   ]<]minimax[>[</tool_call>
//
// Only tags that follow the namespace marker are structure; everything else inside a value is raw
// text (so code with '<' in an argument is safe). The parser is a pure state machine over text:
// feed() returns content and tool-call deltas decided so far; finish() closes whatever is open, so
// a call's arguments are always valid JSON. For every split of the output into chunks the deltas
// concatenate to the same content and the same per-call name and arguments.
//
// Arguments are emitted as compact JSON while they are generated: a call's name and "{" when its
// <invoke> tag completes, each key when its tag opens, string values character by character (when
// the tool's JSON schema says the value is a string), other scalars when their closing tag
// arrives. Typing follows the schema (string, integer, number, boolean, null, object with nested
// tags, array with <item> tags, anyOf/oneOf and type lists, local $ref); without a schema a value
// is parsed as JSON and falls back to a string.
//
// Robustness (all seen in real M3 outputs): an <invoke> without the <tool_call> wrapper, a new
// <invoke> before the previous one closed, missing closing tags, stray namespace markers and
// truncated output. Text before and after a tool-call block is content (whitespace-trimmed at the
// block boundaries); no markup reaches content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/parsers/ws_trimmer.h"

namespace m3::chat {

struct ToolCallDelta {
  int index = 0;          // position of the call in this response (0, 1, ...)
  bool begins = false;    // first delta of this call: carries the name
  std::string name;       // set when begins
  std::string arguments;  // JSON text to append to the call's arguments
};

struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

class MiniMaxM3ToolParser {
 public:
  // `tools`: the request's OpenAI "tools" array ([{type: function, function: {name, parameters}}]);
  // may be null. Argument schemas are looked up by function name.
  explicit MiniMaxM3ToolParser(const nlohmann::json& tools, bool trim_content = true);
  // The output continues content written before: its first content keeps leading whitespace.
  void continue_content() { content_trim_.continue_segment(); }

  ToolParseDelta feed(std::string_view text);
  ToolParseDelta finish();

  int num_calls() const { return num_calls_; }

 private:
  enum class Mode { kContent, kBlock, kInvoke };
  enum class FrameKind { kInvoke, kObject, kArray, kUndecided, kString, kScalar };
  struct Frame {
    FrameKind kind;
    std::string tag;                         // the closing tag that ends this frame
    const nlohmann::json* schema = nullptr;  // JSON schema of this value (may be null)
    bool has_members = false;                // object/array: a member was emitted
    std::string text;                        // undecided/scalar: the raw text so far
  };
  struct Tag {
    bool closing = false;
    bool self_closing = false;
    std::string name;
    std::string name_attr;  // <invoke name="...">
    std::string raw;        // the tag text without the namespace marker
  };

  void process(ToolParseDelta& out, bool final);
  void on_literal(std::string_view text, ToolParseDelta& out);
  void on_tag(const Tag& tag, ToolParseDelta& out);
  void on_open_in_invoke(const Tag& tag, ToolParseDelta& out);
  void start_invoke(const std::string& name, ToolParseDelta& out);
  void push_value(const std::string& tag, const nlohmann::json* schema, ToolParseDelta& out);
  void close_top(ToolParseDelta& out);
  void close_all(ToolParseDelta& out);
  void emit_args(std::string_view text, ToolParseDelta& out);
  void emit_content(std::string_view text, ToolParseDelta& out);
  const nlohmann::json* resolve(const nlohmann::json* schema) const;

  std::unordered_map<std::string, nlohmann::json> schemas_;  // function name -> parameters
  const nlohmann::json* root_schema_ = nullptr;              // current call's parameters
  Mode mode_ = Mode::kContent;
  bool implicit_block_ = false;  // the current invoke had no <tool_call> wrapper
  std::vector<Frame> frames_;
  std::string buf_;
  int num_calls_ = 0;
  bool trim_content_;
  WsTrimmer content_trim_;
};

// JSON text for a scalar argument value given its schema (exposed for tests).
std::string minimax_m3_convert_scalar(std::string_view raw, const nlohmann::json* schema);

}  // namespace m3::chat

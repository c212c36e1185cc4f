// The chat output pipeline: model text -> reasoning parser -> tool-call parser -> deltas.
//
// Either parser can be off (--reasoning-parser none, --tool-call-parser none, tool_choice none).
// When any parser is on, content is whitespace-trimmed at its boundaries (start, end, around a
// tool-call block); with both off the text passes through unchanged.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parsers/reasoning_parser_minimax_m3.h"
#include "chat/parsers/tool_parser_minimax_m3.h"
#include "chat/parsers/ws_trimmer.h"

namespace m3::chat {

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(ParsedDelta&& other);
};

struct OutputParserOptions {
  bool reasoning = false;  // run the reasoning parser
  MiniMaxM3ReasoningParser::Start reasoning_start = MiniMaxM3ReasoningParser::Start::kAdaptive;
  bool tools = false;         // run the tool-call parser
  nlohmann::json tools_json;  // the request's "tools" array (argument schemas)
  // The output continues an assistant message (continue_final_message): the leading whitespace
  // of its first content is part of the continuation and kept.
  bool continues_content = false;
};

// Parser names accepted by --reasoning-parser / --tool-call-parser ("minimax-m3", "none").
bool is_known_reasoning_parser(std::string_view name);
bool is_known_tool_parser(std::string_view name);

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);

  ParsedDelta feed(std::string_view text);
  ParsedDelta finish();

  bool in_reasoning() const { return reasoning_ && reasoning_->in_reasoning(); }
  int num_tool_calls() const { return tools_ ? tools_->num_calls() : 0; }

 private:
  void route_content(std::string_view text, ParsedDelta& out);

  std::optional<MiniMaxM3ReasoningParser> reasoning_;
  std::optional<MiniMaxM3ToolParser> tools_;
  WsTrimmer content_trim_;  // used when only the reasoning parser is on
};

// The whole output parsed at once (the non-streaming path; equal to feeding it in any chunks).
ParsedDelta parse_output(const OutputParserOptions& options, std::string_view text);

}  // namespace m3::chat

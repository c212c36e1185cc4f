#include "chat/parsers/output_parser.h"

namespace m3::chat {

void ParsedDelta::append(ParsedDelta&& other) {
  reasoning += other.reasoning;
  content += other.content;
  for (auto& d : other.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == d.index && !d.begins) {
      tool_calls.back().arguments += d.arguments;
    } else {
      tool_calls.push_back(std::move(d));
    }
  }
}

bool is_known_reasoning_parser(std::string_view name) {
  return name == "minimax-m3" || name == "minimax_m3" || name == "none";
}
bool is_known_tool_parser(std::string_view name) {
  return name == "minimax-m3" || name == "minimax_m3" || name == "none";
}

OutputParser::OutputParser(OutputParserOptions options) {
  if (options.reasoning) reasoning_.emplace(options.reasoning_start);
  if (options.tools) tools_.emplace(options.tools_json, /*trim_content=*/true);
  if (options.continues_content) {
    content_trim_.continue_segment();
    if (tools_) tools_->continue_content();
  }
}

void OutputParser::route_content(std::string_view text, ParsedDelta& out) {
  if (text.empty()) return;
  if (tools_) {
    ToolParseDelta d = tools_->feed(text);
    out.content += d.content;
    for (auto& c : d.calls) out.tool_calls.push_back(std::move(c));
  } else if (reasoning_) {
    content_trim_.push(text, out.content);
  } else {
    out.content.append(text);
  }
}

ParsedDelta OutputParser::feed(std::string_view text) {
  ParsedDelta out;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->feed(text);
    out.reasoning = std::move(r.reasoning);
    route_content(r.content, out);
  } else {
    route_content(text, out);
  }
  return out;
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->finish();
    out.reasoning = std::move(r.reasoning);
    route_content(r.content, out);
  }
  if (tools_) {
    ToolParseDelta d = tools_->finish();
    out.content += d.content;
    for (auto& c : d.calls) out.tool_calls.push_back(std::move(c));
  }
  content_trim_.boundary();
  return out;
}

ParsedDelta parse_output(const OutputParserOptions& options, std::string_view text) {
  OutputParser p(options);
  ParsedDelta all = p.feed(text);
  all.append(p.finish());
  return all;
}

}  // namespace m3::chat

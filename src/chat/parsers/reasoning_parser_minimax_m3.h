// Splits MiniMax-M3 output text into reasoning and the rest (m3-architecture.md §7.4).
//
// A pure text state machine: feed() takes any chunk of output text (a token, several tokens, a
// split marker) and returns what can be decided now; finish() flushes what was held back. For any
// split of the same text into chunks, the concatenated deltas are identical (tested by fuzzing).
//
// Rules:
//  * The start state comes from the prompt: a prompt ending in <mm:think> (thinking enabled) starts
//    inside reasoning; one ending in </mm:think> (disabled) starts in content; otherwise (adaptive)
//    the first non-space text decides: <mm:think> opens reasoning, a bare </mm:think> means "no
//    reasoning" and is dropped, anything else is content.
//  * In reasoning, </mm:think> ends it; a tool-call start (]<]minimax[>[<tool_call> or an unwrapped
//    ]<]minimax[>[<invoke) also ends it and is passed on as content for the tool parser; a repeated
//    <mm:think> is dropped.
//  * In content, a stray </mm:think> is dropped and a later <mm:think> opens another reasoning
//    segment, so no think marker ever reaches content.
//  * Reasoning is whitespace-trimmed at both ends of each segment (the template re-adds its own
//    separators when the reasoning is sent back); content whitespace is passed through.
#pragma once

#include <string>
#include <string_view>

#include "chat/parsers/ws_trimmer.h"

namespace m3::chat {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class MiniMaxM3ReasoningParser {
 public:
  enum class Start { kReasoning, kAdaptive, kContent };

  // The start state implied by the rendered prompt (trailing whitespace ignored).
  static Start start_for_prompt(std::string_view prompt);

  explicit MiniMaxM3ReasoningParser(Start start);

  ReasoningDelta feed(std::string_view text);
  // End of output: held-back text that never became a marker is emitted as text.
  ReasoningDelta finish();

  // True while the parser is inside a reasoning segment (used to count reasoning tokens).
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kStart, kReasoning, kContent };
  void process(ReasoningDelta& out, bool final);

  State state_;
  std::string buf_;  // text not yet routed (a possible partial marker, or undecided start)
  WsTrimmer reasoning_trim_;
};

}  // namespace m3::chat

#include "chat/parsers/reasoning_parser_minimax_m3.h"

#include <algorithm>
#include <array>

#include "chat/parsers/markers_minimax_m3.h"

namespace m3::chat {

using namespace minimax_m3;

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view rtrim(std::string_view s) {
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Earliest occurrence of any marker in `text`: {position, marker index}, or {npos, -1}.
template <size_t N>
std::pair<size_t, int> find_first(std::string_view text, const std::array<std::string_view, N>& m) {
  size_t best = std::string_view::npos;
  int which = -1;
  for (size_t i = 0; i < N; ++i) {
    size_t p = text.find(m[i]);
    if (p < best) best = p, which = static_cast<int>(i);
  }
  return {best, which};
}

template <size_t N>
size_t longest_partial(std::string_view text, const std::array<std::string_view, N>& m) {
  size_t n = 0;
  for (auto marker : m) n = std::max(n, partial_suffix(text, marker));
  return n;
}

}  // namespace

MiniMaxM3ReasoningParser::Start MiniMaxM3ReasoningParser::start_for_prompt(
    std::string_view prompt) {
  std::string_view p = rtrim(prompt);
  if (ends_with(p, kThinkOpen)) return Start::kReasoning;
  if (ends_with(p, kThinkClose)) return Start::kContent;
  return Start::kAdaptive;
}

MiniMaxM3ReasoningParser::MiniMaxM3ReasoningParser(Start start)
    : state_(start == Start::kReasoning ? State::kReasoning
             : start == Start::kContent ? State::kContent
                                        : State::kStart) {}

ReasoningDelta MiniMaxM3ReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  buf_.append(text);
  process(out, /*final=*/false);
  return out;
}

ReasoningDelta MiniMaxM3ReasoningParser::finish() {
  ReasoningDelta out;
  process(out, /*final=*/true);
  reasoning_trim_.boundary();
  return out;
}

void MiniMaxM3ReasoningParser::process(ReasoningDelta& out, bool final) {
  static constexpr std::array<std::string_view, 4> kReasoningMarkers = {
      kThinkOpen, kThinkClose, kToolCallOpen, kInvokeOpenPrefix};
  static constexpr std::array<std::string_view, 2> kContentMarkers = {kThinkOpen, kThinkClose};

  size_t pos = 0;  // consumed prefix of buf_
  while (pos < buf_.size()) {
    std::string_view rest = std::string_view(buf_).substr(pos);
    if (state_ == State::kStart) {
      size_t ws = 0;
      while (ws < rest.size() && is_space(rest[ws])) ++ws;
      std::string_view head = rest.substr(ws);
      if (head.empty()) {
        if (!final) break;  // only whitespace so far: undecided
        out.content.append(rest);
        pos = buf_.size();
        break;
      }
      if (head.substr(0, kThinkOpen.size()) == kThinkOpen) {
        pos += ws + kThinkOpen.size();
        state_ = State::kReasoning;
        continue;
      }
      if (head.substr(0, kThinkClose.size()) == kThinkClose) {
        pos += ws + kThinkClose.size();
        state_ = State::kContent;
        continue;
      }
      bool could_be_marker =
          (kThinkOpen.substr(0, head.size()) == head || kThinkClose.substr(0, head.size()) == head);
      if (could_be_marker && !final) break;
      state_ = State::kContent;  // plain answer without markers; the whitespace stays content
      continue;
    }

    if (state_ == State::kReasoning) {
      auto [p, which] = find_first(rest, kReasoningMarkers);
      if (p == std::string_view::npos) {
        size_t hold = final ? 0 : longest_partial(rest, kReasoningMarkers);
        reasoning_trim_.push(rest.substr(0, rest.size() - hold), out.reasoning);
        pos += rest.size() - hold;
        break;
      }
      reasoning_trim_.push(rest.substr(0, p), out.reasoning);
      pos += p;
      if (which == 0) {  // repeated opener: drop
        pos += kThinkOpen.size();
      } else if (which == 1) {
        pos += kThinkClose.size();
        state_ = State::kContent;
        reasoning_trim_.boundary();
      } else {  // a tool call starts: reasoning ends, the marker is content for the tool parser
        state_ = State::kContent;
        reasoning_trim_.boundary();
      }
      continue;
    }

    // kContent
    auto [p, which] = find_first(rest, kContentMarkers);
    if (p == std::string_view::npos) {
      size_t hold = final ? 0 : longest_partial(rest, kContentMarkers);
      out.content.append(rest.substr(0, rest.size() - hold));
      pos += rest.size() - hold;
      break;
    }
    out.content.append(rest.substr(0, p));
    pos += p;
    if (which == 0) {
      pos += kThinkOpen.size();
      state_ = State::kReasoning;
      reasoning_trim_.boundary();
    } else {
      pos += kThinkClose.size();  // stray closer
    }
  }
  buf_.erase(0, pos);
}

}  // namespace m3::chat

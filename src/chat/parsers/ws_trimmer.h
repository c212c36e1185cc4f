// Streaming whitespace trimmer: drops leading whitespace of a segment and holds trailing
// whitespace back until more non-space text arrives (then it is emitted) or the segment ends
// (then it is dropped). Exact under any chunking: trimming a whole segment at once and pushing it
// piecewise give the same text.
#pragma once

#include <string>
#include <string_view>

namespace m3::chat {

class WsTrimmer {
 public:
  static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

  // Appends the decided part of `text` to `out`.
  void push(std::string_view text, std::string& out) {
    if (at_start_) {
      size_t i = 0;
      while (i < text.size() && is_space(text[i])) ++i;
      text.remove_prefix(i);
      if (text.empty()) return;
      at_start_ = false;
    }
    size_t end = text.size();
    while (end > 0 && is_space(text[end - 1])) --end;
    if (end == 0) {
      held_.append(text);
      return;
    }
    out.append(held_);
    held_.clear();
    out.append(text.substr(0, end));
    held_.append(text.substr(end));
  }
  // The text continues text written before (an assistant message being continued): the current
  // segment's leading whitespace is kept.
  void continue_segment() { at_start_ = false; }
  // The segment ended: drop held whitespace; the next segment's leading whitespace is dropped.
  void boundary() {
    held_.clear();
    at_start_ = true;
  }

 private:
  bool at_start_ = true;
  std::string held_;
};

}  // namespace m3::chat

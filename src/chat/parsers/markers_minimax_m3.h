// The MiniMax-M3 output markers (m3-architecture.md §7.1, §7.3, §7.4). Each is a single special
// token in the real vocabulary, but the parsers work on text and never assume a marker arrives in
// one piece: a chunk boundary can fall anywhere, including inside a marker.
#pragma once

#include <algorithm>
#include <string_view>

namespace m3::chat::minimax_m3 {

inline constexpr std::string_view kThinkOpen = "<mm:think>";
inline constexpr std::string_view kThinkClose = "</mm:think>";
// Namespace marker written before every structural tag of a tool call.
inline constexpr std::string_view kNs = "]<]minimax[>[";
inline constexpr std::string_view kToolCallOpen = "]<]minimax[>[<tool_call>";
inline constexpr std::string_view kToolCallClose = "]<]minimax[>[</tool_call>";
// An invoke without its <tool_call> wrapper still starts a call (seen in real outputs).
inline constexpr std::string_view kInvokeOpenPrefix = "]<]minimax[>[<invoke";

// Length of the longest suffix of `text` that is a proper prefix of `marker` (a marker that may
// still complete when more text arrives).
inline size_t partial_suffix(std::string_view text, std::string_view marker) {
  size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace m3::chat::minimax_m3

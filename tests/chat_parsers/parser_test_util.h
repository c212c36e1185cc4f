// Helpers for the output-parser tests: collapse a stream of deltas into the final message, and
// split a text into chunks the way a tokenizer plus speculative decoding would.
#pragma once

#include <algorithm>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parsers/markers_minimax_m3.h"
#include "chat/parsers/output_parser.h"

namespace m3::chat::testing {

struct Call {
  std::string name;
  std::string arguments;
  bool operator==(const Call& o) const { return name == o.name && arguments == o.arguments; }
};

inline std::ostream& operator<<(std::ostream& os, const Call& c) {
  return os << c.name << "(" << c.arguments << ")";
}

struct Message {
  std::string reasoning;
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Message& o) const {
    return reasoning == o.reasoning && content == o.content && calls == o.calls;
  }
};

// Folds deltas into a message; fails (returns false) on a malformed delta sequence: a call that
// does not begin with its name, indices out of order, a second "begins" for one index.
inline std::ostream& operator<<(std::ostream& os, const Message& m) {
  os << "{reasoning: [" << m.reasoning << "], content: [" << m.content << "], calls:";
  for (const auto& c : m.calls) os << " " << c;
  return os << "}";
}

inline bool fold(const ParsedDelta& d, Message& m, std::string* error = nullptr) {
  m.reasoning += d.reasoning;
  m.content += d.content;
  for (const auto& c : d.tool_calls) {
    if (c.begins) {
      if (c.index != static_cast<int>(m.calls.size())) {
        if (error) *error = "call index " + std::to_string(c.index) + " begins out of order";
        return false;
      }
      m.calls.push_back(Call{c.name, ""});
    } else if (c.index != static_cast<int>(m.calls.size()) - 1) {
      if (error) *error = "arguments for call " + std::to_string(c.index) + " not the latest";
      return false;
    }
    m.calls.back().arguments += c.arguments;
  }
  return true;
}

inline Message parse_chunks(const OutputParserOptions& opt,
                            const std::vector<std::string>& chunks) {
  OutputParser p(opt);
  Message m;
  for (const auto& c : chunks) fold(p.feed(c), m);
  fold(p.finish(), m);
  return m;
}

inline Message parse_whole(const OutputParserOptions& opt, std::string_view text) {
  Message m;
  fold(parse_output(opt, text), m);
  return m;
}

// "Tokens": markers are single units (as in the real vocabulary), other text is cut into pieces of
// 1-4 bytes (which may split UTF-8 sequences; the parsers must not care).
inline std::vector<std::string> pseudo_tokens(std::string_view text, std::mt19937& rng) {
  using namespace minimax_m3;
  static const std::string_view kMarkers[] = {kThinkOpen, kThinkClose, kNs};
  std::vector<std::string> out;
  std::uniform_int_distribution<int> len(1, 4);
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (auto m : kMarkers) {
      if (text.substr(i, m.size()) == m) {
        out.emplace_back(m);
        i += m.size();
        matched = true;
        break;
      }
    }
    if (matched) continue;
    size_t n = std::min<size_t>(len(rng), text.size() - i);
    // Do not swallow the start of a marker into a text piece.
    for (size_t k = 1; k < n; ++k) {
      bool starts = false;
      for (auto m : kMarkers) starts |= text.substr(i + k, m.size()) == m;
      if (starts) {
        n = k;
        break;
      }
    }
    out.emplace_back(text.substr(i, n));
    i += n;
  }
  return out;
}

// Groups consecutive tokens into steps of 1..max_per_step tokens (speculative decoding accepts
// several tokens per step).
inline std::vector<std::string> group_steps(const std::vector<std::string>& tokens,
                                            int max_per_step, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(1, max_per_step);
  std::vector<std::string> out;
  for (size_t i = 0; i < tokens.size();) {
    int n = k(rng);
    std::string s;
    for (int j = 0; j < n && i < tokens.size(); ++j, ++i) s += tokens[i];
    out.push_back(std::move(s));
  }
  return out;
}

// Random byte-level split into `pieces` chunks (boundaries anywhere, markers included).
inline std::vector<std::string> random_split(std::string_view text, int pieces, std::mt19937& rng) {
  std::vector<size_t> cuts;
  if (!text.empty()) {
    std::uniform_int_distribution<size_t> at(0, text.size());
    for (int i = 0; i + 1 < pieces; ++i) cuts.push_back(at(rng));
  }
  cuts.push_back(0);
  cuts.push_back(text.size());
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    out.emplace_back(text.substr(cuts[i], cuts[i + 1] - cuts[i]));
  return out;
}

inline std::vector<std::string> bytes(std::string_view text) {
  std::vector<std::string> out;
  for (char c : text) out.emplace_back(1, c);
  return out;
}

}  // namespace m3::chat::testing

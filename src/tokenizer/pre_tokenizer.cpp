#include "tokenizer/pre_tokenizer.h"

#include <array>
#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace m3::tok {
namespace {

using json = nlohmann::json;

struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 512> to_byte{};  // every mapped code point is below 512
  ByteTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    for (int b = 0; b < 256; ++b) to_byte[to_char[b]] = b;
  }
};

const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

// Segments for a per-character predicate (HF's Pattern impl for Fn(char) -> bool).
template <typename Pred>
void char_segments(std::string_view s, Pred pred, std::vector<Segment>& seg) {
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    size_t len = utf8_decode_valid(s.data() + i, &cp);
    if (pred(cp)) {
      if (last < i) seg.push_back({last, i, false});
      seg.push_back({i, i + len, true});
      last = i + len;
    }
    i += len;
  }
  if (last < s.size()) seg.push_back({last, s.size(), false});
}

void regex_segments(const Regex& re, std::string_view s, std::vector<Segment>& seg) {
  thread_local std::vector<Span> spans;
  spans.clear();
  re.find_all(s, spans);
  size_t prev = 0;
  for (const Span& m : spans) {
    if (prev != m.start) seg.push_back({prev, m.start, false});
    seg.push_back({m.start, m.end, true});
    prev = m.end;
  }
  if (prev != s.size()) seg.push_back({prev, s.size(), false});
}

Result<SplitBehavior> behavior_from_json(const json& j, const std::string& where) {
  std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(where + ": unknown split behavior '" + b + "'");
}

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(Regex re, SplitBehavior b, bool invert) : re_(std::move(re)), b_(b), invert_(invert) {}
  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>&) const override {
    thread_local std::vector<Segment> seg;
    seg.clear();
    regex_segments(re_, in.text, seg);
    if (invert_) {
      for (Segment& s : seg) s.is_match = !s.is_match;
    }
    split_segments(in, seg, b_, out);
  }

 private:
  Regex re_;
  SplitBehavior b_;
  bool invert_;
};

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, bool use_regex, bool map_bytes, Regex re)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex), map_bytes_(map_bytes),
        re_(std::move(re)) {}

  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>& arena) const override {
    if (add_prefix_space_ && in.text.front() != ' ') {
      std::string& s = arena.emplace_back();
      s.reserve(in.text.size() + 1);
      s.push_back(' ');
      s.append(in.text);
      in.text = s;
    }
    size_t first = out.size();
    if (use_regex_) {
      thread_local std::vector<Segment> seg;
      seg.clear();
      regex_segments(re_, in.text, seg);
      split_segments(in, seg, SplitBehavior::kIsolated, out);
    } else {
      out.push_back(in);
    }
    if (!map_bytes_) return;
    const ByteTables& t = byte_tables();
    for (size_t k = first; k < out.size(); ++k) {
      std::string& s = arena.emplace_back();
      s.reserve(out[k].text.size() * 2);
      for (unsigned char b : out[k].text) utf8_append(s, t.to_char[b]);
      out[k].text = s;
    }
  }

  void set_map_bytes(bool v) { map_bytes_ = v; }

 private:
  bool add_prefix_space_, use_regex_, map_bytes_;
  Regex re_;
};

class CharPredPre final : public PreTokenizer {
 public:
  using Pred = bool (*)(char32_t);
  CharPredPre(Pred pred, SplitBehavior b) : pred_(pred), b_(b) {}
  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>&) const override {
    thread_local std::vector<Segment> seg;
    seg.clear();
    char_segments(in.text, pred_, seg);
    split_segments(in, seg, b_, out);
  }

 private:
  Pred pred_;
  SplitBehavior b_;
};

class CharDelimiterPre final : public PreTokenizer {
 public:
  explicit CharDelimiterPre(char32_t d) : d_(d) {}
  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>&) const override {
    thread_local std::vector<Segment> seg;
    seg.clear();
    char_segments(in.text, [this](char32_t c) { return c == d_; }, seg);
    split_segments(in, seg, SplitBehavior::kRemoved, out);
  }

 private:
  char32_t d_;
};

// HF Whitespace: keep the matches of \w+|[^\w\s]+ (Rust regex classes), drop the rest.
class WhitespacePre final : public PreTokenizer {
 public:
  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>&) const override {
    thread_local std::vector<Segment> seg;
    seg.clear();
    std::string_view s = in.text;
    size_t i = 0, prev = 0;
    // Class of a character: 0 word, 1 other non-space, 2 space.
    auto cls = [](char32_t c) { return is_word_char(c) ? 0 : is_white_space(c) ? 2 : 1; };
    while (i < s.size()) {
      char32_t cp;
      size_t len = utf8_decode_valid(s.data() + i, &cp);
      int c = cls(cp);
      if (c == 2) {
        i += len;
        continue;
      }
      size_t start = i;
      i += len;
      while (i < s.size()) {
        size_t l2 = utf8_decode_valid(s.data() + i, &cp);
        if (cls(cp) != c) break;
        i += l2;
      }
      if (prev != start) seg.push_back({prev, start, true});  // inverted: gaps are removed
      seg.push_back({start, i, false});
      prev = i;
    }
    if (prev != s.size()) seg.push_back({prev, s.size(), true});
    split_segments(in, seg, SplitBehavior::kRemoved, out);
  }
};

enum class PrependScheme { kFirst, kNever, kAlways };

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(std::string rep, PrependScheme scheme, bool split)
      : rep_(std::move(rep)), scheme_(scheme), split_(split) {
    utf8_decode_valid(rep_.data(), &rep_cp_);
  }
  void split(Piece in, std::vector<Piece>& out, std::deque<std::string>& arena) const override {
    std::string& s = arena.emplace_back();
    s.reserve(in.text.size() + 8);
    bool prepend = false;
    bool starts_with_rep = in.text.front() == ' ' || in.text.substr(0, rep_.size()) == rep_;
    if (scheme_ == PrependScheme::kAlways) prepend = !starts_with_rep;
    if (scheme_ == PrependScheme::kFirst) prepend = !starts_with_rep && in.at_origin;
    if (prepend) s.append(rep_);
    for (char c : in.text) {
      if (c == ' ') {
        s.append(rep_);
      } else {
        s.push_back(c);
      }
    }
    Piece p{s, in.at_origin};
    if (!split_) {
      out.push_back(p);
      return;
    }
    thread_local std::vector<Segment> seg;
    seg.clear();
    char_segments(s, [this](char32_t c) { return c == rep_cp_; }, seg);
    split_segments(p, seg, SplitBehavior::kMergedWithNext, out);
  }

 private:
  std::string rep_;
  char32_t rep_cp_ = 0;
  PrependScheme scheme_;
  bool split_;
};

bool is_whitespace_pred(char32_t c) { return is_white_space(c); }
bool is_numeric_pred(char32_t c) { return is_numeric(c); }
bool is_punct_pred(char32_t c) { return is_punctuation(c); }

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status flatten(const json& j, std::vector<const json*>& flat) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("tokenizer.json: pre_tokenizer without a 'type'");
  }
  if (j["type"] == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return invalid_argument("tokenizer.json: pre_tokenizer Sequence without 'pretokenizers'");
    }
    for (const json& sub : j["pretokenizers"]) M3_RETURN_IF_ERROR(flatten(sub, flat));
  } else {
    flat.push_back(&j);
  }
  return Status::ok();
}

Result<std::unique_ptr<PreTokenizer>> make_one(const json& j, bool map_bytes) {
  const std::string type = j["type"].get<std::string>();
  std::unique_ptr<PreTokenizer> p;
  if (type == "Split") {
    M3_ASSIGN_OR_RETURN(Regex re, pattern_from_json(j.value("pattern", json()), "pre_tokenizer Split"));
    M3_ASSIGN_OR_RETURN(SplitBehavior b,
                        behavior_from_json(j.value("behavior", json()), "pre_tokenizer Split"));
    p = std::make_unique<SplitPre>(std::move(re), b, j.value("invert", false));
  } else if (type == "ByteLevel") {
    M3_ASSIGN_OR_RETURN(Regex re, Regex::compile(kGpt2Pattern));
    p = std::make_unique<ByteLevelPre>(j.value("add_prefix_space", true), j.value("use_regex", true),
                                       map_bytes, std::move(re));
  } else if (type == "Digits") {
    p = std::make_unique<CharPredPre>(is_numeric_pred, j.value("individual_digits", false)
                                                           ? SplitBehavior::kIsolated
                                                           : SplitBehavior::kContiguous);
  } else if (type == "Punctuation") {
    SplitBehavior b = SplitBehavior::kIsolated;
    if (j.contains("behavior")) {
      M3_ASSIGN_OR_RETURN(b, behavior_from_json(j["behavior"], "pre_tokenizer Punctuation"));
    }
    p = std::make_unique<CharPredPre>(is_punct_pred, b);
  } else if (type == "WhitespaceSplit") {
    p = std::make_unique<CharPredPre>(is_whitespace_pred, SplitBehavior::kRemoved);
  } else if (type == "Whitespace") {
    p = std::make_unique<WhitespacePre>();
  } else if (type == "CharDelimiterSplit") {
    std::string d = j.value("delimiter", std::string());
    if (d.empty()) return invalid_argument("pre_tokenizer CharDelimiterSplit: empty delimiter");
    char32_t cp;
    utf8_decode_valid(d.data(), &cp);
    p = std::make_unique<CharDelimiterPre>(cp);
  } else if (type == "Metaspace") {
    std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    if (rep.empty()) return invalid_argument("pre_tokenizer Metaspace: empty replacement");
    std::string scheme_s = j.value("prepend_scheme", std::string("always"));
    PrependScheme scheme = scheme_s == "first"   ? PrependScheme::kFirst
                           : scheme_s == "never" ? PrependScheme::kNever
                                                 : PrependScheme::kAlways;
    if (scheme_s != "first" && scheme_s != "never" && scheme_s != "always") {
      return invalid_argument("pre_tokenizer Metaspace: unknown prepend_scheme '" + scheme_s + "'");
    }
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() &&
        !j["add_prefix_space"].get<bool>()) {
      scheme = PrependScheme::kNever;
    }
    p = std::make_unique<MetaspacePre>(rep, scheme, j.value("split", true));
  } else {
    return unimplemented("tokenizer.json: pre_tokenizer type '" + type + "' is not supported");
  }
  return p;
}

}  // namespace

char32_t byte_char(unsigned char b) { return byte_tables().to_char[b]; }

int char_byte(char32_t c) { return c < 512 ? byte_tables().to_byte[c] : -1; }

void split_segments(Piece in, const std::vector<Segment>& seg, SplitBehavior behavior,
                    std::vector<Piece>& out) {
  auto emit = [&](size_t start, size_t end) {
    if (end > start) out.push_back({in.text.substr(start, end - start), in.at_origin && start == 0});
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Segment& s : seg) emit(s.start, s.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Segment& s : seg) {
        if (!s.is_match) emit(s.start, s.end);
      }
      return;
    case SplitBehavior::kContiguous: {
      // Runs of segments with the same flag are merged.
      size_t i = 0;
      while (i < seg.size()) {
        size_t j = i + 1;
        while (j < seg.size() && seg[j].is_match == seg[i].is_match) ++j;
        emit(seg[i].start, seg[j - 1].end);
        i = j;
      }
      return;
    }
    case SplitBehavior::kMergedWithPrevious: {
      // A match that follows a non-match joins it.
      bool have = false, prev_match = false;
      size_t cur_start = 0, cur_end = 0;
      for (const Segment& s : seg) {
        if (s.is_match && !prev_match && have) {
          cur_end = s.end;
        } else {
          if (have) emit(cur_start, cur_end);
          cur_start = s.start;
          cur_end = s.end;
          have = true;
        }
        prev_match = s.is_match;
      }
      if (have) emit(cur_start, cur_end);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      // Scanning right to left, a match that precedes a non-match joins it.
      thread_local std::vector<std::pair<size_t, size_t>> acc;
      acc.clear();
      bool prev_match = false;
      for (size_t k = seg.size(); k-- > 0;) {
        const Segment& s = seg[k];
        if (s.is_match && !prev_match && !acc.empty()) {
          acc.back().first = s.start;
        } else {
          acc.push_back({s.start, s.end});
        }
        prev_match = s.is_match;
      }
      for (size_t k = acc.size(); k-- > 0;) emit(acc[k].first, acc[k].second);
      return;
    }
  }
}

void PreTokenizerChain::run(std::vector<Piece>& pieces, std::deque<std::string>& arena) const {
  std::vector<Piece> next;
  for (const auto& step : steps) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Piece& p : pieces) step->split(p, next, arena);
    pieces.swap(next);
  }
}

Result<PreTokenizerChain> make_pre_tokenizer_chain(const json& j) {
  PreTokenizerChain chain;
  if (j.is_null()) return chain;
  std::vector<const json*> flat;
  M3_RETURN_IF_ERROR(flatten(j, flat));
  for (size_t i = 0; i < flat.size(); ++i) {
    bool last = i + 1 == flat.size();
    bool tail = last && (*flat[i])["type"] == "ByteLevel";
    M3_ASSIGN_OR_RETURN(auto step, make_one(*flat[i], /*map_bytes=*/!tail));
    chain.steps.push_back(std::move(step));
    chain.byte_level_tail = tail;
  }
  return chain;
}

}  // namespace m3::tok

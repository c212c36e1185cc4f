#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace m3::tok {
namespace {

using json = nlohmann::json;

// Whether c is left alone by the normalization form and cannot interact with its neighbours:
// no decomposition (canonical, or any kind for the compatibility forms), combining class 0, no
// part in a canonical composition (composing forms), and not a conjoining Hangul jamo. Hangul
// syllables decompose under NFD/NFKD. Conservative: false only costs the library call.
bool is_stable(char32_t c, bool compose, bool compat) {
  if (c >= 0x1100 && c <= 0x11FF) return false;
  if (c >= 0xAC00 && c <= 0xD7A3) return compose;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(c));
  if (p->combining_class != 0) return false;
  if (p->decomp_seqindex != UINT16_MAX && (compat || p->decomp_type == 0)) return false;
  if (compose && p->comb_index != UINT16_MAX) return false;
  return true;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options)
      : options_(options), compose_((options & UTF8PROC_COMPOSE) != 0),
        compat_((options & UTF8PROC_COMPAT) != 0) {}

  void normalize(std::string& s) const override {
    // All four forms leave ASCII alone, and no composition takes an ASCII character as its second
    // element, so only chunks from the ASCII character before a non-ASCII run up to the next
    // ASCII character need the (slow) library call.
    size_t i = 0, n = s.size();
    while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
    if (i == n) return;
    std::string out;
    out.reserve(n + n / 4);
    size_t copied = 0;
    while (i < n) {
      size_t start = i > 0 ? i - 1 : 0;  // the preceding ASCII starter may compose with marks
      size_t end = i;
      bool stable = true;
      while (end < n && static_cast<unsigned char>(s[end]) >= 0x80) {
        char32_t cp;
        end += utf8_decode_valid(s.data() + end, &cp);
        stable = stable && is_stable(cp, compose_, compat_);
      }
      if (stable) {  // most text: nothing to do for this chunk
        i = end;
        while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
        continue;
      }
      out.append(s, copied, start - copied);
      utf8proc_uint8_t* mapped = nullptr;
      utf8proc_ssize_t len =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + start),
                       static_cast<utf8proc_ssize_t>(end - start), &mapped,
                       static_cast<utf8proc_option_t>(options_));
      if (len >= 0) {
        out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(len));
      } else {
        out.append(s, start, end - start);  // cannot happen on valid UTF-8; keep the text
      }
      std::free(mapped);
      copied = end;
      i = end;
      while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
    }
    if (copied == 0) return;  // every chunk was stable
    out.append(s, copied, n - copied);
    s.swap(out);
  }

 private:
  int options_;
  bool compose_, compat_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    bool ascii = true;
    for (char& c : s) {
      if (static_cast<unsigned char>(c) >= 0x80) {
        ascii = false;
        break;
      }
    }
    if (ascii) {
      for (char& c : s) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
      return;
    }
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      char32_t cp;
      i += utf8_decode_valid(s.data() + i, &cp);
      append_lowercase(out, cp);
    }
    s.swap(out);
  }
};

class Replace final : public Normalizer {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    std::vector<Span> m;
    re_.find_all(s, m);
    if (m.empty()) return;
    std::string out;
    out.reserve(s.size());
    size_t prev = 0;
    for (const Span& sp : m) {
      out.append(s, prev, sp.start - prev);
      out.append(content_);
      prev = sp.end;
    }
    out.append(s, prev, s.size() - prev);
    s.swap(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : prepend_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend_);
  }

 private:
  std::string prepend_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        char32_t cp;
        size_t len = utf8_decode_valid(s.data() + begin, &cp);
        if (!is_white_space(cp)) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t k = end - 1;
        while (k > begin && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        char32_t cp;
        utf8_decode_valid(s.data() + k, &cp);
        if (!is_white_space(cp)) break;
        end = k;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      char32_t cp;
      size_t len = utf8_decode_valid(s.data() + i, &cp);
      if (!is_mark(cp)) out.append(s, i, len);
      i += len;
    }
    s.swap(out);
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : steps_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

// Reads a {"String": s} or {"Regex": r} pattern object into a compiled Regex.
Result<Regex> pattern_from_json(const json& p, const std::string& where) {
  if (p.is_object() && p.contains("String") && p["String"].is_string()) {
    return Regex::compile(p["String"].get<std::string>(), /*literal=*/true);
  }
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
    return Regex::compile(p["Regex"].get<std::string>());
  }
  return invalid_argument(where + ": 'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
}

Result<std::unique_ptr<Normalizer>> make_normalizer(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return invalid_argument("tokenizer.json: normalizer without a 'type'");
  }
  const std::string type = j["type"].get<std::string>();
  std::unique_ptr<Normalizer> n;
  if (type == "NFC") {
    n = std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  } else if (type == "NFD") {
    n = std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  } else if (type == "NFKC") {
    n = std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  } else if (type == "NFKD") {
    n = std::make_unique<UnicodeNormalizer>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE |
                                            UTF8PROC_COMPAT);
  } else if (type == "Lowercase") {
    n = std::make_unique<Lowercase>();
  } else if (type == "StripAccents") {
    n = std::make_unique<StripAccents>();
  } else if (type == "Replace") {
    M3_ASSIGN_OR_RETURN(Regex re, pattern_from_json(j.value("pattern", json()), "normalizer Replace"));
    n = std::make_unique<Replace>(std::move(re), j.value("content", std::string()));
  } else if (type == "Prepend") {
    n = std::make_unique<Prepend>(j.value("prepend", std::string()));
  } else if (type == "Strip") {
    n = std::make_unique<Strip>(j.value("strip_left", true), j.value("strip_right", true));
  } else if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const json& sub : j.value("normalizers", json::array())) {
      M3_ASSIGN_OR_RETURN(auto step, make_normalizer(sub));
      steps.push_back(std::move(step));
    }
    n = std::make_unique<SequenceNormalizer>(std::move(steps));
  } else {
    return unimplemented("tokenizer.json: normalizer type '" + type + "' is not supported");
  }
  return n;
}

}  // namespace m3::tok

// Regex for tokenizer.json patterns. HF tokenizers compiles them with Oniguruma (Ruby syntax);
// we use PCRE2 (UTF + UCP, JIT) after rewriting the classes whose meaning differs: Oniguruma's
// \s is Unicode White_Space (PCRE2's lacks U+0085), \w is Letter|Mark|Nd|Pc (PCRE2's has No
// and lacks marks) and \h is a hex digit (PCRE2: horizontal space).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace m3::tok {

// Rewrites an Oniguruma pattern into an equivalent PCRE2 pattern (see above).
std::string onig_to_pcre2(std::string_view pattern);

struct Span {
  size_t start, end;
};

class Regex {
 public:
  // `pattern` is Oniguruma syntax (as found in tokenizer.json); `literal` escapes it entirely.
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // Appends every non-overlapping match of the pattern in s (valid UTF-8), left to right, like
  // onig's find_iter (an empty match advances the search by one character). If PCRE2 reports an
  // error (resource limits on pathological input) the search stops there: the rest of s is left
  // unmatched, deterministically.
  void find_all(std::string_view s, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// Reads a tokenizer.json pattern object, {"String": s} (literal) or {"Regex": r}.
Result<Regex> pattern_from_json(const nlohmann::json& p, const std::string& where);

}  // namespace m3::tok

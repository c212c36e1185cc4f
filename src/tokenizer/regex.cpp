#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace m3::tok {
namespace {

// Unicode White_Space, as a class body (Oniguruma's \s).
constexpr std::string_view kSpaceBody =
    "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}"
    "\\x{3000}";
// Oniguruma's Unicode \w: Letter | Mark | Decimal_Number | Connector_Punctuation.
constexpr std::string_view kWordBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr std::string_view kHexBody = "0-9a-fA-F";

// Per-thread PCRE2 match state (match data and a JIT stack large enough for long inputs).
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (ctx && jit_stack) pcre2_jit_stack_assign(ctx, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(ctx);
    pcre2_jit_stack_free(jit_stack);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      std::string_view body;
      bool negated = false;
      switch (e) {
        case 's': body = kSpaceBody; break;
        case 'S': body = kSpaceBody; negated = true; break;
        case 'w': body = kWordBody; break;
        case 'W': body = kWordBody; negated = true; break;
        case 'h': body = kHexBody; break;
        case 'H': body = kHexBody; negated = true; break;
        default: break;
      }
      if (body.empty() || (in_class && negated)) {
        // A negated class inside a class cannot be inlined; keep PCRE2's meaning.
        out.push_back(c);
        out.push_back(e);
      } else if (in_class) {
        out.append(body);
      } else {
        out.append(negated ? "[^" : "[");
        out.append(body);
        out.push_back(']');
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  std::string translated = literal ? std::string(pattern) : onig_to_pcre2(pattern);
  // PCRE2_LITERAL refuses PCRE2_UCP (which only changes classes, absent from a literal).
  uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL | PCRE2_NO_UTF_CHECK
                             : PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return invalid_argument("tokenizer regex '" + std::string(pattern) + "' does not compile (" +
                            reinterpret_cast<const char*>(msg) + " at offset " +
                            std::to_string(err_off) + ")");
  }
  auto holder = std::make_shared<Code>();
  holder->code = code;
  holder->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex r;
  r.code_ = std::move(holder);
  r.pattern_ = std::string(pattern);
  return r;
}

void Regex::find_all(std::string_view s, std::vector<Span>& out) const {
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= s.size()) {
    int rc = -1;
    if (code_->jit) {
      rc = pcre2_jit_match(code_->code, subject, s.size(), last_end, 0, st.data, st.ctx);
    }
    if (!code_->jit || rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, subject, s.size(), last_end, PCRE2_NO_UTF_CHECK, st.data,
                       nullptr);
    }
    if (rc < 0) return;  // no match, or a resource limit: the rest stays unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t ms = ov[0], me = ov[1];
    if (me < ms) return;  // \K tricks; not produced by tokenizer patterns
    if (ms == me && have_last && last_match_end == me) {
      // Onig's find_iter refuses an empty match right after the previous match: step one char.
      if (last_end >= s.size()) return;
      last_end += utf8_len_from_lead(static_cast<unsigned char>(s[last_end]));
      continue;
    }
    out.push_back({ms, me});
    last_end = me;
    have_last = true;
    last_match_end = me;
    if (ms == me && me >= s.size()) return;
  }
}

}  // namespace m3::tok

#include "chat/jinja/lexer.h"

#include <algorithm>
#include <cstring>

namespace m3::jinja {
namespace {

// Length of the UTF-8 whitespace character (Python str.isspace) ending at s[end-1], or 0.
size_t trailing_space_len(std::string_view s, size_t end) {
  if (end == 0) return 0;
  unsigned char c = static_cast<unsigned char>(s[end - 1]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4)
    --start;
  std::u32string cp = utf8_decode(s.substr(start, end - start));
  return (cp.size() == 1 && py_isspace(cp[0])) ? end - start : 0;
}

size_t leading_space_len(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  unsigned char c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return py_isspace(c) ? 1 : 0;
  size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (pos + n > s.size()) return 0;
  std::u32string cp = utf8_decode(s.substr(pos, n));
  return (cp.size() == 1 && py_isspace(cp[0])) ? n : 0;
}

std::string_view py_rstrip(std::string_view s) {
  size_t end = s.size();
  while (size_t n = trailing_space_len(s, end)) end -= n;
  return s.substr(0, end);
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  size_t p = 0;
  while (p < s.size()) {
    size_t n = leading_space_len(s, p);
    if (!n) return false;
    p += n;
  }
  return true;
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexerOptions& opt) : opt_(opt) {
    // Normalise newlines (\r\n, \r -> \n) and drop one trailing newline, like jinja2.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    const std::string_view s = src_;
    while (pos < s.size()) {
      size_t start = find_tag(pos);
      if (start == std::string_view::npos) {
        emit_text(s.substr(pos), pos);
        break;
      }
      char kind = s[start + 1];  // '{', '%', '#'
      char sign = (start + 2 < s.size() && (s[start + 2] == '-' || s[start + 2] == '+'))
                      ? s[start + 2]
                      : 0;
      std::string_view text = s.substr(pos, start - pos);
      if (sign == '-') {
        text = py_rstrip(text);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && all_space(text.substr(l_pos)))
          text = text.substr(0, l_pos);
      }
      emit_text(text, pos);
      size_t body = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(start, body, line_starting);
      } else if (kind == '%' && is_raw_begin(body)) {
        pos = lex_raw(start, body, line_starting);
      } else {
        pos = lex_tag(start, body, kind == '%', line_starting);
      }
    }
    push(TokenType::kEof, "", s.size());
    return std::move(tokens_);
  }

 private:
  SourcePos pos_of(size_t off) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    size_t line_start = line_starts_[line - 1];
    int col = static_cast<int>(utf8_length(std::string_view(src_).substr(line_start, off - line_start)));
    return {static_cast<int>(line), col + 1};
  }

  [[noreturn]] void fail(const std::string& msg, size_t off) const {
    throw TemplateError(msg, pos_of(off));
  }

  Token& push(TokenType t, std::string text, size_t off) {
    tokens_.push_back(Token{t, std::move(text), 0, 0, pos_of(off)});
    return tokens_.back();
  }

  void emit_text(std::string_view text, size_t off) {
    if (text.empty()) return;
    if (!tokens_.empty() && tokens_.back().type == TokenType::kText) {
      tokens_.back().text += text;
      return;
    }
    push(TokenType::kText, std::string(text), off);
  }

  size_t find_tag(size_t from) const {
    const std::string_view s = src_;
    size_t p = from;
    while (true) {
      p = s.find('{', p);
      if (p == std::string_view::npos || p + 1 >= s.size()) return std::string_view::npos;
      char c = s[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      ++p;
    }
  }

  // After a tag end: `-` strips all following whitespace, `+` keeps it, otherwise trim_blocks
  // removes a single newline (block and comment tags only).
  size_t after_end(size_t p, char sign, bool trim, bool& line_starting) {
    const std::string_view s = src_;
    size_t q = p;
    if (sign == '-') {
      while (size_t n = leading_space_len(s, q)) q += n;
    } else if (sign != '+' && trim && opt_.trim_blocks && q < s.size() && s[q] == '\n') {
      ++q;
    }
    line_starting = q > 0 && s[q - 1] == '\n' && q > p;
    return q;
  }

  size_t lex_comment(size_t start, size_t body, bool& line_starting) {
    const std::string_view s = src_;
    size_t e = s.find("#}", body);
    if (e == std::string_view::npos) fail("missing end of comment tag", start);
    char sign = (e > body && (s[e - 1] == '-' || s[e - 1] == '+')) ? s[e - 1] : 0;
    return after_end(e + 2, sign, true, line_starting);
  }

  bool is_raw_begin(size_t body) const {
    const std::string_view s = src_;
    size_t p = body;
    while (p < s.size() && py_isspace(static_cast<unsigned char>(s[p]))) ++p;
    if (s.substr(p, 3) != "raw") return false;
    p += 3;
    if (p < s.size() && is_name_char(s[p])) return false;
    while (p < s.size() && py_isspace(static_cast<unsigned char>(s[p]))) ++p;
    return s.substr(p, 2) == "%}" || s.substr(p, 3) == "-%}";
  }

  size_t lex_raw(size_t start, size_t body, bool& line_starting) {
    const std::string_view s = src_;
    size_t p = body;
    while (py_isspace(static_cast<unsigned char>(s[p]))) ++p;
    p += 3;
    while (py_isspace(static_cast<unsigned char>(s[p]))) ++p;
    if (s[p] == '-') {
      p += 3;
      while (size_t n = leading_space_len(s, p)) p += n;
    } else {
      p += 2;
    }
    size_t content = p;
    // Find {%[-+]? endraw [-+]?%}
    size_t q = content;
    while (true) {
      q = s.find("{%", q);
      if (q == std::string_view::npos) fail("missing end of raw directive", start);
      size_t r = q + 2;
      char lsign = (r < s.size() && (s[r] == '-' || s[r] == '+')) ? s[r] : 0;
      if (lsign) ++r;
      while (r < s.size() && py_isspace(static_cast<unsigned char>(s[r]))) ++r;
      if (s.substr(r, 6) == "endraw" && !(r + 6 < s.size() && is_name_char(s[r + 6]))) {
        r += 6;
        while (r < s.size() && py_isspace(static_cast<unsigned char>(s[r]))) ++r;
        char rsign = 0;
        if (r < s.size() && (s[r] == '-' || s[r] == '+')) rsign = s[r++];
        if (s.substr(r, 2) == "%}") {
          std::string_view text = s.substr(content, q - content);
          if (lsign == '-') {
            text = py_rstrip(text);
          } else if (lsign != '+' && opt_.lstrip_blocks) {
            size_t nl = text.rfind('\n');
            size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
            if (l_pos > 0 && all_space(text.substr(l_pos))) text = text.substr(0, l_pos);
          }
          emit_text(text, content);
          return after_end(r + 2, rsign, true, line_starting);
        }
      }
      q += 2;
    }
  }

  size_t lex_tag(size_t start, size_t body, bool block, bool& line_starting) {
    const std::string_view s = src_;
    push(block ? TokenType::kBlockBegin : TokenType::kVarBegin, block ? "{%" : "{{", start);
    std::vector<char> balance;
    size_t p = body;
    while (true) {
      while (p < s.size() && py_isspace(static_cast<unsigned char>(s[p]))) ++p;
      if (p >= s.size()) fail(block ? "unexpected end of template, expected '%}'"
                                    : "unexpected end of template, expected '}}'",
                              start);
      if (balance.empty()) {
        const char* end = block ? "%}" : "}}";
        if (s[p] == '-' && s.substr(p + 1, 2) == end) {
          push(block ? TokenType::kBlockEnd : TokenType::kVarEnd, end, p);
          return after_end(p + 3, '-', block, line_starting);
        }
        if (block && s[p] == '+' && s.substr(p + 1, 2) == end) {
          push(TokenType::kBlockEnd, end, p);
          return after_end(p + 3, '+', block, line_starting);
        }
        if (s.substr(p, 2) == end) {
          push(block ? TokenType::kBlockEnd : TokenType::kVarEnd, end, p);
          return after_end(p + 2, 0, block, line_starting);
        }
      }
      char c = s[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t q = p;
        while (q < s.size() && is_name_char(s[q])) ++q;
        push(TokenType::kName, std::string(s.substr(p, q - p)), p);
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (s.substr(p, 2) == o) op = o;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}<>=.:|,;", c)) {
            fail(std::string("unexpected char '") + c + "'", p);
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          if (balance.size() > 256) fail("brackets nested too deeply", p);
          balance.push_back(op[0]);
        } else if (op == ")" || op == "]" || op == "}") {
          char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (balance.empty()) fail("unexpected '" + op + "'", p);
          if (balance.back() != want) {
            fail("unexpected '" + op + "', expected '" +
                     std::string(1, balance.back() == '(' ? ')' : balance.back() == '[' ? ']' : '}') +
                     "'",
                 p);
          }
          balance.pop_back();
        }
        push(TokenType::kOp, op, p);
        p += op.size();
      }
    }
  }

  // integer: (\d+_)*\d+ ; float: (\d+_)*\d+((\.(\d+_)*\d+)?e[+-]?(\d+_)*\d+|\.(\d+_)*\d+), not
  // directly after a '.' (so `a.0.1` is two subscripts).
  size_t lex_number(size_t p) {
    const std::string_view s = src_;
    auto digits = [&](size_t q) -> size_t {  // returns end of (\d+_)*\d+ starting at q, or q
      if (q >= s.size() || !is_digit(s[q])) return q;
      size_t r = q;
      while (true) {
        while (r < s.size() && is_digit(s[r])) ++r;
        if (r + 1 < s.size() && s[r] == '_' && is_digit(s[r + 1])) {
          ++r;
          continue;
        }
        return r;
      }
    };
    size_t int_end = digits(p);
    size_t end = int_end;
    bool is_float = false;
    if (!(p > 0 && s[p - 1] == '.')) {
      size_t q = int_end;
      size_t frac_end = q;
      if (q < s.size() && s[q] == '.') {
        size_t r = digits(q + 1);
        if (r > q + 1) frac_end = r;
      }
      size_t e = frac_end;
      if (e < s.size() && s[e] == 'e') {
        size_t r = e + 1;
        if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
        size_t x = digits(r);
        if (x > r) {
          end = x;
          is_float = true;
        }
      }
      if (!is_float && frac_end > int_end) {
        end = frac_end;
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < end; ++i)
      if (s[i] != '_') text += s[i];
    if (is_float) {
      Token& t = push(TokenType::kFloat, text, p);
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      Token& t = push(TokenType::kInt, text, p);
      errno = 0;
      long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("integer literal too large: " + text, p);
      t.int_value = v;
    }
    return end;
  }

  int hexval(char c) const {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python string literal with unicode-escape semantics.
  size_t lex_string(size_t p) {
    const std::string_view s = src_;
    char q = s[p];
    size_t i = p + 1;
    std::string out;
    while (true) {
      if (i >= s.size()) fail("unterminated string", p);
      char c = s[i];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= s.size()) fail("unterminated string", p);
      char e = s[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t v = 0;
          for (int k = 0; k < n; ++k) {
            int h = i + k < s.size() ? hexval(s[i + k]) : -1;
            if (h < 0) fail(std::string("truncated \\") + e + " escape in string", p);
            v = v * 16 + static_cast<char32_t>(h);
          }
          if (v > 0x10FFFF) fail("illegal Unicode character in string", p);
          i += static_cast<size_t>(n);
          utf8_append(out, v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k, ++i)
              v = v * 8 + static_cast<char32_t>(s[i] - '0');
            utf8_append(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    push(TokenType::kString, std::move(out), p);
    return i + 1;
  }

  LexerOptions opt_;
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  Lexer lx(source, options);
  return lx.run();
}

}  // namespace m3::jinja

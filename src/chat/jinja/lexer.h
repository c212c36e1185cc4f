// Jinja lexer with the whitespace rules transformers uses (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False): the source's newlines are normalised to \n and one trailing newline
// is dropped; `{%-`/`-%}` strip whitespace, `{%+`/`+%}` keep it; raw blocks are returned as text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/value.h"

namespace m3::jinja {

enum class TokenType : uint8_t {
  kText,        // template data
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the unescaped value
  kInt,
  kFloat,
  kOp,  // text holds the operator
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError (with position) on malformed input.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options = {});

}  // namespace m3::jinja

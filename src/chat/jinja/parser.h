// Jinja parser: tokens -> Program, following jinja2's grammar and operator precedence.
#pragma once

#include <string_view>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace m3::jinja {

// Throws TemplateError with the position of the offending token.
Program parse(std::vector<Token> tokens);

}  // namespace m3::jinja

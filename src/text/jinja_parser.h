#pragma once
// Builds the syntax tree from jinja_lexer tokens, following jinja2's grammar and operator
// precedence. Unknown tags, filters and tests are rejected here, naming the construct and its line
// (jinja2 rejects them when compiling the template as well).
#include <string>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace dspark::jinja {

Body parse_template(const std::vector<Token>& tokens, const std::string& name);

}  // namespace dspark::jinja

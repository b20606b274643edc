#pragma once
// Splits a Jinja template into tokens the way jinja2's lexer does under the options transformers
// renders chat templates with: newlines normalised to "\n", one trailing newline dropped
// (keep_trailing_newline=False), trim_blocks (a newline right after a block or comment tag is
// removed), lstrip_blocks (spaces and tabs before a block or comment tag on its own line are
// removed) and the "-"/"+" whitespace-control markers. Comments are dropped; {% raw %} bodies come
// out as text.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dspark::jinja {

enum class TokenType {
  kText,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenType type;
  std::string text;  // text, name, decoded string literal or operator
  int64_t integer = 0;
  double floating = 0.0;
  int line = 1;
};

// `name` prefixes error messages ("<name> line N: ...").
std::vector<Token> tokenize(std::string_view source, const std::string& name);

}  // namespace dspark::jinja

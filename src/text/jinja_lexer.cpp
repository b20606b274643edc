#include "text/jinja_lexer.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "text/jinja_strings.h"
#include "text/utf8.h"

namespace dspark::jinja {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}
bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// jinja2 reads sources with "\r\n" and "\r" as "\n" and drops one final newline.
std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's str.rstrip(): trailing Unicode whitespace removed (the result is a prefix).
std::string_view rstrip_whitespace(std::string_view text) {
  return text.substr(0, python_strip(text, std::nullopt, StripSide::kRight).size());
}

bool all_whitespace(std::string_view text) {
  if (text.empty()) return false;
  for (char32_t c : decode_utf8(text)) {
    if (!is_python_space(c)) return false;
  }
  return true;
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& name)
      : source_(normalize_source(source)), name_(name) {}

  std::vector<Token> run() {
    while (pos_ < source_.size()) {
      const size_t tag = find_tag_start(pos_);
      if (tag == std::string::npos) {
        emit_text(source_.substr(pos_), line_);
        break;
      }
      const char kind = source_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < source_.size() && (source_[after] == '-' || source_[after] == '+'))
        sign = source_[after++];
      std::string_view text = std::string_view(source_).substr(pos_, tag - pos_);
      const int text_line = line_;
      line_ += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      text = strip_before_tag(text, sign, kind != '{');
      emit_text(text, text_line);
      pos_ = after;
      if (kind == '#') {
        lex_comment();
      } else if (kind == '%' && try_lex_raw()) {
        continue;
      } else {
        lex_tag(kind == '{' ? TokenType::kVariableBegin : TokenType::kBlockBegin);
      }
    }
    tokens_.push_back(Token{TokenType::kEnd, "", 0, 0.0, line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& message) const {
    fail("{} line {}: {}", name_, line, message);
  }

  size_t find_tag_start(size_t from) const {
    for (size_t i = source_.find('{', from); i != std::string::npos; i = source_.find('{', i + 1)) {
      if (i + 1 < source_.size() &&
          (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // "-" strips all whitespace before the tag; otherwise lstrip_blocks strips the spaces between
  // the line start and a block or comment tag when nothing else is on the line before it.
  std::string_view strip_before_tag(std::string_view text, char sign, bool lstrip_applies) const {
    if (sign == '-') return rstrip_whitespace(text);
    if (sign == '+' || !lstrip_applies) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    if ((line_start > 0 || line_starting_) && all_whitespace(text.substr(line_start))) {
      return text.substr(0, line_start);
    }
    return text;
  }

  void emit_text(std::string_view text, int line) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::kText, std::string(text), 0, 0.0, line});
  }

  // Consumes a tag end's trailing whitespace: all of it after "-", one newline (trim_blocks)
  // after a plain end, none after "+".
  void finish_tag_end(char modifier, bool trim_newline) {
    const size_t start = pos_;
    if (modifier == '-') {
      while (pos_ < source_.size()) {
        char32_t c;
        const size_t length = utf8_decode(source_, pos_, &c);
        if (length == 0 || !is_python_space(c)) break;
        pos_ += length;
      }
    } else if (modifier != '+' && trim_newline && pos_ < source_.size() && source_[pos_] == '\n') {
      ++pos_;
    }
    line_ += static_cast<int>(std::count(source_.begin() + static_cast<ptrdiff_t>(start),
                                         source_.begin() + static_cast<ptrdiff_t>(pos_), '\n'));
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
  }

  void lex_comment() {
    const int start_line = line_;
    const size_t end = source_.find("#}", pos_);
    if (end == std::string::npos) error(start_line, "missing end of comment tag");
    char modifier = 0;
    if (end > pos_ && (source_[end - 1] == '-' || source_[end - 1] == '+'))
      modifier = source_[end - 1];
    line_ += static_cast<int>(std::count(source_.begin() + static_cast<ptrdiff_t>(pos_),
                                         source_.begin() + static_cast<ptrdiff_t>(end), '\n'));
    pos_ = end + 2;
    line_starting_ = false;
    finish_tag_end(modifier, true);
  }

  // {% raw %}...{% endraw %}: the body is text, tags inside it are not interpreted.
  bool try_lex_raw() {
    size_t p = pos_;
    while (p < source_.size() && is_ascii_space(source_[p])) ++p;
    if (source_.compare(p, 3, "raw") != 0 ||
        (p + 3 < source_.size() && is_name_char(source_[p + 3])))
      return false;
    p += 3;
    while (p < source_.size() && is_ascii_space(source_[p])) ++p;
    char open_modifier = 0;
    if (source_.compare(p, 3, "-%}") == 0) {
      open_modifier = '-';
      ++p;
    }
    if (source_.compare(p, 2, "%}") != 0) return false;
    const int start_line = line_;
    line_ += static_cast<int>(std::count(source_.begin() + static_cast<ptrdiff_t>(pos_),
                                         source_.begin() + static_cast<ptrdiff_t>(p), '\n'));
    pos_ = p + 2;
    if (open_modifier == '-') finish_tag_end('-', false);
    // jinja2 does not apply trim_blocks to the {% raw %} tag itself.
    line_starting_ = pos_ > 0 && source_[pos_ - 1] == '\n';
    for (size_t search = pos_;;) {
      const size_t tag = source_.find("{%", search);
      if (tag == std::string::npos) error(start_line, "missing end of raw directive");
      size_t q = tag + 2;
      char sign = 0;
      if (q < source_.size() && (source_[q] == '-' || source_[q] == '+')) sign = source_[q++];
      while (q < source_.size() && is_ascii_space(source_[q])) ++q;
      if (source_.compare(q, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      q += 6;
      while (q < source_.size() && is_ascii_space(source_[q])) ++q;
      char end_modifier = 0;
      if (q < source_.size() && (source_[q] == '-' || source_[q] == '+'))
        end_modifier = source_[q++];
      if (source_.compare(q, 2, "%}") != 0) {
        search = tag + 2;
        continue;
      }
      std::string_view body = std::string_view(source_).substr(pos_, tag - pos_);
      const int body_line = line_;
      body = strip_before_tag(body, sign, true);
      emit_text(body, body_line);
      line_ += static_cast<int>(std::count(source_.begin() + static_cast<ptrdiff_t>(pos_),
                                           source_.begin() + static_cast<ptrdiff_t>(q), '\n'));
      pos_ = q + 2;
      finish_tag_end(end_modifier, true);
      return true;
    }
  }

  bool at_tag_end(TokenType begin, char* modifier, size_t* length) const {
    const std::string_view rest = std::string_view(source_).substr(pos_);
    if (begin == TokenType::kBlockBegin) {
      if (rest.starts_with("-%}") || rest.starts_with("+%}")) {
        *modifier = rest[0];
        *length = 3;
        return true;
      }
      if (rest.starts_with("%}")) {
        *modifier = 0;
        *length = 2;
        return true;
      }
      return false;
    }
    if (rest.starts_with("-}}")) {
      *modifier = '-';
      *length = 3;
      return true;
    }
    if (rest.starts_with("}}")) {
      *modifier = 0;
      *length = 2;
      return true;
    }
    return false;
  }

  void lex_tag(TokenType begin) {
    const TokenType end_type =
        begin == TokenType::kBlockBegin ? TokenType::kBlockEnd : TokenType::kVariableEnd;
    tokens_.push_back(Token{begin, "", 0, 0.0, line_});
    const int tag_line = line_;
    std::vector<char> brackets;
    while (true) {
      if (pos_ >= source_.size()) {
        error(tag_line, begin == TokenType::kBlockBegin
                            ? "unexpected end of template inside a {% %} tag"
                            : "unexpected end of template inside a {{ }} tag");
      }
      char modifier;
      size_t length;
      // Like jinja2, a closing delimiter only counts when every bracket opened in the tag is
      // closed, so `}}` can end a dict literal.
      if (brackets.empty() && at_tag_end(begin, &modifier, &length)) {
        tokens_.push_back(Token{end_type, "", 0, 0.0, line_});
        pos_ += length;
        finish_tag_end(modifier, begin == TokenType::kBlockBegin);
        return;
      }
      const char c = source_[pos_];
      if (is_ascii_space(c)) {
        if (c == '\n') ++line_;
        ++pos_;
        continue;
      }
      if (is_digit(c)) {
        lex_number();
        continue;
      }
      if (is_name_start(c)) {
        const size_t start = pos_;
        while (pos_ < source_.size() && is_name_char(source_[pos_])) ++pos_;
        tokens_.push_back(
            Token{TokenType::kName, source_.substr(start, pos_ - start), 0, 0.0, line_});
        continue;
      }
      if (c == '\'' || c == '"') {
        lex_string();
        continue;
      }
      lex_operator(brackets);
    }
  }

  void lex_number() {
    const size_t start = pos_;
    const int line = line_;
    auto digits = [&](auto accept) {
      std::string out;
      while (pos_ < source_.size()) {
        const char c = source_[pos_];
        if (accept(c)) {
          out += c;
          ++pos_;
        } else if (c == '_' && pos_ + 1 < source_.size() && accept(source_[pos_ + 1]) &&
                   !out.empty()) {
          ++pos_;
        } else {
          break;
        }
      }
      return out;
    };
    if (source_[pos_] == '0' && pos_ + 1 < source_.size()) {
      const char base_char = static_cast<char>(source_[pos_ + 1] | 0x20);
      const int base = base_char == 'x' ? 16 : (base_char == 'o' ? 8 : (base_char == 'b' ? 2 : 0));
      if (base != 0) {
        pos_ += 2;
        if (pos_ < source_.size() && source_[pos_] == '_') ++pos_;
        const std::string text = digits([base](char d) {
          const int v = hex_value(d);
          return v >= 0 && v < base;
        });
        if (text.empty()) error(line, "invalid number literal");
        tokens_.push_back(Token{TokenType::kInteger, "", to_int64(text, base, line), 0.0, line});
        return;
      }
    }
    std::string text = digits(is_digit);
    bool is_float = false;
    if (pos_ + 1 < source_.size() && source_[pos_] == '.' && is_digit(source_[pos_ + 1])) {
      ++pos_;
      text += '.' + digits(is_digit);
      is_float = true;
    }
    if (pos_ < source_.size() && (source_[pos_] == 'e' || source_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < source_.size() && (source_[p] == '+' || source_[p] == '-')) ++p;
      if (p < source_.size() && is_digit(source_[p])) {
        text += 'e';
        if (source_[pos_ + 1] == '-' || source_[pos_ + 1] == '+') text += source_[pos_ + 1];
        pos_ = p;
        text += digits(is_digit);
        is_float = true;
      }
    }
    if (is_float) {
      // strtod, like Python's float(), reads an out-of-range literal as infinity.
      tokens_.push_back(Token{TokenType::kFloat, "", 0, std::strtod(text.c_str(), nullptr), line});
      return;
    }
    if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos) {
      error(line, fmt::format("invalid number literal '{}'", source_.substr(start, pos_ - start)));
    }
    tokens_.push_back(Token{TokenType::kInteger, "", to_int64(text, 10, line), 0.0, line});
  }

  int64_t to_int64(const std::string& digits, int base, int line) const {
    int64_t value = 0;
    const char* end = digits.data() + digits.size();
    const auto result = std::from_chars(digits.data(), end, value, base);
    if (result.ec != std::errc() || result.ptr != end) {
      error(line, fmt::format("integer literal {} does not fit in 64 bits", digits));
    }
    return value;
  }

  // Python's "unicode-escape" decoding of a string literal's body, which is what jinja2 applies.
  void lex_string() {
    const char quote = source_[pos_];
    const int line = line_;
    std::string out;
    ++pos_;
    while (true) {
      if (pos_ >= source_.size()) error(line, "unterminated string literal");
      const char c = source_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= source_.size()) error(line, "unterminated string literal");
      const char e = source_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n':
          ++line_;
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t count = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          uint32_t value = 0;
          for (size_t i = 0; i < count; ++i) {
            const int digit = pos_ + i < source_.size() ? hex_value(source_[pos_ + i]) : -1;
            if (digit < 0) error(line, fmt::format("truncated \\{} escape in a string literal", e));
            value = value * 16 + static_cast<uint32_t>(digit);
          }
          pos_ += count;
          if (value > 0x10FFFF || (value >= 0xD800 && value < 0xE000)) {
            error(line, fmt::format("string escape for code point {:x} is not supported", value));
          }
          utf8_append(out, value);
          break;
        }
        case 'N':
          error(line, "\\N{...} escapes in string literals are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t value = static_cast<uint32_t>(e - '0');
            for (int i = 0;
                 i < 2 && pos_ < source_.size() && source_[pos_] >= '0' && source_[pos_] <= '7';
                 ++i) {
              value = value * 8 + static_cast<uint32_t>(source_[pos_++] - '0');
            }
            utf8_append(out, value);
          } else {
            // Unknown escapes stay as written, backslash included.
            out += '\\';
            --pos_;
          }
      }
    }
    tokens_.push_back(Token{TokenType::kString, std::move(out), 0, 0.0, line});
  }

  void lex_operator(std::vector<char>& brackets) {
    static constexpr const char* kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    const std::string_view rest = std::string_view(source_).substr(pos_);
    for (const char* op : kTwoChar) {
      if (rest.starts_with(op)) {
        tokens_.push_back(Token{TokenType::kOperator, op, 0, 0.0, line_});
        pos_ += 2;
        return;
      }
    }
    const char c = source_[pos_];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr) {
      error(line_, fmt::format("unexpected character '{}' in a tag", c));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : (c == ']' ? '[' : '{');
      if (brackets.empty() || brackets.back() != open)
        error(line_, fmt::format("unexpected '{}'", c));
      brackets.pop_back();
    }
    tokens_.push_back(Token{TokenType::kOperator, std::string(1, c), 0, 0.0, line_});
    ++pos_;
  }

  std::string source_;
  const std::string& name_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const std::string& name) {
  if (!utf8_is_valid(source)) fail("{}: template source is not valid UTF-8", name);
  return Lexer(source, name).run();
}

}  // namespace dspark::jinja

#include "text/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "base/error.h"
#include "text/jinja_builtins.h"

namespace dspark::jinja {
namespace {

const char* describe(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "text";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kName:
      return "name";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOperator:
      return "operator";
    case TokenType::kEnd:
      return "end of template";
  }
  return "token";
}

// Tags jinja2 knows but this engine does not implement (they need template loaders, or an
// extension transformers does not enable).
bool is_unsupported_jinja_tag(const std::string& name) {
  static const char* const kTags[] = {"include",   "import",     "from", "extends",
                                      "block",     "autoescape", "do",   "trans",
                                      "pluralize", "endblock",   "debug"};
  return std::any_of(std::begin(kTags), std::end(kTags),
                     [&](const char* tag) { return name == tag; });
}

void collect_names(const Expr* expr, std::vector<std::string>& names);

void collect_arguments(const Arguments& arguments, std::vector<std::string>& names) {
  for (const auto& arg : arguments.positional) collect_names(arg.get(), names);
  for (const auto& [key, arg] : arguments.keyword) collect_names(arg.get(), names);
}

void collect_names(const Expr* expr, std::vector<std::string>& names) {
  if (expr == nullptr) return;
  if (expr->kind == Expr::Kind::kName) names.push_back(expr->name);
  for (const auto& operand : expr->operands) collect_names(operand.get(), names);
  for (const auto& part : expr->slice) collect_names(part.get(), names);
  collect_arguments(expr->arguments, names);
}

void collect_names(const Body& body, std::vector<std::string>& names) {
  for (const auto& stmt : body) {
    collect_names(stmt->expr.get(), names);
    collect_names(stmt->filter.get(), names);
    for (const auto& condition : stmt->conditions) collect_names(condition.get(), names);
    for (const auto& branch : stmt->bodies) collect_names(branch, names);
    for (const auto& value : stmt->with_values) collect_names(value.get(), names);
    for (const auto& parameter : stmt->parameters)
      collect_names(parameter.default_value.get(), names);
    collect_names(stmt->body, names);
    collect_names(stmt->else_body, names);
  }
}

// Template source is untrusted: the parser recurses at most this deep, and expression trees
// (which evaluation and destruction walk recursively) are at most this tall.
constexpr int kMaxParseNesting = 128;
constexpr int kMaxExprDepth = 128;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& name)
      : tokens_(tokens), name_(name) {}

  Body parse() {
    Body body = subparse({});
    return body;
  }

 private:
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }

  [[noreturn]] void error(int line, const std::string& message) const {
    fail("{} line {}: {}", name_, line, message);
  }
  [[noreturn]] void unexpected(const Token& token, const std::string& expected) const {
    std::string got = describe(token.type);
    if (token.type == TokenType::kName || token.type == TokenType::kOperator)
      got = "'" + token.text + "'";
    error(token.line, fmt::format("expected {}, got {}", expected, got));
  }

  bool is_operator(std::string_view op) const {
    return current().type == TokenType::kOperator && current().text == op;
  }
  bool is_name(std::string_view name) const {
    return current().type == TokenType::kName && current().text == name;
  }
  bool skip_operator(std::string_view op) {
    if (!is_operator(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  void expect_operator(std::string_view op) {
    if (!skip_operator(op)) unexpected(current(), fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (current().type != TokenType::kName) unexpected(current(), "a name");
    return next().text;
  }
  void expect(TokenType type) {
    if (current().type != type) unexpected(current(), describe(type));
    next();
  }

  // One level of parser recursion; refuses past kMaxParseNesting.
  class Deeper {
   public:
    explicit Deeper(Parser& parser) : parser_(parser) {
      if (++parser_.nesting_ > kMaxParseNesting) {
        parser_.error(parser_.current().line,
                      fmt::format("nesting limit: brackets, expressions or blocks nested deeper "
                                  "than {}",
                                  kMaxParseNesting));
      }
    }
    ~Deeper() { --parser_.nesting_; }
    Deeper(const Deeper&) = delete;
    Deeper& operator=(const Deeper&) = delete;

   private:
    Parser& parser_;
  };

  // Records a node's depth from its children's, refusing trees taller than kMaxExprDepth (long
  // operator or filter chains build them without recursing).
  ExprPtr seal(ExprPtr node) {
    int deepest = 0;
    auto see = [&](const ExprPtr& child) {
      if (child) deepest = std::max(deepest, child->depth);
    };
    for (const auto& child : node->operands) see(child);
    for (const auto& child : node->slice) see(child);
    for (const auto& child : node->arguments.positional) see(child);
    for (const auto& [key, child] : node->arguments.keyword) see(child);
    node->depth = deepest + 1;
    if (node->depth > kMaxExprDepth) {
      error(node->line, fmt::format("nesting limit: an expression nested deeper than {} (a chain "
                                    "of operators, filters or calls)",
                                    kMaxExprDepth));
    }
    return node;
  }

  ExprPtr make(Expr::Kind kind, int line) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = line;
    return expr;
  }
  StmtPtr make_stmt(Stmt::Kind kind, int line) {
    auto stmt = std::make_unique<Stmt>();
    stmt->kind = kind;
    stmt->line = line;
    return stmt;
  }

  // Parses until a {% tag %} named in end_tags; leaves the position on that tag's name.
  Body subparse(std::initializer_list<std::string_view> end_tags) {
    Body body;
    while (true) {
      const Token& token = current();
      switch (token.type) {
        case TokenType::kText: {
          auto stmt = make_stmt(Stmt::Kind::kText, token.line);
          stmt->text = token.text;
          body.push_back(std::move(stmt));
          next();
          break;
        }
        case TokenType::kVariableBegin: {
          next();
          auto stmt = make_stmt(Stmt::Kind::kOutput, token.line);
          stmt->expr = parse_tuple(false, true, {});
          expect(TokenType::kVariableEnd);
          body.push_back(std::move(stmt));
          break;
        }
        case TokenType::kBlockBegin: {
          next();
          if (current().type == TokenType::kName &&
              std::find(end_tags.begin(), end_tags.end(), current().text) != end_tags.end()) {
            return body;
          }
          body.push_back(parse_statement(end_tags));
          break;
        }
        case TokenType::kEnd: {
          if (end_tags.size() != 0) {
            std::string wanted;
            for (const auto tag : end_tags) {
              wanted += fmt::format("{}'{}'", wanted.empty() ? "" : " or ", tag);
            }
            error(token.line, fmt::format("unexpected end of template, looking for {}", wanted));
          }
          return body;
        }
        default:
          unexpected(token, "text or a tag");
      }
    }
  }

  // Expects the end of the opening tag, parses the body and, with drop_end, consumes the end tag
  // name (the caller then expects the tag end).
  Body parse_statements(std::initializer_list<std::string_view> end_tags, bool drop_end) {
    skip_operator(":");
    expect(TokenType::kBlockEnd);
    Body body = subparse(end_tags);
    if (drop_end) next();
    return body;
  }

  StmtPtr parse_statement(std::initializer_list<std::string_view> enclosing_end_tags) {
    const Deeper deeper(*this);
    const Token& token = current();
    if (token.type != TokenType::kName) unexpected(token, "a tag name");
    const std::string tag = token.text;
    const int line = token.line;
    StmtPtr stmt;
    if (tag == "if") {
      stmt = parse_if();
    } else if (tag == "for") {
      stmt = parse_for();
    } else if (tag == "set") {
      stmt = parse_set();
    } else if (tag == "macro") {
      stmt = parse_macro();
    } else if (tag == "call") {
      stmt = parse_call_block();
    } else if (tag == "filter") {
      stmt = parse_filter_block();
    } else if (tag == "with") {
      stmt = parse_with();
    } else if (tag == "break" || tag == "continue") {
      next();
      if (loop_depth_ == 0) error(line, fmt::format("'{}' outside of a for loop", tag));
      stmt = make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
    } else if (tag == "generation") {
      next();
      stmt = make_stmt(Stmt::Kind::kGeneration, line);
      stmt->body = parse_statements({"endgeneration"}, true);
    } else if (is_unsupported_jinja_tag(tag)) {
      error(line, fmt::format("the '{{% {} %}}' tag is not supported", tag));
    } else {
      std::string context;
      if (enclosing_end_tags.size() != 0) {
        context =
            fmt::format(" (the innermost open block ends with '{}')", *enclosing_end_tags.begin());
      }
      error(line, fmt::format("unknown tag '{}'{}", tag, context));
    }
    expect(TokenType::kBlockEnd);
    return stmt;
  }

  StmtPtr parse_if() {
    auto stmt = make_stmt(Stmt::Kind::kIf, next().line);
    while (true) {
      stmt->conditions.push_back(parse_tuple(false, false, {}));
      stmt->bodies.push_back(parse_statements({"elif", "else", "endif"}, false));
      const std::string tag = next().text;
      if (tag == "elif") continue;
      if (tag == "else") stmt->else_body = parse_statements({"endif"}, true);
      break;
    }
    return stmt;
  }

  StmtPtr parse_for() {
    auto stmt = make_stmt(Stmt::Kind::kFor, next().line);
    stmt->target = parse_target(false, {"in"});
    if (!skip_name("in")) unexpected(current(), "'in'");
    stmt->expr = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) stmt->filter = parse_expression(true);
    if (is_name("recursive")) error(current().line, "recursive for loops are not supported");
    ++loop_depth_;
    stmt->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "else") stmt->else_body = parse_statements({"endfor"}, true);
    return stmt;
  }

  StmtPtr parse_set() {
    const int line = next().line;
    Target target = parse_target(true, {});
    if (skip_operator("=")) {
      auto stmt = make_stmt(Stmt::Kind::kSet, line);
      stmt->target = std::move(target);
      stmt->expr = parse_tuple(false, true, {});
      return stmt;
    }
    auto stmt = make_stmt(Stmt::Kind::kSetBlock, line);
    if (target.unpack || !target.namespace_attribute.empty()) {
      error(line, "a block {% set %} assigns to a single name");
    }
    stmt->target = std::move(target);
    if (is_operator("|")) stmt->filter = parse_filter(nullptr, false);
    stmt->body = parse_statements({"endset"}, true);
    return stmt;
  }

  std::vector<MacroParameter> parse_signature() {
    std::vector<MacroParameter> parameters;
    expect_operator("(");
    while (!is_operator(")")) {
      if (!parameters.empty()) expect_operator(",");
      MacroParameter parameter;
      parameter.name = expect_name();
      if (skip_operator("=")) {
        parameter.default_value = parse_expression(true);
      } else if (!parameters.empty() && parameters.back().default_value) {
        error(current().line, "non-default argument follows default argument");
      }
      parameters.push_back(std::move(parameter));
    }
    expect_operator(")");
    return parameters;
  }

  void note_macro_names(Stmt& stmt) {
    std::vector<std::string> names;
    collect_names(stmt.body, names);
    auto mentions = [&](const char* name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    stmt.uses_varargs = mentions("varargs");
    stmt.uses_kwargs = mentions("kwargs");
    stmt.uses_caller = mentions("caller");
  }

  StmtPtr parse_macro() {
    auto stmt = make_stmt(Stmt::Kind::kMacro, next().line);
    stmt->name = expect_name();
    stmt->parameters = parse_signature();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    stmt->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved_depth;
    note_macro_names(*stmt);
    return stmt;
  }

  StmtPtr parse_call_block() {
    auto stmt = make_stmt(Stmt::Kind::kCallBlock, next().line);
    if (is_operator("(")) stmt->parameters = parse_signature();
    stmt->expr = parse_expression(true);
    if (stmt->expr->kind != Expr::Kind::kCall) error(stmt->line, "expected a call in {% call %}");
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    stmt->body = parse_statements({"endcall"}, true);
    loop_depth_ = saved_depth;
    note_macro_names(*stmt);
    return stmt;
  }

  StmtPtr parse_filter_block() {
    auto stmt = make_stmt(Stmt::Kind::kFilterBlock, next().line);
    stmt->filter = parse_filter(nullptr, true);
    stmt->body = parse_statements({"endfilter"}, true);
    return stmt;
  }

  StmtPtr parse_with() {
    auto stmt = make_stmt(Stmt::Kind::kWith, next().line);
    while (current().type != TokenType::kBlockEnd) {
      if (!stmt->with_targets.empty()) expect_operator(",");
      stmt->with_targets.push_back(parse_target(false, {}));
      if (!stmt->with_targets.back().namespace_attribute.empty()) {
        error(stmt->line, "{% with %} cannot assign a namespace attribute");
      }
      expect_operator("=");
      stmt->with_values.push_back(parse_expression(true));
    }
    stmt->body = parse_statements({"endwith"}, true);
    return stmt;
  }

  Target parse_target(bool with_namespace, std::initializer_list<std::string_view> extra_end) {
    Target target;
    const int line = current().line;
    if (with_namespace && current().type == TokenType::kName &&
        look().type == TokenType::kOperator && look().text == ".") {
      target.names.push_back(next().text);
      next();
      target.namespace_attribute = expect_name();
      return target;
    }
    ExprPtr expr = parse_tuple(true, true, extra_end);
    if (expr->kind == Expr::Kind::kName) {
      target.names.push_back(expr->name);
      return target;
    }
    if (expr->kind == Expr::Kind::kTuple) {
      target.unpack = true;
      for (const auto& item : expr->operands) {
        if (item->kind != Expr::Kind::kName)
          error(line, "can only assign to names or tuples of names");
        target.names.push_back(item->name);
      }
      return target;
    }
    error(line, "can only assign to names, tuples of names or namespace attributes");
  }

  bool is_tuple_end(std::initializer_list<std::string_view> extra_end) const {
    const Token& token = current();
    if (token.type == TokenType::kVariableEnd || token.type == TokenType::kBlockEnd ||
        (token.type == TokenType::kOperator && token.text == ")")) {
      return true;
    }
    return token.type == TokenType::kName &&
           std::find(extra_end.begin(), extra_end.end(), token.text) != extra_end.end();
  }

  // jinja2's parse_tuple: a comma-separated list becomes a tuple, a single item stays itself.
  ExprPtr parse_tuple(bool simplified, bool with_condition,
                      std::initializer_list<std::string_view> extra_end,
                      bool explicit_parentheses = false) {
    const Deeper deeper(*this);
    const int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_operator(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        items.push_back(parse_primary());
      } else {
        items.push_back(parse_expression(with_condition));
      }
      if (is_operator(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) unexpected(current(), "an expression");
    }
    auto tuple = make(Expr::Kind::kTuple, line);
    tuple->operands = std::move(items);
    return seal(std::move(tuple));
  }

  ExprPtr parse_expression(bool with_condition) {
    const Deeper deeper(*this);
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto node = make(Expr::Kind::kCondition, line);
      node->operands.push_back(parse_or());
      node->operands.push_back(std::move(expr));
      node->operands.push_back(skip_name("else") ? parse_condition() : nullptr);
      expr = seal(std::move(node));
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto node = make(Expr::Kind::kBinary, line);
    node->name = std::move(op);
    node->operands.push_back(std::move(left));
    node->operands.push_back(std::move(right));
    return seal(std::move(node));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Deeper deeper(*this);
      auto node = make(Expr::Kind::kNot, next().line);
      node->operands.push_back(parse_not());
      return seal(std::move(node));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = current().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      const Token& token = current();
      if (token.type == TokenType::kOperator &&
          (token.text == "==" || token.text == "!=" || token.text == "<" || token.text == "<=" ||
           token.text == ">" || token.text == ">=")) {
        ops.push_back(next().text);
      } else if (is_name("in")) {
        next();
        ops.push_back("in");
      } else if (is_name("not") && look().type == TokenType::kName && look().text == "in") {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto node = make(Expr::Kind::kCompare, line);
    node->operands.push_back(std::move(first));
    for (auto& operand : operands) node->operands.push_back(std::move(operand));
    node->compare_ops = std::move(ops);
    return seal(std::move(node));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_operator("+") || is_operator("-")) {
      const Token& op = next();
      left = binary(op.text, std::move(left), parse_concat(), op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    const int line = current().line;
    ExprPtr first = parse_math2();
    if (!is_operator("~")) return first;
    auto node = make(Expr::Kind::kConcat, line);
    node->operands.push_back(std::move(first));
    while (skip_operator("~")) node->operands.push_back(parse_math2());
    return seal(std::move(node));
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_operator("*") || is_operator("/") || is_operator("//") || is_operator("%")) {
      const Token& op = next();
      left = binary(op.text, std::move(left), parse_pow(), op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_operator("**")) {
      const int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Deeper deeper(*this);
    const int line = current().line;
    ExprPtr node;
    if (skip_operator("-")) {
      node = make(Expr::Kind::kNegate, line);
      node->operands.push_back(parse_unary(false));
      node = seal(std::move(node));
    } else if (skip_operator("+")) {
      node = make(Expr::Kind::kPlus, line);
      node->operands.push_back(parse_unary(false));
      node = seal(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr literal(Value value, int line) {
    auto node = make(Expr::Kind::kLiteral, line);
    node->value = std::move(value);
    return node;
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    const int line = token.line;
    switch (token.type) {
      case TokenType::kName: {
        next();
        if (token.text == "true" || token.text == "True")
          return literal(Value::boolean(true), line);
        if (token.text == "false" || token.text == "False")
          return literal(Value::boolean(false), line);
        if (token.text == "none" || token.text == "None") return literal(Value::none(), line);
        auto node = make(Expr::Kind::kName, line);
        node->name = token.text;
        return node;
      }
      case TokenType::kString: {
        std::string text;
        while (current().type == TokenType::kString) text += next().text;  // adjacent literals join
        return literal(Value::string(std::move(text)), line);
      }
      case TokenType::kInteger:
        next();
        return literal(Value::integer(token.integer), line);
      case TokenType::kFloat:
        next();
        return literal(Value::floating(token.floating), line);
      case TokenType::kOperator:
        if (token.text == "(") {
          next();
          ExprPtr node = parse_tuple(false, true, {}, true);
          expect_operator(")");
          return node;
        }
        if (token.text == "[") return parse_list();
        if (token.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    unexpected(token, "an expression");
  }

  ExprPtr parse_list() {
    auto node = make(Expr::Kind::kList, next().line);
    while (!is_operator("]")) {
      if (!node->operands.empty()) expect_operator(",");
      if (is_operator("]")) break;
      node->operands.push_back(parse_expression(true));
    }
    expect_operator("]");
    return seal(std::move(node));
  }

  ExprPtr parse_dict() {
    auto node = make(Expr::Kind::kDict, next().line);
    while (!is_operator("}")) {
      if (!node->operands.empty()) expect_operator(",");
      if (is_operator("}")) break;
      node->operands.push_back(parse_expression(true));
      expect_operator(":");
      node->operands.push_back(parse_expression(true));
    }
    expect_operator("}");
    return seal(std::move(node));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_operator(".") || is_operator("[")) {
        node = seal(parse_subscript(std::move(node)));
      } else if (is_operator("(")) {
        node = seal(parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_operator("|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = seal(parse_test(std::move(node)));
      } else if (is_operator("(")) {
        node = seal(parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& token = next();
    if (token.text == ".") {
      const Token& attribute = next();
      if (attribute.type == TokenType::kName) {
        auto result = make(Expr::Kind::kAttribute, token.line);
        result->name = attribute.text;
        result->operands.push_back(std::move(node));
        return result;
      }
      if (attribute.type == TokenType::kInteger) {
        auto result = make(Expr::Kind::kItem, token.line);
        result->operands.push_back(std::move(node));
        result->operands.push_back(literal(Value::integer(attribute.integer), token.line));
        return result;
      }
      unexpected(attribute, "a name or number after '.'");
    }
    std::vector<ExprPtr> subscripts;
    while (!is_operator("]")) {
      if (!subscripts.empty()) expect_operator(",");
      subscripts.push_back(parse_subscribed());
    }
    expect_operator("]");
    const bool has_slice = std::any_of(subscripts.begin(), subscripts.end(), [](const ExprPtr& e) {
      return e->kind == Expr::Kind::kSlice;
    });
    if (has_slice && subscripts.size() > 1)
      error(token.line, "multi-dimensional subscripts are not supported");
    if (subscripts.size() == 1 && subscripts[0]->kind == Expr::Kind::kSlice) {
      subscripts[0]->operands.insert(subscripts[0]->operands.begin(), std::move(node));
      return std::move(subscripts[0]);
    }
    auto result = make(Expr::Kind::kItem, token.line);
    result->operands.push_back(std::move(node));
    if (subscripts.size() == 1) {
      result->operands.push_back(std::move(subscripts[0]));
    } else {
      auto tuple = make(Expr::Kind::kTuple, token.line);
      tuple->operands = std::move(subscripts);
      result->operands.push_back(std::move(tuple));
    }
    return result;
  }

  // One subscript: an expression, or a slice `start:stop:step` with optional parts. A slice is
  // returned as a kSlice node still missing its operand.
  ExprPtr parse_subscribed() {
    const int line = current().line;
    ExprPtr start;
    if (!skip_operator(":")) {
      start = parse_expression(true);
      if (!skip_operator(":")) return start;
    }
    auto node = make(Expr::Kind::kSlice, line);
    node->slice.push_back(std::move(start));
    if (is_operator(":") || is_operator("]") || is_operator(",")) {
      node->slice.push_back(nullptr);
    } else {
      node->slice.push_back(parse_expression(true));
    }
    if (skip_operator(":") && !is_operator("]") && !is_operator(",")) {
      node->slice.push_back(parse_expression(true));
    } else {
      node->slice.push_back(nullptr);
    }
    return node;
  }

  Arguments parse_call_arguments() {
    Arguments arguments;
    const int line = current().line;
    expect_operator("(");
    bool first = true;
    while (!is_operator(")")) {
      if (!first) {
        expect_operator(",");
        if (is_operator(")")) break;
      }
      first = false;
      if (is_operator("*") || is_operator("**")) {
        error(line, "*args and **kwargs in calls are not supported");
      }
      if (current().type == TokenType::kName && look().type == TokenType::kOperator &&
          look().text == "=") {
        std::string key = next().text;
        next();
        arguments.keyword.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!arguments.keyword.empty()) error(line, "positional argument follows keyword argument");
        arguments.positional.push_back(parse_expression(true));
      }
    }
    expect_operator(")");
    return arguments;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto call = make(Expr::Kind::kCall, current().line);
    call->operands.push_back(std::move(node));
    call->arguments = parse_call_arguments();
    return call;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_operator(".")) {
      next();
      name += '.';
      name += expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_operator("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const int line = current().line;
      auto filter = make(Expr::Kind::kFilter, line);
      filter->name = parse_dotted_name();
      if (!has_filter(filter->name)) error(line, fmt::format("no filter named '{}'", filter->name));
      if (is_operator("(")) filter->arguments = parse_call_arguments();
      if (node) filter->operands.push_back(std::move(node));
      node = seal(std::move(filter));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;
    const bool negated = skip_name("not");
    auto test = make(Expr::Kind::kTest, line);
    test->name = parse_dotted_name();
    if (!has_test(test->name)) error(line, fmt::format("no test named '{}'", test->name));
    test->operands.push_back(std::move(node));
    const Token& token = current();
    if (is_operator("(")) {
      test->arguments = parse_call_arguments();
    } else if ((token.type == TokenType::kName || token.type == TokenType::kString ||
                token.type == TokenType::kInteger || token.type == TokenType::kFloat ||
                (token.type == TokenType::kOperator && (token.text == "[" || token.text == "{"))) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error(token.line, "you cannot chain multiple tests with 'is'");
      test->arguments.positional.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return test;
    test = seal(std::move(test));
    auto negation = make(Expr::Kind::kNot, line);
    negation->operands.push_back(std::move(test));
    return negation;
  }

  const std::vector<Token>& tokens_;
  const std::string& name_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  int nesting_ = 0;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens, const std::string& name) {
  return Parser(tokens, name).parse();
}

}  // namespace dspark::jinja

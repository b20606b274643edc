#include "text/jinja_template.h"

#include <unordered_map>

#include "base/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"

namespace dspark::jinja {
namespace {

// A runtime error that already names its template line; outer nodes pass it on unchanged.
class LocatedError : public dspark::Error {
 public:
  explicit LocatedError(const std::string& message) : dspark::Error(message) {}
};

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}

  const Value* find(const std::string& name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent_.get()) {
      const auto it = scope->variables_.find(name);
      if (it != scope->variables_.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& name, Value value) { variables_[name] = std::move(value); }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> variables_;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

// Renders one template call. Values that could form reference cycles (a macro kept in the scope
// it closes over, a namespace holding itself) are tracked here and released when it ends.
class Renderer {
 public:
  Renderer(const std::string& name, const RenderLimits& limits)
      : name_(name), limits_(limits), string_limit_(limits.max_string_bytes) {}
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  ~Renderer() {
    for (const Value& object : namespaces_) object.as_namespace().attributes = Dict();
  }

  Flow render(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = execute(*stmt, scope, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  [[noreturn]] void rethrow_located(int line) const {
    try {
      throw;
    } catch (const LocatedError&) {
      throw;
    } catch (const TemplateRaisedError&) {
      throw;
    } catch (const std::exception& e) {
      throw LocatedError(fmt::format("{} line {}: {}", name_, line, e.what()));
    }
  }

  // Counts one level of evaluation in progress; refuses to nest past the limit.
  class Nesting {
   public:
    Nesting(int& depth, int limit, const char* what) : depth_(depth) {
      if (depth_ >= limit) {
        fail("jinja: {} limit: more than {} nested {}", what, limit,
             std::string_view(what) == "recursion" ? "macro calls" : "evaluations");
      }
      ++depth_;
    }
    ~Nesting() { --depth_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    int& depth_;
  };

  void check_output(const std::string& out) const {
    if (out.size() > limits_.max_string_bytes) {
      fail("jinja: output size limit: the rendered text passed {} bytes", limits_.max_string_bytes);
    }
  }

  Flow execute(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    try {
      const Nesting nesting(nesting_, limits_.max_nesting, "nesting");
      const Flow flow = execute_unlocated(stmt, scope, out);
      check_output(out);
      return flow;
    } catch (const std::exception&) {
      rethrow_located(stmt.line);
    }
  }

  Flow execute_unlocated(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        out += stmt.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        out += to_str(eval(*stmt.expr, scope));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < stmt.conditions.size(); ++i) {
          if (eval(*stmt.conditions[i], scope).truthy()) return render(stmt.bodies[i], scope, out);
        }
        return render(stmt.else_body, scope, out);
      case Stmt::Kind::kFor:
        execute_for(stmt, scope, out);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        assign(stmt.target, eval(*stmt.expr, scope), scope);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        render(stmt.body, std::make_shared<Scope>(scope), captured);
        Value value = Value::string(std::move(captured));
        if (stmt.filter) value = apply_filter_chain(*stmt.filter, std::move(value), scope);
        assign(stmt.target, std::move(value), scope);
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scope->set(stmt.name, make_macro(stmt, scope, stmt.name));
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        const Expr& call_expr = *stmt.expr;
        const Value callee = eval(*call_expr.operands[0], scope);
        CallArguments arguments = eval_arguments(call_expr.arguments, scope);
        arguments.keyword.emplace_back("caller", make_macro(stmt, scope, "caller"));
        out += to_str(call(callee, arguments));
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        render(stmt.body, std::make_shared<Scope>(scope), captured);
        out += to_str(apply_filter_chain(*stmt.filter, Value::string(std::move(captured)), scope));
        return Flow::kNormal;
      }
      case Stmt::Kind::kWith: {
        auto inner = std::make_shared<Scope>(scope);
        for (size_t i = 0; i < stmt.with_targets.size(); ++i) {
          assign(stmt.with_targets[i], eval(*stmt.with_values[i], scope), inner);
        }
        return render(stmt.body, inner, out);
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return render(stmt.body, scope, out);
    }
    return Flow::kNormal;
  }

  void assign(const Target& target, Value value, const ScopePtr& scope) {
    if (!target.namespace_attribute.empty()) {
      const Value* object = scope->find(target.names[0]);
      if (object == nullptr || !object->is_namespace()) {
        fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
      }
      object->as_namespace().attributes.set(target.namespace_attribute, std::move(value));
      return;
    }
    if (!target.unpack) {
      scope->set(target.names[0], std::move(value));
      return;
    }
    const std::vector<Value> items = iterate(value);
    if (items.size() != target.names.size()) {
      fail("ValueError: cannot unpack {} values into {} names", items.size(), target.names.size());
    }
    for (size_t i = 0; i < items.size(); ++i) scope->set(target.names[i], items[i]);
  }

  void execute_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*stmt.expr, scope));
    if (stmt.filter) {
      // The loop condition sees the loop variables but not `loop`.
      std::vector<Value> kept;
      for (Value& item : items) {
        count_iteration();
        auto probe = std::make_shared<Scope>(scope);
        assign(stmt.target, item, probe);
        if (eval(*stmt.filter, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      render(stmt.else_body, std::make_shared<Scope>(scope), out);
      return;
    }
    auto last_changed = std::make_shared<std::optional<Value>>();
    const auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      count_iteration();
      auto inner = std::make_shared<Scope>(scope);
      assign(stmt.target, items[static_cast<size_t>(i)], inner);
      inner->set("loop", make_loop(items, i, last_changed));
      if (render(stmt.body, inner, out) == Flow::kBreak) break;
    }
  }

  void count_iteration() {
    if (++loop_iterations_ > limits_.max_loop_iterations) {
      fail("jinja: loop iteration limit: more than {} loop iterations in one render",
           limits_.max_loop_iterations);
    }
  }

  static Value make_loop(const std::vector<Value>& items, int64_t index,
                         const std::shared_ptr<std::optional<Value>>& last_changed) {
    const auto length = static_cast<int64_t>(items.size());
    Dict loop;
    loop.set("index", Value::integer(index + 1));
    loop.set("index0", Value::integer(index));
    loop.set("revindex", Value::integer(length - index));
    loop.set("revindex0", Value::integer(length - index - 1));
    loop.set("first", Value::boolean(index == 0));
    loop.set("last", Value::boolean(index == length - 1));
    loop.set("length", Value::integer(length));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", index > 0 ? items[static_cast<size_t>(index - 1)]
                                   : Value::undefined("there is no previous item"));
    loop.set("nextitem", index + 1 < length ? items[static_cast<size_t>(index + 1)]
                                            : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("cycle", [index](const CallArguments& args) {
               if (args.positional.empty()) fail("TypeError: no items for cycling given");
               return args.positional[static_cast<size_t>(index) % args.positional.size()];
             }));
    loop.set("changed", Value::function("changed", [last_changed](const CallArguments& args) {
               const Value current = Value::tuple(args.positional);
               if (last_changed->has_value() && equals(**last_changed, current))
                 return Value::boolean(false);
               *last_changed = current;
               return Value::boolean(true);
             }));
    return Value::dict(std::move(loop));
  }

  // A macro (or a {% call %} body, invoked as caller()) as a callable value. Arguments bind like
  // jinja2's: positional, then keywords; missing ones take their default or are Undefined; extras
  // go to varargs/kwargs only when the body mentions them.
  Value make_macro(const Stmt& stmt, const ScopePtr& defining_scope, const std::string& name) {
    // The macro usually lives in the scope it closes over; a weak reference avoids the cycle
    // and the renderer keeps the scope alive.
    macro_scopes_.push_back(defining_scope);
    std::weak_ptr<Scope> closure = defining_scope;
    return Value::function(name, [this, &stmt, closure, name](const CallArguments& args) {
      const Nesting calls(call_depth_, limits_.max_call_depth, "recursion");
      auto scope = std::make_shared<Scope>(closure.lock());
      const auto& parameters = stmt.parameters;
      std::vector<bool> given(parameters.size(), false);
      if (args.positional.size() > parameters.size() && !stmt.uses_varargs) {
        fail("TypeError: macro '{}' takes not more than {} argument(s)", name, parameters.size());
      }
      for (size_t i = 0; i < args.positional.size() && i < parameters.size(); ++i) {
        scope->set(parameters[i].name, args.positional[i]);
        given[i] = true;
      }
      std::vector<Value> extra_positional;
      for (size_t i = parameters.size(); i < args.positional.size(); ++i)
        extra_positional.push_back(args.positional[i]);
      Dict extra_keywords;
      bool has_caller = false;
      for (const auto& [key, value] : args.keyword) {
        size_t i = 0;
        while (i < parameters.size() && parameters[i].name != key) ++i;
        if (i < parameters.size()) {
          if (given[i])
            fail("TypeError: macro '{}' got multiple values for argument '{}'", name, key);
          scope->set(key, value);
          given[i] = true;
        } else if (key == "caller" && stmt.uses_caller) {
          scope->set("caller", value);
          has_caller = true;
        } else if (stmt.uses_kwargs) {
          extra_keywords.set(key, value);
        } else {
          fail("TypeError: macro '{}' takes no keyword argument '{}'", name, key);
        }
      }
      for (size_t i = 0; i < parameters.size(); ++i) {
        if (given[i]) continue;
        scope->set(parameters[i].name,
                   parameters[i].default_value
                       ? eval(*parameters[i].default_value, scope)
                       : Value::undefined(
                             fmt::format("parameter '{}' was not provided", parameters[i].name)));
      }
      scope->set("varargs", Value::tuple(std::move(extra_positional)));
      scope->set("kwargs", Value::dict(std::move(extra_keywords)));
      if (!has_caller && stmt.uses_caller)
        scope->set("caller", Value::undefined("No caller defined"));
      std::string out;
      render(stmt.body, scope, out);
      return Value::string(std::move(out));
    });
  }

  // Applies a chain of filters parsed without an operand ({% filter %}, block {% set %}) to
  // `input`.
  Value apply_filter_chain(const Expr& filter, Value input, const ScopePtr& scope) {
    Value operand = filter.operands.empty()
                        ? std::move(input)
                        : apply_filter_chain(*filter.operands[0], std::move(input), scope);
    return apply_filter(filter.name, operand, eval_arguments(filter.arguments, scope));
  }

  CallArguments eval_arguments(const Arguments& arguments, const ScopePtr& scope) {
    CallArguments result;
    result.positional.reserve(arguments.positional.size());
    for (const auto& arg : arguments.positional) result.positional.push_back(eval(*arg, scope));
    for (const auto& [key, arg] : arguments.keyword)
      result.keyword.emplace_back(key, eval(*arg, scope));
    return result;
  }

  Value eval(const Expr& expr, const ScopePtr& scope) {
    try {
      const Nesting nesting(nesting_, limits_.max_nesting, "nesting");
      Value value = eval_unlocated(expr, scope);
      if (value.is_string() && value.as_string().size() > limits_.max_string_bytes) {
        fail("jinja: string size limit: a value of {} bytes (the limit is {})",
             value.as_string().size(), limits_.max_string_bytes);
      }
      return value;
    } catch (const std::exception&) {
      rethrow_located(expr.line);
    }
  }

  Value eval_unlocated(const Expr& expr, const ScopePtr& scope) {
    switch (expr.kind) {
      case Expr::Kind::kLiteral:
        return expr.value;
      case Expr::Kind::kName: {
        if (const Value* found = scope->find(expr.name)) return *found;
        return global(expr.name);
      }
      case Expr::Kind::kAttribute:
        return get_attribute(eval(*expr.operands[0], scope), expr.name);
      case Expr::Kind::kItem:
        return get_item(eval(*expr.operands[0], scope), eval(*expr.operands[1], scope));
      case Expr::Kind::kSlice: {
        const Value object = eval(*expr.operands[0], scope);
        auto part = [&](size_t i) {
          return expr.slice[i] ? eval(*expr.slice[i], scope) : Value::none();
        };
        return get_slice(object, part(0), part(1), part(2));
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*expr.operands[0], scope);
        Value result = call(callee, eval_arguments(expr.arguments, scope));
        if (result.is_namespace()) namespaces_.push_back(result);
        return result;
      }
      case Expr::Kind::kFilter:
        return apply_filter(expr.name, eval(*expr.operands[0], scope),
                            eval_arguments(expr.arguments, scope));
      case Expr::Kind::kTest:
        return Value::boolean(apply_test(expr.name, eval(*expr.operands[0], scope),
                                         eval_arguments(expr.arguments, scope)));
      case Expr::Kind::kNot:
        return Value::boolean(!eval(*expr.operands[0], scope).truthy());
      case Expr::Kind::kNegate:
        return negate(eval(*expr.operands[0], scope));
      case Expr::Kind::kPlus:
        return unary_plus(eval(*expr.operands[0], scope));
      case Expr::Kind::kBinary: {
        Value left = eval(*expr.operands[0], scope);
        if (expr.name == "and") return left.truthy() ? eval(*expr.operands[1], scope) : left;
        if (expr.name == "or") return left.truthy() ? left : eval(*expr.operands[1], scope);
        return binary_operation(expr.name, left, eval(*expr.operands[1], scope));
      }
      case Expr::Kind::kConcat: {
        std::string out;
        for (const auto& operand : expr.operands) out += to_str(eval(*operand, scope));
        return Value::string(std::move(out));
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*expr.operands[0], scope);
        for (size_t i = 0; i < expr.compare_ops.size(); ++i) {
          Value right = eval(*expr.operands[i + 1], scope);
          if (!compare_holds(expr.compare_ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCondition:
        if (eval(*expr.operands[0], scope).truthy()) return eval(*expr.operands[1], scope);
        if (expr.operands[2]) return eval(*expr.operands[2], scope);
        return Value::undefined(
            fmt::format("the inline if-expression on line {} evaluated to false and no else "
                        "section was defined.",
                        expr.line));
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        std::vector<Value> items;
        items.reserve(expr.operands.size());
        for (const auto& operand : expr.operands) items.push_back(eval(*operand, scope));
        return expr.kind == Expr::Kind::kList ? Value::list(std::move(items))
                                              : Value::tuple(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < expr.operands.size(); i += 2) {
          const Value key = eval(*expr.operands[i], scope);
          if (!key.is_string())
            fail("jinja: dict keys other than strings are not supported (got {})", key.type_name());
          dict.set(key.as_string(), eval(*expr.operands[i + 1], scope));
        }
        return Value::dict(std::move(dict));
      }
    }
    fail("jinja: unknown expression");
  }

  static bool compare_holds(const std::string& op, const Value& left, const Value& right) {
    if (op == "==") return equals(left, right);
    if (op == "!=") return !equals(left, right);
    if (op == "in") return contains(right, left);
    if (op == "notin") return !contains(right, left);
    const int c = compare(left, right, op);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  const std::string& name_;
  const RenderLimits limits_;
  const StringLimit string_limit_;
  int nesting_ = 0;
  int call_depth_ = 0;
  int64_t loop_iterations_ = 0;
  std::vector<ScopePtr> macro_scopes_;
  std::vector<Value> namespaces_;
};

}  // namespace

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  body_ = std::make_shared<const Body>(parse_template(tokenize(source, name_), name_));
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Dict& variables, const RenderLimits& limits) const {
  auto scope = std::make_shared<Scope>(nullptr);
  for (const auto& [name, value] : variables.entries()) scope->set(name, value);
  std::string out;
  Renderer renderer(name_, limits);
  renderer.render(*body_, scope, out);
  return out;
}

}  // namespace dspark::jinja

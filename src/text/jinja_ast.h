#pragma once
// The syntax tree of a parsed Jinja template. Nodes carry their template line for error messages.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace dspark::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kAttribute,  // operands[0].name
    kItem,       // operands[0][operands[1]]
    kSlice,      // operands[0][slice[0]:slice[1]:slice[2]] (null parts omitted)
    kCall,       // operands[0](arguments)
    kFilter,     // operands[0] | name(arguments); no operand inside {% filter %} blocks
    kTest,       // operands[0] is name(arguments)
    kNot,        // not operands[0]
    kNegate,     // -operands[0]
    kPlus,       // +operands[0]
    kBinary,     // operands[0] op operands[1]: + - * / // % ** and or
    kConcat,     // operands joined with ~
    kCompare,    // operands[0] ops[0] operands[1] ops[1] operands[2] ...
    kCondition,  // operands[1] if operands[0] else operands[2] (absent: Undefined)
    kList,       // [operands...]
    kTuple,      // (operands...)
    kDict,       // {operands[0]: operands[1], ...}
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // levels of expressions in this one, itself included (see the parser's seal)
  Value value;
  std::string name;  // name, attribute, filter, test or binary operator
  std::vector<ExprPtr> operands;
  std::vector<std::string> compare_ops;  // == != < <= > >= in notin
  std::vector<ExprPtr> slice;            // start, stop, step (entries may be null)
  Arguments arguments;
};

// An assignment target: a name, a namespace attribute (`ns.attr`), or a tuple of names.
struct Target {
  std::vector<std::string> names;  // one for a plain name, several for tuple unpacking
  bool unpack = false;
  std::string namespace_attribute;  // set for `ns.attr`, with names = {"ns"}
};

struct MacroParameter {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // for target in expr [if filter] body else else_body
    kSet,          // set target = expr
    kSetBlock,     // set target [| filter] %} body {% endset
    kMacro,        // macro name(parameters) body
    kCallBlock,    // call[(parameters)] expr body
    kFilterBlock,  // filter expr (a filter chain with no operand) body
    kWith,         // with targets = values body
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %} marker: renders its body
  };
  Kind kind;
  int line = 0;
  int depth = 1;  // levels of expressions in this one, itself included (see the parser's seal)
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // for-loop condition, or the filter of a block set
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  Target target;
  std::vector<Target> with_targets;
  std::vector<ExprPtr> with_values;
  std::string name;
  std::vector<MacroParameter> parameters;
  // Macros: whether the body mentions varargs / kwargs / caller (jinja2 then accepts extra
  // positional / keyword arguments, and a caller).
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};

}  // namespace dspark::jinja

// Jinja abstract syntax tree: expressions and statements, each with its source position.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace m3::jinja {

enum class ExprKind : uint8_t {
  kLiteral,   // literal
  kName,      // name
  kList,      // children
  kTuple,     // children
  kDict,      // children: k0, v0, k1, v1, ...
  kAttr,      // children[0].name
  kItem,      // children[0][children[1]]
  kSlice,     // children[0][c1:c2:c3], missing parts are null
  kCall,      // children[0](children[1..], kwargs)
  kFilter,    // children[0] | name(children[1..], kwargs); children[0] null in filter blocks
  kTest,      // children[0] is [not] name(children[1..], kwargs)
  kNot,       // not children[0]
  kNeg,       // -children[0]
  kPos,       // +children[0]
  kBinary,    // children[0] op children[1]; op in + - * / // % ** ~
  kAnd,       // children[0] and children[1]
  kOr,        // children[0] or children[1]
  kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...
  kCondExpr,  // children[0] if children[1] else children[2] (children[2] may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  SourcePos pos;
  Value literal;
  std::string name;  // name, attribute, filter/test name, binary operator
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args;    // *args
  ExprPtr dyn_kwargs;  // **kwargs
  std::vector<std::string> ops;  // comparison operators
  bool negated = false;          // `is not`
};

enum class StmtKind : uint8_t {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,         // targets/target_expr = expr
  kSetBlock,    // targets = captured body | filters
  kMacro,
  kCallBlock,   // expr = call, params = caller's parameters
  kFilterBlock, // filters applied to body
  kBreak,
  kContinue,
  kWith,        // assignments then body
  kScope,       // body in its own scope (generation blocks render as plain bodies)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;                                // kText; macro name
  ExprPtr expr;                                    // output, for iterable, set value, call
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif
  Body body;
  Body else_body;
  std::vector<std::string> targets;  // for/set names (several = tuple unpacking)
  std::string attr;                  // set ns.attr: targets[0] is the namespace
  ExprPtr filter_cond;               // for ... if cond
  std::vector<Param> params;         // macro / caller parameters
  std::vector<ExprPtr> filters;      // set block / filter block filters (kFilter, null operand)
  std::vector<std::pair<std::string, ExprPtr>> assigns;  // with
  bool uses_caller = false;    // macro body references `caller`
  bool uses_varargs = false;   // macro body references `varargs`
  bool uses_kwargs = false;    // macro body references `kwargs`
};

struct Program {
  Body body;
};

}  // namespace m3::jinja

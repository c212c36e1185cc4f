#include "chat/jinja/parser.h"

#include <set>

namespace m3::jinja {
namespace {

// Deep nesting is refused before it can exhaust the stack (untrusted templates).
constexpr int kMaxNesting = 96;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Program run() {
    Program p;
    p.body = subparse({});
    if (cur().type != TokenType::kEof) {
      // subparse stopped at an end tag nobody opened.
      fail("unexpected '" + peek(1).text + "'", peek(1).pos);
    }
    return p;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  [[noreturn]] void fail(const std::string& msg, SourcePos pos) const {
    throw TemplateError(msg, pos);
  }
  [[noreturn]] void fail_here(const std::string& msg) const { fail(msg, cur().pos); }
  bool is_op(const char* op) const { return cur().type == TokenType::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kEof: return "end of template";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVarEnd: return "end of print statement";
      case TokenType::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_here(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail_here("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd)
      fail_here("expected end of statement block, got " + describe(cur()));
    next();
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : p_(p) {
      if (++p_->depth_ > kMaxNesting) p_->fail_here("template nested too deeply");
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  ExprPtr make(ExprKind k, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  // ---- statements ----

  // Parses until EOF or a block tag whose name is in `ends` (left unconsumed at its BlockBegin).
  Body subparse(const std::set<std::string>& ends) {
    DepthGuard g(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) {
        if (!ends.empty()) {
          fail_here("unexpected end of template, expected one of: " + join_set(ends));
        }
        return body;
      }
      if (t.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->pos = t.pos;
        s->text = t.text;
        next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->pos = t.pos;
        next();
        s->expr = parse_tuple(true, false);
        if (cur().type != TokenType::kVarEnd)
          fail_here("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        const Token& name = peek(1);
        if (name.type != TokenType::kName) fail("expected a tag name", name.pos);
        if (ends.count(name.text)) return body;
        next();
        body.push_back(parse_statement());
      } else {
        fail_here("unexpected " + describe(t));
      }
    }
  }

  static std::string join_set(const std::set<std::string>& s) {
    std::string out;
    for (const auto& x : s) out += (out.empty() ? "'" : ", '") + x + "'";
    return out;
  }

  // At the tag name (after BlockBegin).
  StmtPtr parse_statement() {
    const Token& t = cur();
    SourcePos pos = t.pos;
    std::string tag = t.text;
    next();
    if (tag == "if") return parse_if(pos);
    if (tag == "for") return parse_for(pos);
    if (tag == "set") return parse_set(pos);
    if (tag == "macro") return parse_macro(pos);
    if (tag == "call") return parse_call_block(pos);
    if (tag == "filter") return parse_filter_block(pos);
    if (tag == "with") return parse_with(pos);
    if (tag == "generation") {
      auto s = std::make_unique<Stmt>();
      s->kind = StmtKind::kScope;
      s->pos = pos;
      expect_block_end();
      s->body = subparse({"endgeneration"});
      end_tag("endgeneration");
      return s;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside of a loop", pos);
      auto s = std::make_unique<Stmt>();
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      s->pos = pos;
      expect_block_end();
      return s;
    }
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
        tag == "block") {
      fail("the '" + tag + "' tag is not supported in chat templates", pos);
    }
    fail("encountered unknown tag '" + tag + "'", pos);
  }

  // Consumes `{% name %}` (the BlockBegin is current).
  void end_tag(const char* name) {
    next();  // BlockBegin
    if (!skip_name(name)) fail_here(std::string("expected '") + name + "'");
    expect_block_end();
  }

  StmtPtr parse_if(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kIf;
    s->pos = pos;
    ExprPtr cond = parse_tuple(false, false);
    expect_block_end();
    while (true) {
      Body b = subparse({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(b));
      next();  // BlockBegin
      std::string tag = next().text;
      if (tag == "elif") {
        cond = parse_tuple(false, false);
        expect_block_end();
        continue;
      }
      if (tag == "else") {
        expect_block_end();
        s->else_body = subparse({"endif"});
        end_tag("endif");
      } else {
        expect_block_end();
      }
      return s;
    }
  }

  std::vector<std::string> parse_assign_names(bool allow_paren) {
    std::vector<std::string> names;
    bool paren = allow_paren && skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().type != TokenType::kName) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFor;
    s->pos = pos;
    s->targets = parse_assign_names(true);
    for (const auto& n : s->targets)
      if (n == "loop") fail("can't assign to special loop variable in for-loop target", pos);
    if (!skip_name("in")) fail_here("expected 'in'");
    s->expr = parse_tuple(false, true /*no condexpr*/);
    if (skip_name("if")) s->filter_cond = parse_expression(true);
    if (skip_name("recursive")) fail("recursive loops are not supported", pos);
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"});
    --loop_depth_;
    next();
    std::string tag = next().text;
    expect_block_end();
    if (tag == "else") {
      int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in a for-else refer to no loop of this for
      s->else_body = subparse({"endfor"});
      loop_depth_ = saved;
      end_tag("endfor");
    }
    return s;
  }

  StmtPtr parse_set(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    std::string first = expect_name();
    if (skip_op(".")) {
      s->targets = {first};
      s->attr = expect_name();
    } else {
      s->targets = {first};
      while (skip_op(",")) {
        if (cur().type != TokenType::kName) break;
        s->targets.push_back(expect_name());
      }
    }
    if (skip_op("=")) {
      s->kind = StmtKind::kSet;
      s->expr = parse_tuple(false, false);
      expect_block_end();
      return s;
    }
    if (!s->attr.empty() || s->targets.size() != 1) fail_here("expected '='");
    s->kind = StmtKind::kSetBlock;
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr, true));
    expect_block_end();
    s->body = subparse({"endset"});
    end_tag("endset");
    return s;
  }

  std::vector<Param> parse_signature() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kMacro;
    s->pos = pos;
    s->text = expect_name();
    s->params = parse_signature();
    expect_block_end();
    std::set<std::string> names;
    collectors_.push_back(&names);
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved;
    collectors_.pop_back();
    end_tag("endmacro");
    s->uses_caller = names.count("caller") > 0;
    s->uses_varargs = names.count("varargs") > 0;
    s->uses_kwargs = names.count("kwargs") > 0;
    return s;
  }

  StmtPtr parse_call_block(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kCallBlock;
    s->pos = pos;
    if (is_op("(")) s->params = parse_signature();
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) fail("expected call", pos);
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endcall"});
    loop_depth_ = saved;
    end_tag("endcall");
    return s;
  }

  StmtPtr parse_filter_block(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kFilterBlock;
    s->pos = pos;
    s->filters.push_back(parse_filter(nullptr, false));
    while (skip_op("|")) s->filters.push_back(parse_filter(nullptr, true));
    expect_block_end();
    s->body = subparse({"endfilter"});
    end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = StmtKind::kWith;
    s->pos = pos;
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      std::string n = expect_name();
      expect_op("=");
      s->assigns.emplace_back(n, parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"});
    end_tag("endwith");
    return s;
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  // Tuples without parentheses (`{{ a, b }}`, `set x = 1, 2`, `for x in a, b`).
  ExprPtr parse_tuple(bool allow_empty_end, bool no_condexpr) {
    SourcePos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
      }
      if (is_tuple_end()) break;
      items.push_back(parse_expression(!no_condexpr));
    }
    if (!saw_comma) {
      if (items.empty()) fail("expected an expression, got " + describe(cur()), pos);
      return std::move(items[0]);
    }
    auto e = make(ExprKind::kTuple, pos);
    e->children = std::move(items);
    (void)allow_empty_end;
    return e;
  }

  bool is_tuple_end() const {
    const Token& t = cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || t.type == TokenType::kEof)
      return true;
    if (t.type == TokenType::kOp && (t.text == ")" || t.text == "]" || t.text == "}")) return true;
    if (t.type == TokenType::kName && (t.text == "in" || t.text == "if" || t.text == "recursive"))
      return true;
    return false;
  }

  ExprPtr parse_condexpr() {
    SourcePos pos = cur().pos;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr cond = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = make(ExprKind::kCondExpr, pos);
      e->children.push_back(std::move(expr1));
      e->children.push_back(std::move(cond));
      e->children.push_back(std::move(expr3));
      expr1 = std::move(e);
      pos = cur().pos;
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      SourcePos pos = next().pos;
      auto e = make(ExprKind::kOr, pos);
      e->children.push_back(std::move(left));
      e->children.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      SourcePos pos = next().pos;
      auto e = make(ExprKind::kAnd, pos);
      e->children.push_back(std::move(left));
      e->children.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(this);
      SourcePos pos = next().pos;
      auto e = make(ExprKind::kNot, pos);
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    SourcePos pos = cur().pos;
    ExprPtr expr = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      const Token& t = cur();
      std::string op;
      if (t.type == TokenType::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" ||
           t.text == ">=")) {
        op = t.text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek(1).type == TokenType::kName && peek(1).text == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto e = make(ExprKind::kCompare, pos);
    e->children.push_back(std::move(expr));
    for (auto& o : operands) e->children.push_back(std::move(o));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, SourcePos pos) {
    auto e = make(ExprKind::kBinary, pos);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      std::string op = t.text;
      SourcePos pos = t.pos;
      left = binary(op, std::move(left), parse_concat(), pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      SourcePos pos = next().pos;
      left = binary("~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      std::string op = t.text;
      SourcePos pos = t.pos;
      left = binary(op, std::move(left), parse_pow(), pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      SourcePos pos = next().pos;
      left = binary("**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    SourcePos pos = cur().pos;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      bool neg = next().text == "-";
      node = make(neg ? ExprKind::kNeg : ExprKind::kPos, pos);
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    SourcePos pos = t.pos;
    if (t.type == TokenType::kName) {
      std::string n = next().text;
      auto e = make(ExprKind::kLiteral, pos);
      if (n == "true" || n == "True") {
        e->literal = Value(true);
      } else if (n == "false" || n == "False") {
        e->literal = Value(false);
      } else if (n == "none" || n == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::kName;
        e->name = n;
        for (auto* c : collectors_) c->insert(n);
      }
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s = next().text;
      while (cur().type == TokenType::kString) s += next().text;
      auto e = make(ExprKind::kLiteral, pos);
      e->literal = Value(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInt || t.type == TokenType::kFloat) {
      auto e = make(ExprKind::kLiteral, pos);
      e->literal = t.type == TokenType::kInt ? Value(t.int_value) : Value(t.float_value);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      if (skip_op(")")) {
        auto e = make(ExprKind::kTuple, pos);
        return e;
      }
      ExprPtr first = parse_expression(true);
      if (skip_op(")")) return first;
      auto e = make(ExprKind::kTuple, pos);
      e->children.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        e->children.push_back(parse_expression(true));
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto e = make(ExprKind::kList, pos);
      while (!is_op("]")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("]")) break;
        e->children.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op("{")) {
      next();
      auto e = make(ExprKind::kDict, pos);
      while (!is_op("}")) {
        if (!e->children.empty()) expect_op(",");
        if (is_op("}")) break;
        e->children.push_back(parse_expression(true));
        expect_op(":");
        e->children.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail_here("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        SourcePos pos = next().pos;
        if (cur().type == TokenType::kName) {
          auto e = make(ExprKind::kAttr, pos);
          e->name = next().text;
          e->children.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().type == TokenType::kInt) {
          auto e = make(ExprKind::kItem, pos);
          auto lit = make(ExprKind::kLiteral, cur().pos);
          lit->literal = Value(next().int_value);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(lit));
          node = std::move(e);
        } else {
          fail_here("expected name or number after '.'");
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    DepthGuard g(this);
    SourcePos pos = next().pos;  // [
    ExprPtr parts[3];
    bool is_slice = false;
    int idx = 0;
    if (!is_op(":")) parts[0] = parse_expression(true);
    while (is_op(":")) {
      next();
      is_slice = true;
      if (++idx > 2) fail_here("invalid slice");
      if (!is_op(":") && !is_op("]")) parts[idx] = parse_expression(true);
    }
    if (!is_slice && is_op(",")) {
      // tuple key a[1, 2]
      auto t = make(ExprKind::kTuple, pos);
      t->children.push_back(std::move(parts[0]));
      while (skip_op(",")) {
        if (is_op("]")) break;
        t->children.push_back(parse_expression(true));
      }
      parts[0] = std::move(t);
    }
    expect_op("]");
    if (!is_slice && !parts[0]) fail("expected subscript expression", pos);
    auto e = make(is_slice ? ExprKind::kSlice : ExprKind::kItem, pos);
    e->children.push_back(std::move(node));
    e->children.push_back(std::move(parts[0]));
    if (is_slice) {
      e->children.push_back(std::move(parts[1]));
      e->children.push_back(std::move(parts[2]));
    }
    return e;
  }

  // Call arguments after '(' into e (children after index `first`, kwargs, *args, **kwargs).
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (skip_op("*")) {
        e.dyn_args = parse_expression(true);
      } else if (skip_op("**")) {
        e.dyn_kwargs = parse_expression(true);
      } else if (cur().type == TokenType::kName && peek(1).type == TokenType::kOp &&
                 peek(1).text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty() || e.dyn_args || e.dyn_kwargs)
          fail_here("invalid syntax for function call expression");
        e.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    DepthGuard g(this);
    auto e = make(ExprKind::kCall, cur().pos);
    e->children.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  // After '|' (or at the filter name in {% filter %}).
  ExprPtr parse_filter(ExprPtr operand, bool /*after_pipe*/) {
    DepthGuard g(this);
    SourcePos pos = cur().pos;
    std::string name = expect_name();
    while (is_op(".") && peek(1).type == TokenType::kName) {
      next();
      name += "." + next().text;
    }
    auto e = make(ExprKind::kFilter, pos);
    e->name = name;
    e->children.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        next();
        node = parse_filter(std::move(node), true);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    DepthGuard g(this);
    SourcePos pos = next().pos;  // is
    bool negated = skip_name("not");
    std::string name = expect_name();
    while (is_op(".") && peek(1).type == TokenType::kName) {
      next();
      name += "." + next().text;
    }
    auto e = make(ExprKind::kTest, pos);
    e->name = name;
    e->negated = negated;
    e->children.push_back(std::move(node));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInt || t.type == TokenType::kFloat || is_op("[") ||
                is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail_here("you cannot chain multiple tests with is");
      ExprPtr arg = parse_postfix(parse_primary());
      e->children.push_back(std::move(arg));
    }
    return e;
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::set<std::string>*> collectors_;
};

}  // namespace

Program parse(std::vector<Token> tokens) {
  Parser p(std::move(tokens));
  return p.run();
}

}  // namespace m3::jinja

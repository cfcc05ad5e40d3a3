// The parser (parser.h): one function per statement and per precedence level.
#include "jinja/parser.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <fmt/core.h>

#include "jinja/jinja.h"

namespace trellis::jinja {

const std::unordered_map<std::string, int>& KnownFilters() {
  static const std::unordered_map<std::string, int> f = {
      {"trim", 0}, {"strip", 0}, {"tojson", 0}, {"length", 0}, {"count", 0}, {"upper", 0}, {"lower", 0},
      {"capitalize", 0}, {"title", 0}, {"first", 0}, {"last", 0}, {"join", 0}, {"default", 0}, {"d", 0},
      {"replace", 0}, {"string", 0}, {"int", 0}, {"float", 0}, {"list", 0}, {"items", 0}, {"selectattr", 0},
      {"rejectattr", 0}, {"select", 0}, {"reject", 0}, {"map", 0}, {"safe", 0}, {"indent", 0}, {"unique", 0},
      {"reverse", 0}, {"sort", 0}, {"abs", 0}, {"round", 0}, {"e", 0}, {"escape", 0}, {"dictsort", 0},
      {"batch", 0}, {"sum", 0}, {"min", 0}, {"max", 0}, {"wordcount", 0}, {"center", 0}, {"pprint", 0}};
  return f;
}

const std::unordered_map<std::string, int>& KnownTests() {
  static const std::unordered_map<std::string, int> t = {
      {"defined", 0}, {"undefined", 0}, {"none", 0}, {"string", 0}, {"number", 0}, {"integer", 0},
      {"float", 0}, {"mapping", 0}, {"iterable", 0}, {"sequence", 0}, {"boolean", 0}, {"true", 0},
      {"false", 0}, {"equalto", 0}, {"eq", 0}, {"==", 0}, {"ne", 0}, {"!=", 0}, {"odd", 0}, {"even", 0},
      {"in", 0}, {"callable", 0}, {"lower", 0}, {"upper", 0}, {"divisibleby", 0}, {"gt", 0}, {"lt", 0},
      {"ge", 0}, {"le", 0}, {"greaterthan", 0}, {"lessthan", 0}, {"sameas", 0}};
  return t;
}

namespace {

NodeP Mk(Node::K k, int line, std::string name = {}, std::vector<NodeP> kids = {}) {
  auto n = std::make_shared<Node>();
  n->k = k;
  n->line = line;
  n->name = std::move(name);
  n->kids = std::move(kids);
  return n;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Result<NodeP> ParseTemplate() {
    std::string end;
    TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Peek(int k = 0) const { return t_[std::min(p_ + static_cast<size_t>(k), t_.size() - 1)]; }
  bool IsOp(const char* op, int k = 0) const { return Peek(k).kind == Tok::kOp && Peek(k).text == op; }
  bool IsName(const char* n, int k = 0) const { return Peek(k).kind == Tok::kName && Peek(k).text == n; }
  Status Expect(const char* op) {
    if (!IsOp(op)) return SyntaxError(Peek().line, fmt::format("expected '{}', found {}", op, Describe(Peek())));
    ++p_;
    return Status::Ok();
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case Tok::kVarEnd: return "the end of {{ }}";
      case Tok::kBlockEnd: return "the end of {% %}";
      case Tok::kEnd: return "the end of the template";
      case Tok::kString: return "a string";
      default: return "'" + t.text + "'";
    }
  }
  Result<std::string> ExpectName() {
    if (Peek().kind != Tok::kName) return SyntaxError(Peek().line, fmt::format("expected a name, found {}", Describe(Peek())));
    return t_[p_++].text;
  }
  Status ExpectBlockEnd() {
    if (Peek().kind != Tok::kBlockEnd) {
      return SyntaxError(Peek().line, fmt::format("expected the end of the tag, found {}", Describe(Peek())));
    }
    ++p_;
    return Status::Ok();
  }

  // Statements until one of `ends` (a block tag name); *end gets the one found ("" at EOF).
  Result<NodeP> ParseBody(const std::vector<std::string>& ends, std::string* end) {
    auto body = std::make_shared<Node>();
    body->k = Node::K::kBody;
    body->line = Peek().line;
    for (;;) {
      const Token& tok = Peek();
      if (tok.kind == Tok::kEnd) {
        if (!ends.empty()) return SyntaxError(tok.line, fmt::format("missing {{% {} %}}", ends.front()));
        *end = "";
        return NodeP(body);
      }
      if (tok.kind == Tok::kText) {
        body->kids.push_back(Mk(Node::K::kText, tok.line, tok.text));
        ++p_;
      } else if (tok.kind == Tok::kVarBegin) {
        ++p_;
        links_ = 0;
        TRELLIS_ASSIGN_OR_RETURN(NodeP e, ParseExpr());
        if (Peek().kind != Tok::kVarEnd) return SyntaxError(Peek().line, fmt::format("expected }}}}, found {}", Describe(Peek())));
        ++p_;
        body->kids.push_back(Mk(Node::K::kOutput, tok.line, "", {e}));
      } else if (tok.kind == Tok::kBlockBegin) {
        const int line = tok.line;
        ++p_;
        links_ = 0;
        TRELLIS_ASSIGN_OR_RETURN(std::string tag, ExpectName());
        if (std::find(ends.begin(), ends.end(), tag) != ends.end()) {
          *end = tag;
          return NodeP(body);
        }
        TRELLIS_ASSIGN_OR_RETURN(NodeP st, ParseStatement(tag, line));
        if (st) body->kids.push_back(st);
      } else {
        return SyntaxError(tok.line, "unexpected token");
      }
      if (++depth_guard_ > 10'000'000) return SyntaxError(tok.line, "template too large");
    }
  }

  Result<NodeP> ParseStatement(const std::string& tag, int line) {
    if (blocks_ >= kMaxBlocks) return SyntaxError(line, "blocks nested too deeply");
    ++blocks_;
    Result<NodeP> r = ParseStatementInner(tag, line);
    --blocks_;
    return r;
  }
  static constexpr int kMaxBlocks = 100;

  Result<NodeP> ParseStatementInner(const std::string& tag, int line) {
    if (tag == "if") return ParseIf(line);
    if (tag == "for") return ParseFor(line);
    if (tag == "set") return ParseSet(line);
    if (tag == "macro") return ParseMacro(line);
    if (tag == "call") return ParseCallBlock(line);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return SyntaxError(line, fmt::format("{{% {} %}} outside a loop", tag));
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      return Mk(tag == "break" ? Node::K::kBreak : Node::K::kContinue, line);
    }
    if (tag == "generation") {  // HF's assistant-mask marker: render the body
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"endgeneration"}, &end));
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      return body;
    }
    return SyntaxError(line, fmt::format("unsupported tag {{% {} %}}", tag));
  }

  Result<NodeP> ParseIf(int line) {
    auto n = std::make_shared<Node>();
    n->k = Node::K::kIf;
    n->line = line;
    for (;;) {
      TRELLIS_ASSIGN_OR_RETURN(NodeP cond, ParseExpr());
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"elif", "else", "endif"}, &end));
      n->kids.push_back(cond);
      n->kids.push_back(body);
      if (end == "elif") continue;
      if (end == "else") {
        TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
        TRELLIS_ASSIGN_OR_RETURN(NodeP els, ParseBody({"endif"}, &end));
        n->kids.push_back(els);
        n->flag = true;
      }
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      return NodeP(n);
    }
  }

  Result<NodeP> ParseFor(int line) {
    auto n = std::make_shared<Node>();
    n->k = Node::K::kFor;
    n->line = line;
    const bool paren = IsOp("(");
    if (paren) ++p_;
    for (;;) {
      TRELLIS_ASSIGN_OR_RETURN(std::string v, ExpectName());
      n->names.push_back(v);
      if (!IsOp(",")) break;
      ++p_;
    }
    if (paren) TRELLIS_RETURN_IF_ERROR(Expect(")"));
    if (!IsName("in")) return SyntaxError(Peek().line, "expected 'in' in {% for %}");
    ++p_;
    TRELLIS_ASSIGN_OR_RETURN(NodeP iter, ParseOr());  // no conditional expression: 'if' filters
    NodeP filter;
    if (IsName("if")) {
      ++p_;
      TRELLIS_ASSIGN_OR_RETURN(filter, ParseOr());
    }
    if (IsName("recursive")) return SyntaxError(line, "recursive loops are not supported");
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    std::string end;
    TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"else", "endfor"}, &end));
    --loop_depth_;
    n->kids = {iter, filter, body};
    if (end == "else") {
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      TRELLIS_ASSIGN_OR_RETURN(NodeP els, ParseBody({"endfor"}, &end));
      n->kids.push_back(els);
      n->flag = true;
    }
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    return NodeP(n);
  }

  Result<NodeP> ParseSet(int line) {
    TRELLIS_ASSIGN_OR_RETURN(std::string name, ExpectName());
    if (IsOp(".")) {
      ++p_;
      TRELLIS_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      TRELLIS_RETURN_IF_ERROR(Expect("="));
      TRELLIS_ASSIGN_OR_RETURN(NodeP e, ParseTupleOrExpr());
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      auto n = std::make_shared<Node>(*Mk(Node::K::kSetAttr, line, attr, {e}));
      n->names = {name};
      return NodeP(n);
    }
    std::vector<std::string> targets = {name};
    while (IsOp(",")) {
      ++p_;
      TRELLIS_ASSIGN_OR_RETURN(std::string t, ExpectName());
      targets.push_back(t);
    }
    if (Peek().kind == Tok::kBlockEnd && targets.size() == 1) {  // {% set x %}...{% endset %}
      ++p_;
      std::string end;
      TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"endset"}, &end));
      TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
      return Mk(Node::K::kSetBlock, line, name, {body});
    }
    TRELLIS_RETURN_IF_ERROR(Expect("="));
    TRELLIS_ASSIGN_OR_RETURN(NodeP e, ParseTupleOrExpr());
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    auto n = std::make_shared<Node>(*Mk(Node::K::kSet, line, "", {e}));
    n->names = targets;
    return NodeP(n);
  }

  Result<NodeP> ParseMacro(int line) {
    TRELLIS_ASSIGN_OR_RETURN(std::string name, ExpectName());
    auto n = std::make_shared<Node>();
    n->k = Node::K::kMacro;
    n->line = line;
    n->name = name;
    TRELLIS_RETURN_IF_ERROR(Expect("("));
    std::vector<NodeP> defaults;
    while (!IsOp(")")) {
      TRELLIS_ASSIGN_OR_RETURN(std::string param, ExpectName());
      n->names.push_back(param);
      NodeP def;
      if (IsOp("=")) {
        ++p_;
        TRELLIS_ASSIGN_OR_RETURN(def, ParseExpr());
      }
      defaults.push_back(def);
      if (!IsOp(",")) break;
      ++p_;
    }
    TRELLIS_RETURN_IF_ERROR(Expect(")"));
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    const int saved = loop_depth_;
    loop_depth_ = 0;
    TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"endmacro"}, &end));
    loop_depth_ = saved;
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    n->kids = {body};
    n->kw = defaults;
    return NodeP(n);
  }

  Result<NodeP> ParseCallBlock(int line) {
    TRELLIS_ASSIGN_OR_RETURN(NodeP call, ParseExpr());
    if (call->k != Node::K::kCall) return SyntaxError(line, "{% call %} needs a macro call");
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    TRELLIS_ASSIGN_OR_RETURN(NodeP body, ParseBody({"endcall"}, &end));
    TRELLIS_RETURN_IF_ERROR(ExpectBlockEnd());
    return Mk(Node::K::kCallBlock, line, "", {call, body});
  }

  // ---- expressions ----

  Status Deeper() {
    if (++depth_ > Template::kMaxDepth) return SyntaxError(Peek().line, "expression nested too deeply");
    return Status::Ok();
  }
  // One more operator, attribute, subscript, call, filter or test in the current tag's
  // expression: chains build left-deep trees, whose depth every later walk (evaluation,
  // destruction) recurses through, so a tag may hold only so many.
  Status Link() {
    if (++links_ > kMaxLinks) return SyntaxError(Peek().line, "expression too long");
    return Status::Ok();
  }
  static constexpr int kMaxLinks = 2000;

  Result<NodeP> ParseTupleOrExpr() {
    const int line = Peek().line;
    TRELLIS_ASSIGN_OR_RETURN(NodeP first, ParseExpr());
    if (!IsOp(",")) return first;
    std::vector<NodeP> items = {first};
    while (IsOp(",")) {
      ++p_;
      if (Peek().kind == Tok::kBlockEnd) break;
      TRELLIS_ASSIGN_OR_RETURN(NodeP e, ParseExpr());
      items.push_back(e);
    }
    return Mk(Node::K::kTuple, line, "", items);
  }

  Result<NodeP> ParseExpr() {
    TRELLIS_RETURN_IF_ERROR(Deeper());
    const int line = Peek().line;
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseOr());
    while (IsName("if")) {
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP cond, ParseOr());
      NodeP b;
      if (IsName("else")) {
        ++p_;
        TRELLIS_ASSIGN_OR_RETURN(b, ParseOr());
      }
      a = Mk(Node::K::kCond, line, "", {cond, a, b});
    }
    --depth_;
    return a;
  }

  Result<NodeP> ParseOr() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseAnd());
    while (IsName("or")) {
      const int line = Peek().line;
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseAnd());
      a = Mk(Node::K::kOr, line, "", {a, b});
    }
    return a;
  }
  Result<NodeP> ParseAnd() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseNot());
    while (IsName("and")) {
      const int line = Peek().line;
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseNot());
      a = Mk(Node::K::kAnd, line, "", {a, b});
    }
    return a;
  }
  Result<NodeP> ParseNot() {
    if (IsName("not")) {
      const int line = Peek().line;
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Deeper());
      TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseNot());
      --depth_;
      return Mk(Node::K::kNot, line, "", {a});
    }
    return ParseCompare();
  }
  Result<NodeP> ParseCompare() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseMath1());
    for (;;) {
      const int line = Peek().line;
      std::string op;
      if (Peek().kind == Tok::kOp && (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
                                      Peek().text == ">" || Peek().text == "<=" || Peek().text == ">=")) {
        op = Peek().text;
        ++p_;
      } else if (IsName("in")) {
        op = "in";
        ++p_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        p_ += 2;
      } else {
        return a;
      }
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseMath1());
      a = Mk(Node::K::kBinary, line, op, {a, b});
    }
  }
  Result<NodeP> ParseMath1() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const int line = Peek().line;
      const std::string op = t_[p_++].text;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseConcat());
      a = Mk(Node::K::kBinary, line, op, {a, b});
    }
    return a;
  }
  Result<NodeP> ParseConcat() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseMath2());
    while (IsOp("~")) {
      const int line = Peek().line;
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseMath2());
      a = Mk(Node::K::kBinary, line, "~", {a, b});
    }
    return a;
  }
  Result<NodeP> ParseMath2() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const int line = Peek().line;
      const std::string op = t_[p_++].text;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParsePow());
      a = Mk(Node::K::kBinary, line, op, {a, b});
    }
    return a;
  }
  Result<NodeP> ParsePow() {
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseUnary());
    while (IsOp("**")) {
      const int line = Peek().line;
      ++p_;
      TRELLIS_RETURN_IF_ERROR(Link());
      TRELLIS_ASSIGN_OR_RETURN(NodeP b, ParseUnary());
      a = Mk(Node::K::kBinary, line, "**", {a, b});
    }
    return a;
  }
  Result<NodeP> ParseUnary() {
    if (IsOp("-") || IsOp("+")) {
      const int line = Peek().line;
      const std::string op = t_[p_++].text;
      TRELLIS_RETURN_IF_ERROR(Deeper());
      TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParseUnary());
      --depth_;
      return Mk(Node::K::kUnary, line, op, {a});
    }
    TRELLIS_ASSIGN_OR_RETURN(NodeP a, ParsePrimary());
    return ParsePostfix(a);
  }

  Status ParseArgs(Node* call) {
    // '(' already consumed.
    while (!IsOp(")")) {
      if (Peek().kind == Tok::kName && IsOp("=", 1)) {
        call->names2.push_back(t_[p_].text);
        p_ += 2;
        TRELLIS_ASSIGN_OR_RETURN(NodeP v, ParseExpr());
        call->kw.push_back(v);
      } else {
        if (!call->kw.empty()) return SyntaxError(Peek().line, "positional argument after a keyword argument");
        TRELLIS_ASSIGN_OR_RETURN(NodeP v, ParseExpr());
        call->kids.push_back(v);
      }
      if (!IsOp(",")) break;
      ++p_;
    }
    return Expect(")");
  }

  Result<NodeP> ParsePostfix(NodeP a) {
    for (;;) {
      const int line = Peek().line;
      if (IsOp(".") || IsOp("[") || IsOp("(") || IsOp("|") || IsName("is")) TRELLIS_RETURN_IF_ERROR(Link());
      if (IsOp(".")) {
        ++p_;
        if (Peek().kind == Tok::kInt) {
          auto idx = Mk(Node::K::kLiteral, line);
          std::const_pointer_cast<Node>(idx)->value = Value::Int(t_[p_++].i);
          a = Mk(Node::K::kItem, line, "", {a, idx});
          continue;
        }
        TRELLIS_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        a = Mk(Node::K::kAttr, line, attr, {a});
      } else if (IsOp("[")) {
        ++p_;
        NodeP parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            TRELLIS_ASSIGN_OR_RETURN(parts[k], ParseExpr());
          }
          if (IsOp(":") && k < 2) {
            slice = true;
            ++p_;
          } else {
            break;
          }
        }
        TRELLIS_RETURN_IF_ERROR(Expect("]"));
        if (slice) {
          a = Mk(Node::K::kSlice, line, "", {a, parts[0], parts[1], parts[2]});
        } else {
          if (!parts[0]) return SyntaxError(line, "empty subscript");
          a = Mk(Node::K::kItem, line, "", {a, parts[0]});
        }
      } else if (IsOp("(")) {
        ++p_;
        auto call = std::make_shared<Node>(*Mk(Node::K::kCall, line, "", {a}));
        TRELLIS_RETURN_IF_ERROR(ParseArgs(call.get()));
        a = call;
      } else if (IsOp("|")) {
        ++p_;
        TRELLIS_ASSIGN_OR_RETURN(std::string f, ExpectName());
        if (!KnownFilters().count(f)) return SyntaxError(line, fmt::format("unsupported filter '{}'", f));
        auto n = std::make_shared<Node>(*Mk(Node::K::kFilter, line, f, {a}));
        if (IsOp("(")) {
          ++p_;
          TRELLIS_RETURN_IF_ERROR(ParseArgs(n.get()));
        }
        a = n;
      } else if (IsName("is")) {
        ++p_;
        bool neg = false;
        if (IsName("not")) {
          neg = true;
          ++p_;
        }
        std::string test;
        if (Peek().kind == Tok::kName) {
          test = t_[p_++].text;
        } else if (IsOp("==") || IsOp("!=")) {
          test = t_[p_++].text;
        } else {
          return SyntaxError(line, "expected a test name after 'is'");
        }
        if (!KnownTests().count(test)) return SyntaxError(line, fmt::format("unsupported test '{}'", test));
        auto n = std::make_shared<Node>(*Mk(Node::K::kTest, line, test, {a}));
        n->flag = neg;
        if (IsOp("(")) {
          ++p_;
          TRELLIS_RETURN_IF_ERROR(ParseArgs(n.get()));
        } else if (Peek().kind == Tok::kString || Peek().kind == Tok::kInt || Peek().kind == Tok::kFloat ||
                   (Peek().kind == Tok::kName && !IsName("and") && !IsName("or") && !IsName("else") &&
                    !IsName("if") && !IsName("in") && !IsName("not") && !IsName("is"))) {
          TRELLIS_ASSIGN_OR_RETURN(NodeP arg, ParsePrimary());  // `is divisibleby 3`, `is sameas none`
          n->kids.push_back(arg);
        }
        a = n;
      } else {
        return a;
      }
    }
  }

  Result<NodeP> ParsePrimary() {
    const Token& tok = Peek();
    const int line = tok.line;
    auto lit = [&](Value v) {
      auto n = std::make_shared<Node>();
      n->k = Node::K::kLiteral;
      n->line = line;
      n->value = std::move(v);
      return NodeP(n);
    };
    switch (tok.kind) {
      case Tok::kString: {
        std::string s = t_[p_++].text;
        while (Peek().kind == Tok::kString) s += t_[p_++].text;  // adjacent literals concatenate
        return lit(Value::Str(s));
      }
      case Tok::kInt: ++p_; return lit(Value::Int(tok.i));
      case Tok::kFloat: ++p_; return lit(Value::Float(tok.f));
      case Tok::kName: {
        const std::string n = t_[p_++].text;
        if (n == "true" || n == "True") return lit(Value::Bool(true));
        if (n == "false" || n == "False") return lit(Value::Bool(false));
        if (n == "none" || n == "None") return lit(Value::None());
        return Mk(Node::K::kName, line, n);
      }
      case Tok::kOp: {
        TRELLIS_RETURN_IF_ERROR(Deeper());
        if (tok.text == "(") {
          ++p_;
          if (IsOp(")")) {
            ++p_;
            --depth_;
            return Mk(Node::K::kTuple, line);
          }
          TRELLIS_ASSIGN_OR_RETURN(NodeP e, ParseExpr());
          if (IsOp(",")) {
            std::vector<NodeP> items = {e};
            while (IsOp(",")) {
              ++p_;
              if (IsOp(")")) break;
              TRELLIS_ASSIGN_OR_RETURN(NodeP x, ParseExpr());
              items.push_back(x);
            }
            e = Mk(Node::K::kTuple, line, "", items);
          }
          TRELLIS_RETURN_IF_ERROR(Expect(")"));
          --depth_;
          return e;
        }
        if (tok.text == "[") {
          ++p_;
          std::vector<NodeP> items;
          while (!IsOp("]")) {
            TRELLIS_ASSIGN_OR_RETURN(NodeP x, ParseExpr());
            items.push_back(x);
            if (!IsOp(",")) break;
            ++p_;
          }
          TRELLIS_RETURN_IF_ERROR(Expect("]"));
          --depth_;
          return Mk(Node::K::kList, line, "", items);
        }
        if (tok.text == "{") {
          ++p_;
          std::vector<NodeP> items;  // key, value, key, value ...
          while (!IsOp("}")) {
            TRELLIS_ASSIGN_OR_RETURN(NodeP k, ParseExpr());
            TRELLIS_RETURN_IF_ERROR(Expect(":"));
            TRELLIS_ASSIGN_OR_RETURN(NodeP v, ParseExpr());
            items.push_back(k);
            items.push_back(v);
            if (!IsOp(",")) break;
            ++p_;
          }
          TRELLIS_RETURN_IF_ERROR(Expect("}"));
          --depth_;
          return Mk(Node::K::kDict, line, "", items);
        }
        break;
      }
      default: break;
    }
    return SyntaxError(line, fmt::format("unexpected {}", Describe(tok)));
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int64_t depth_guard_ = 0;
  int links_ = 0;   // Link() calls in the current tag
  int blocks_ = 0;  // statements open around the current one
};

}  // namespace

Result<NodeP> ParseTokens(std::vector<Token> tokens) {
  Parser parser(std::move(tokens));
  return parser.ParseTemplate();
}

}  // namespace trellis::jinja

// The renderer (runtime.h): the builtins, statements, expressions, calls and operators.
#include "jinja/runtime.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <memory>

#include <fmt/core.h>

#include "jinja/value_internal.h"

namespace trellis::jinja {

Renderer::Renderer(const Value& globals) {
  scopes_.push_back({});
  Builtins();
  if (globals.kind() == Kind::kDict) {
    for (const auto& [k, v] : globals.dict()) scopes_.back()[k] = v;
  }
}

Status Renderer::Run(const Node& root, std::vector<Piece>* out) {
  out_ = out;
  Flow f;
  return Exec(root, &f);
}

Status Renderer::Err(const Node& n, const std::string& what) const {
  return InvalidArgument(fmt::format("chat template line {}: {}", n.line, what));
}

void Renderer::Emit(const Value& v) {
  if (v.kind() == Kind::kString) {
    for (const Piece& p : v.pieces()) EmitPiece(p.text, p.input);
  } else {
    EmitPiece(ToText(v), false);
  }
}

void Renderer::EmitPiece(const std::string& s, bool input) {
  if (s.empty()) return;
  out_bytes_ += s.size();
  if (!out_->empty() && out_->back().input == input) {
    out_->back().text += s;
  } else {
    out_->push_back({s, input});
  }
}

const Value* Renderer::Lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return &f->second;
  }
  return nullptr;
}

Value Renderer::Fn(std::function<Result<Value>(Args&, Kwargs&)> f) {
  auto c = std::make_shared<Value::Callable>();
  c->fn = std::move(f);
  return Value::MakeCallable(c);
}

void Renderer::Builtins() {
  Scope& g = scopes_.back();
  g["range"] = Fn([](Args& a, Kwargs&) -> Result<Value> {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a) {
      if (v.kind() != Kind::kInt) return InvalidArgument("range() takes integers");
    }
    if (a.size() == 1) {
      stop = a[0].i();
    } else if (a.size() >= 2) {
      start = a[0].i();
      stop = a[1].i();
      if (a.size() >= 3) step = a[2].i();
    } else {
      return InvalidArgument("range() needs an argument");
    }
    if (step == 0) return InvalidArgument("range() step must not be zero");
    ValueList l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (l.size() >= static_cast<size_t>(Template::kMaxLoopIterations)) return InvalidArgument("range() too long");
      l.push_back(Value::Int(i));
    }
    return Value::List(std::move(l));
  });
  g["namespace"] = Fn([](Args& a, Kwargs& kw) -> Result<Value> {
    Value d = Value::Dict();
    if (!a.empty() && a[0].kind() == Kind::kDict) {
      for (const auto& [k, v] : a[0].dict()) d.Set(k, v);
    }
    for (auto& [k, v] : kw) d.Set(k, v);
    return d;
  });
  g["dict"] = g["namespace"];
  g["raise_exception"] = Fn([](Args& a, Kwargs&) -> Result<Value> {
    return InvalidArgument(fmt::format("the template raised: {}", a.empty() ? std::string() : ToText(a[0])));
  });
  g["strftime_now"] = Fn([](Args& a, Kwargs&) -> Result<Value> {
    if (a.empty() || a[0].kind() != Kind::kString) return InvalidArgument("strftime_now() takes a format string");
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, a[0].text().c_str(), &tm);
    return Value::Str(std::string(buf, n));
  });
}

// ---- statements ----

Status Renderer::Exec(const Node& n, Flow* flow) {
  *flow = Flow::kNormal;
  if (out_bytes_ > Template::kMaxOutputBytes) return Err(n, "output too large");
  switch (n.k) {
    case Node::K::kBody:
      for (const NodeP& s : n.kids) {
        TRELLIS_RETURN_IF_ERROR(Exec(*s, flow));
        if (*flow != Flow::kNormal) return Status::Ok();
      }
      return Status::Ok();
    case Node::K::kText: EmitPiece(n.name, false); return Status::Ok();
    case Node::K::kOutput: {
      TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      Emit(v);
      return Status::Ok();
    }
    case Node::K::kIf: {
      size_t i = 0;
      for (; i + 1 < n.kids.size(); i += 2) {
        TRELLIS_ASSIGN_OR_RETURN(Value c, Eval(*n.kids[i]));
        if (Truthy(c)) return Exec(*n.kids[i + 1], flow);
      }
      if (n.flag) return Exec(*n.kids.back(), flow);
      return Status::Ok();
    }
    case Node::K::kFor: return ExecFor(n, flow);
    case Node::K::kSet: {
      TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      if (n.names.size() == 1) {
        scopes_.back()[n.names[0]] = v;
        return Status::Ok();
      }
      if (v.kind() != Kind::kList || v.list().size() != n.names.size()) return Err(n, "cannot unpack the value in {% set %}");
      for (size_t i = 0; i < n.names.size(); ++i) scopes_.back()[n.names[i]] = v.list()[i];
      return Status::Ok();
    }
    case Node::K::kSetAttr: {
      const Value* ns = Lookup(n.names[0]);
      if (!ns || ns->kind() != Kind::kDict) return Err(n, fmt::format("'{}' is not a namespace", n.names[0]));
      TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      ns->Set(n.name, v);
      return Status::Ok();
    }
    case Node::K::kSetBlock: {
      TRELLIS_ASSIGN_OR_RETURN(Value v, Capture(*n.kids[0]));
      scopes_.back()[n.name] = v;
      return Status::Ok();
    }
    case Node::K::kMacro: scopes_.back()[n.name] = MakeMacro(n); return Status::Ok();
    case Node::K::kCallBlock: {
      // The body becomes `caller()` inside the macro.
      const Node* body = n.kids[1].get();
      scopes_.push_back({});
      scopes_.back()["caller"] = Fn([this, body](Args&, Kwargs&) -> Result<Value> { return Capture(*body); });
      Result<Value> v = Eval(*n.kids[0]);
      scopes_.pop_back();
      if (!v.ok()) return v.status();
      Emit(*v);
      return Status::Ok();
    }
    case Node::K::kBreak: *flow = Flow::kBreak; return Status::Ok();
    case Node::K::kContinue: *flow = Flow::kContinue; return Status::Ok();
    default: return Err(n, "not a statement");
  }
}

// Renders a body into a string value (pieces kept).
Result<Value> Renderer::Capture(const Node& body) {
  std::vector<Piece> saved;
  std::swap(saved, *out_);
  Flow f;
  Status s = Exec(body, &f);
  std::vector<Piece> got;
  std::swap(got, *out_);
  std::swap(saved, *out_);
  if (!s.ok()) return s;
  return Value::Pieces(std::move(got));
}

Value Renderer::MakeMacro(const Node& n) {
  const Node* def = &n;
  return Fn([this, def](Args& a, Kwargs& kw) -> Result<Value> {
    if (++call_depth_ > 64) {
      --call_depth_;
      return InvalidArgument(fmt::format("chat template line {}: macro recursion too deep", def->line));
    }
    Scope s;
    for (size_t i = 0; i < def->names.size(); ++i) {
      Value v;
      if (i < a.size()) {
        v = a[i];
      } else if (def->kw[i]) {
        auto d = Eval(*def->kw[i]);
        if (!d.ok()) {
          --call_depth_;
          return d.status();
        }
        v = *d;
      }
      s[def->names[i]] = v;
    }
    for (auto& [k, v] : kw) s[k] = v;
    if (const Value* caller = Lookup("caller")) s["caller"] = *caller;
    // A macro sees the globals and its arguments, not the caller's locals.
    std::vector<Scope> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());
    scopes_.push_back(std::move(s));
    Result<Value> r = Capture(*def->kids[0]);
    scopes_.swap(saved);
    --call_depth_;
    return r;
  });
}

Result<ValueList> Renderer::Iterate(const Node& at, const Value& v) {
  switch (v.kind()) {
    case Kind::kList: return v.list();
    case Kind::kDict: {
      ValueList keys;
      for (const auto& [k, x] : v.dict()) keys.push_back(Value::Str(k));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      const std::string s = v.text();
      for (size_t i = 0; i < s.size();) {
        size_t len = 1;
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0xF0) len = 4;
        else if (c >= 0xE0) len = 3;
        else if (c >= 0xC0) len = 2;
        chars.push_back(Value::Str(s.substr(i, len), AnyInput(v)));
        i += len;
      }
      return chars;
    }
    case Kind::kUndefined:
    case Kind::kNone: return ValueList{};
    default: return Err(at, "value is not iterable");
  }
}

Status Renderer::ExecFor(const Node& n, Flow* flow) {
  TRELLIS_ASSIGN_OR_RETURN(Value seq, Eval(*n.kids[0]));
  TRELLIS_ASSIGN_OR_RETURN(ValueList all, Iterate(n, seq));
  auto bind = [&](Scope& s, const Value& item) -> Status {
    if (n.names.size() == 1) {
      s[n.names[0]] = item;
      return Status::Ok();
    }
    if (item.kind() != Kind::kList || item.list().size() != n.names.size()) return Err(n, "cannot unpack a loop item");
    for (size_t i = 0; i < n.names.size(); ++i) s[n.names[i]] = item.list()[i];
    return Status::Ok();
  };
  // The loop filter runs before loop.* is known (as in jinja2).
  ValueList items;
  if (n.kids[1]) {
    for (const Value& item : all) {
      scopes_.push_back({});
      Status st = bind(scopes_.back(), item);
      Result<Value> keep = st.ok() ? Eval(*n.kids[1]) : Result<Value>(st);
      scopes_.pop_back();
      if (!keep.ok()) return keep.status();
      if (Truthy(*keep)) items.push_back(item);
    }
  } else {
    items = std::move(all);
  }
  if (static_cast<int64_t>(items.size()) > Template::kMaxLoopIterations) return Err(n, "loop too long");
  const int64_t len = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < len; ++i) {
    if ((iterations_ += 1) > Template::kMaxLoopIterations) return Err(n, "too many loop iterations");
    scopes_.push_back({});
    Scope& s = scopes_.back();
    TRELLIS_RETURN_IF_ERROR(bind(s, items[static_cast<size_t>(i)]));
    Value loop = Value::Dict();
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(len - i));
    loop.Set("revindex0", Value::Int(len - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == len - 1));
    loop.Set("length", Value::Int(len));
    loop.Set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
    loop.Set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value());
    s["loop"] = loop;
    Status st = Exec(*n.kids[2], flow);
    scopes_.pop_back();
    TRELLIS_RETURN_IF_ERROR(st);
    if (*flow == Flow::kBreak) break;
  }
  *flow = Flow::kNormal;
  if (len == 0 && n.flag) return Exec(*n.kids[3], flow);
  return Status::Ok();
}

// ---- expressions ----

Result<Value> Renderer::Eval(const Node& n) {
  if (++eval_depth_ > Template::kMaxDepth * 4) {
    --eval_depth_;
    return Err(n, "evaluation nested too deeply");
  }
  Result<Value> r = EvalInner(n);
  --eval_depth_;
  return r;
}

Result<Value> Renderer::EvalInner(const Node& n) {
  switch (n.k) {
    case Node::K::kLiteral: return n.value;
    case Node::K::kName: {
      const Value* v = Lookup(n.name);
      return v ? *v : Value();
    }
    case Node::K::kList:
    case Node::K::kTuple: {
      ValueList l;
      for (const NodeP& k : n.kids) {
        TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*k));
        l.push_back(v);
      }
      return Value::List(std::move(l));
    }
    case Node::K::kDict: {
      Value d = Value::Dict();
      for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
        TRELLIS_ASSIGN_OR_RETURN(Value k, Eval(*n.kids[i]));
        TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[i + 1]));
        d.Set(ToText(k), v);
      }
      return d;
    }
    case Node::K::kAttr: {
      TRELLIS_ASSIGN_OR_RETURN(Value o, Eval(*n.kids[0]));
      return GetAttr(o, n.name);
    }
    case Node::K::kItem: {
      TRELLIS_ASSIGN_OR_RETURN(Value o, Eval(*n.kids[0]));
      TRELLIS_ASSIGN_OR_RETURN(Value k, Eval(*n.kids[1]));
      return GetItem(n, o, k);
    }
    case Node::K::kSlice: return EvalSlice(n);
    case Node::K::kCall: return EvalCall(n);
    case Node::K::kFilter: return EvalFilter(n);
    case Node::K::kTest: {
      TRELLIS_ASSIGN_OR_RETURN(bool b, EvalTest(n));
      return Value::Bool(n.flag ? !b : b);
    }
    case Node::K::kNot: {
      TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      return Value::Bool(!Truthy(v));
    }
    case Node::K::kAnd: {
      TRELLIS_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
      if (!Truthy(a)) return a;
      return Eval(*n.kids[1]);
    }
    case Node::K::kOr: {
      TRELLIS_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
      if (Truthy(a)) return a;
      return Eval(*n.kids[1]);
    }
    case Node::K::kCond: {
      TRELLIS_ASSIGN_OR_RETURN(Value c, Eval(*n.kids[0]));
      if (Truthy(c)) return Eval(*n.kids[1]);
      if (n.kids[2]) return Eval(*n.kids[2]);
      return Value();
    }
    case Node::K::kUnary: {
      TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
      if (v.kind() == Kind::kInt) return Value::Int(n.name == "-" ? -v.i() : v.i());
      if (IsNumber(v)) return Value::Float(n.name == "-" ? -AsDouble(v) : AsDouble(v));
      return Err(n, fmt::format("unary '{}' on a non-number", n.name));
    }
    case Node::K::kBinary: return EvalBinary(n);
    default: return Err(n, "not an expression");
  }
}

Result<Value> Renderer::GetAttr(const Value& o, const std::string& name) {
  if (o.kind() == Kind::kDict) {
    if (const Value* v = o.Find(name)) return *v;
  }
  return Value();  // undefined (methods are resolved by EvalCall)
}

Result<Value> Renderer::GetItem(const Node& n, const Value& o, const Value& k) {
  if (o.kind() == Kind::kDict) {
    const Value* v = o.Find(ToText(k));
    return v ? *v : Value();
  }
  if ((o.kind() == Kind::kList || o.kind() == Kind::kString) && k.kind() == Kind::kInt) {
    if (o.kind() == Kind::kString) {
      const std::string s = o.text();
      int64_t i = k.i() < 0 ? k.i() + static_cast<int64_t>(s.size()) : k.i();
      if (i < 0 || i >= static_cast<int64_t>(s.size())) return Value();
      return Value::Str(s.substr(static_cast<size_t>(i), 1), AnyInput(o));
    }
    int64_t i = k.i() < 0 ? k.i() + static_cast<int64_t>(o.list().size()) : k.i();
    if (i < 0 || i >= static_cast<int64_t>(o.list().size())) return Value();
    return o.list()[static_cast<size_t>(i)];
  }
  if (o.is_undefined()) return Err(n, "subscript of an undefined value");
  return Value();
}

Result<Value> Renderer::EvalSlice(const Node& n) {
  TRELLIS_ASSIGN_OR_RETURN(Value o, Eval(*n.kids[0]));
  int64_t parts[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; ++k) {
    if (!n.kids[static_cast<size_t>(k + 1)]) continue;
    TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[static_cast<size_t>(k + 1)]));
    if (v.kind() == Kind::kNone) continue;
    if (v.kind() != Kind::kInt) return Err(n, "slice indices must be integers");
    parts[k] = v.i();
    given[k] = true;
  }
  const int64_t step = parts[2];
  if (step == 0) return Err(n, "slice step cannot be zero");
  std::string s;
  const bool is_str = o.kind() == Kind::kString;
  if (is_str) s = o.text();
  if (!is_str && o.kind() != Kind::kList) return Err(n, "slice of a value that is not a list or string");
  const int64_t len = is_str ? static_cast<int64_t>(s.size()) : static_cast<int64_t>(o.list().size());
  auto norm = [&](int64_t i, bool hi) {
    if (i < 0) i += len;
    if (step > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, hi ? len - 1 : len - 1);
  };
  int64_t start = given[0] ? norm(parts[0], false) : (step > 0 ? 0 : len - 1);
  int64_t stop = given[1] ? norm(parts[1], true) : (step > 0 ? len : -1);
  std::string out_s;
  ValueList out_l;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (is_str) {
      out_s += s[static_cast<size_t>(i)];
    } else {
      out_l.push_back(o.list()[static_cast<size_t>(i)]);
    }
  }
  if (is_str) return Value::Str(out_s, AnyInput(o));
  return Value::List(std::move(out_l));
}

Result<std::pair<Renderer::Args, Renderer::Kwargs>> Renderer::EvalArgs(const Node& n, size_t first) {
  Args a;
  Kwargs kw;
  for (size_t i = first; i < n.kids.size(); ++i) {
    TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[i]));
    a.push_back(v);
  }
  for (size_t i = 0; i < n.kw.size(); ++i) {
    TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kw[i]));
    kw.emplace_back(n.names2[i], v);
  }
  return std::make_pair(std::move(a), std::move(kw));
}

Result<Value> Renderer::EvalCall(const Node& n) {
  const Node& callee = *n.kids[0];
  TRELLIS_ASSIGN_OR_RETURN(auto args, EvalArgs(n, 1));
  if (callee.k == Node::K::kAttr) {
    TRELLIS_ASSIGN_OR_RETURN(Value obj, Eval(*callee.kids[0]));
    if (obj.kind() == Kind::kDict) {
      if (const Value* f = obj.Find(callee.name); f && f->kind() == Kind::kCallable) {
        return Invoke(n, *f, args.first, args.second);
      }
    }
    return CallMethod(n, obj, callee.name, args.first, args.second);
  }
  TRELLIS_ASSIGN_OR_RETURN(Value f, Eval(callee));
  if (f.kind() != Kind::kCallable) {
    return Err(n, fmt::format("'{}' is not callable", callee.k == Node::K::kName ? callee.name : std::string("value")));
  }
  return Invoke(n, f, args.first, args.second);
}

Result<Value> Renderer::Invoke(const Node& n, const Value& f, Args& a, Kwargs& kw) {
  Result<Value> r = f.callable().fn(a, kw);
  if (!r.ok() && r.status().message().rfind("chat template line", 0) != 0) {
    return Err(n, std::string(r.status().message()));
  }
  return r;
}

size_t Renderer::ToTextSize(const Value& v) {
  if (v.kind() != Kind::kString) return v.kind() == Kind::kList || v.kind() == Kind::kDict ? 0 : 32;
  size_t n = 0;
  for (const Piece& p : v.pieces()) n += p.text.size();
  return n;
}

void Renderer::AppendPieces(std::vector<Piece>& out, const Value& v) {
  if (v.kind() == Kind::kString) {
    for (const Piece& p : v.pieces()) {
      if (!out.empty() && out.back().input == p.input) {
        out.back().text += p.text;
      } else {
        out.push_back(p);
      }
    }
  } else {
    const std::string t = ToText(v);
    if (t.empty()) return;
    if (!out.empty() && !out.back().input) {
      out.back().text += t;
    } else {
      out.push_back({t, false});
    }
  }
}

Result<Value> Renderer::EvalBinary(const Node& n) {
  TRELLIS_ASSIGN_OR_RETURN(Value a, Eval(*n.kids[0]));
  TRELLIS_ASSIGN_OR_RETURN(Value b, Eval(*n.kids[1]));
  const std::string& op = n.name;
  if (op == "==") return Value::Bool(Equal(a, b));
  if (op == "!=") return Value::Bool(!Equal(a, b));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.kind() == Kind::kString) {
      found = b.text().find(a.text()) != std::string::npos && a.kind() == Kind::kString;
    } else if (b.kind() == Kind::kList) {
      for (const Value& x : b.list()) found = found || Equal(x, a);
    } else if (b.kind() == Kind::kDict) {
      found = b.Find(ToText(a)) != nullptr;
    } else if (!b.is_undefined() && b.kind() != Kind::kNone) {
      return Err(n, "'in' needs a string, list or dict on its right");
    } else {
      return Err(n, "'in' on an undefined or none value");
    }
    return Value::Bool(op == "in" ? found : !found);
  }
  // Strings and lists built by doubling ({% set s = s ~ s %}) are bounded like the output.
  if ((op == "~" || op == "+") && a.kind() != Kind::kList &&
      ToTextSize(a) + ToTextSize(b) > Template::kMaxOutputBytes) {
    return Err(n, "string too long");
  }
  if (op == "+" && a.kind() == Kind::kList && b.kind() == Kind::kList &&
      a.list().size() + b.list().size() > static_cast<size_t>(Template::kMaxLoopIterations)) {
    return Err(n, "list too long");
  }
  if (op == "~") {
    std::vector<Piece> out;
    AppendPieces(out, a);
    AppendPieces(out, b);
    return Value::Pieces(std::move(out));
  }
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c = 0;
    if (IsNumber(a) && IsNumber(b)) {
      c = AsDouble(a) < AsDouble(b) ? -1 : AsDouble(a) > AsDouble(b) ? 1 : 0;
    } else if (a.kind() == Kind::kString && b.kind() == Kind::kString) {
      c = a.text().compare(b.text());
    } else {
      return Err(n, fmt::format("cannot compare with '{}'", op));
    }
    return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
  }
  if (op == "+") {
    if (a.kind() == Kind::kString && b.kind() == Kind::kString) {
      std::vector<Piece> out;
      AppendPieces(out, a);
      AppendPieces(out, b);
      return Value::Pieces(std::move(out));
    }
    if (a.kind() == Kind::kList && b.kind() == Kind::kList) {
      ValueList l = a.list();
      l.insert(l.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(l));
    }
  }
  if (IsNumber(a) && IsNumber(b)) {
    const bool ints = a.kind() != Kind::kFloat && b.kind() != Kind::kFloat;
    const double x = AsDouble(a), y = AsDouble(b);
    const int64_t xi = a.kind() == Kind::kInt ? a.i() : static_cast<int64_t>(x);
    const int64_t yi = b.kind() == Kind::kInt ? b.i() : static_cast<int64_t>(y);
    if (op == "+") return ints ? Value::Int(xi + yi) : Value::Float(x + y);
    if (op == "-") return ints ? Value::Int(xi - yi) : Value::Float(x - y);
    if (op == "*") return ints ? Value::Int(xi * yi) : Value::Float(x * y);
    if (op == "/") {
      if (y == 0) return Err(n, "division by zero");
      return Value::Float(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) return Err(n, "division by zero");
      if (ints) {
        int64_t q = xi / yi, r = xi % yi;
        if (r != 0 && ((r < 0) != (yi < 0))) {
          --q;
          r += yi;
        }
        return Value::Int(op == "//" ? q : r);
      }
      const double q = std::floor(x / y);
      return Value::Float(op == "//" ? q : x - q * y);
    }
    if (op == "**") return ints && yi >= 0 ? Value::Int(static_cast<int64_t>(std::pow(x, y))) : Value::Float(std::pow(x, y));
  }
  if (op == "*" && ((a.kind() == Kind::kString && b.kind() == Kind::kInt) || (a.kind() == Kind::kInt && b.kind() == Kind::kString))) {
    const Value& s = a.kind() == Kind::kString ? a : b;
    const int64_t times = a.kind() == Kind::kInt ? a.i() : b.i();
    if (times > 0 && static_cast<size_t>(times) * s.text().size() > Template::kMaxOutputBytes) return Err(n, "string too long");
    std::string o;
    for (int64_t i = 0; i < times; ++i) o += s.text();
    return Flat(o, AnyInput(s));
  }
  if (a.is_undefined() || b.is_undefined()) return Err(n, fmt::format("'{}' on an undefined value", op));
  return Err(n, fmt::format("unsupported operand types for '{}'", op));
}

}  // namespace trellis::jinja

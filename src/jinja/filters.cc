// The renderer's filters and tests (runtime.h): x|trim, x|tojson, x|map(...), ... and
// x is defined, x is string, ...
#include "jinja/runtime.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>

#include <fmt/core.h>

#include "jinja/parser.h"
#include "jinja/pystr.h"
#include "jinja/value_internal.h"

namespace trellis::jinja {

Result<bool> Renderer::EvalTest(const Node& n) {
  TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
  TRELLIS_ASSIGN_OR_RETURN(auto args, EvalArgs(n, 1));
  const std::string& t = n.name;
  const Args& a = args.first;
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.kind() == Kind::kNone;
  if (t == "string") return v.kind() == Kind::kString;
  if (t == "number") return v.kind() == Kind::kInt || v.kind() == Kind::kFloat;
  if (t == "integer") return v.kind() == Kind::kInt;
  if (t == "float") return v.kind() == Kind::kFloat;
  if (t == "boolean") return v.kind() == Kind::kBool;
  if (t == "true") return v.kind() == Kind::kBool && v.b();
  if (t == "false") return v.kind() == Kind::kBool && !v.b();
  if (t == "mapping") return v.kind() == Kind::kDict;
  if (t == "iterable") return v.kind() == Kind::kList || v.kind() == Kind::kDict || v.kind() == Kind::kString;
  if (t == "sequence") return v.kind() == Kind::kList || v.kind() == Kind::kString || v.kind() == Kind::kDict;
  if (t == "callable") return v.kind() == Kind::kCallable;
  if (t == "lower") return v.kind() == Kind::kString && PyIsUpper(v.text(), false);
  if (t == "upper") return v.kind() == Kind::kString && PyIsUpper(v.text(), true);
  if (t == "odd" || t == "even") {
    if (v.kind() != Kind::kInt) return Err(n, fmt::format("'{}' test on a non-integer", t));
    return (v.i() % 2 != 0) == (t == "odd");
  }
  if (a.empty()) return Err(n, fmt::format("test '{}' needs an argument", t));
  if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return Equal(v, a[0]);
  if (t == "ne" || t == "!=") return !Equal(v, a[0]);
  if (t == "divisibleby") {
    if (v.kind() != Kind::kInt || a[0].kind() != Kind::kInt || a[0].i() == 0) return Err(n, "divisibleby needs integers");
    return v.i() % a[0].i() == 0;
  }
  if (t == "in") {
    if (a[0].kind() == Kind::kList) {
      for (const Value& x : a[0].list()) {
        if (Equal(x, v)) return true;
      }
      return false;
    }
    if (a[0].kind() == Kind::kString) return a[0].text().find(v.text()) != std::string::npos;
    if (a[0].kind() == Kind::kDict) return a[0].Find(ToText(v)) != nullptr;
    return false;
  }
  if (IsNumber(v) && IsNumber(a[0])) {
    const double x = AsDouble(v), y = AsDouble(a[0]);
    if (t == "gt" || t == "greaterthan") return x > y;
    if (t == "lt" || t == "lessthan") return x < y;
    if (t == "ge") return x >= y;
    if (t == "le") return x <= y;
  }
  return Err(n, fmt::format("test '{}' cannot apply here", t));
}

// Attribute of an item for selectattr/map/sort (dotted paths).
Value Renderer::ItemAttr(const Value& item, const std::string& path) {
  Value cur = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const Value* v = cur.Find(part);
    if (!v) {
      if (cur.kind() == Kind::kList && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
        const size_t i = std::stoul(part);
        if (i < cur.list().size()) {
          cur = cur.list()[i];
        } else {
          return Value();
        }
      } else {
        return Value();
      }
    } else {
      cur = *v;
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

const Value* Renderer::Kw(Kwargs& kw, const char* name) {
  for (auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

Result<Value> Renderer::EvalFilter(const Node& n) {
  TRELLIS_ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
  TRELLIS_ASSIGN_OR_RETURN(auto args, EvalArgs(n, 1));
  Args& a = args.first;
  Kwargs& kw = args.second;
  const std::string& f = n.name;
  const bool in = AnyInput(v);
  if (f == "default" || f == "d") {
    const bool boolean = (a.size() > 1 && Truthy(a[1])) || (Kw(kw, "boolean") && Truthy(*Kw(kw, "boolean")));
    if (v.is_undefined() || (boolean && !Truthy(v))) return a.empty() ? Value::Str("") : a[0];
    return v;
  }
  if (f == "safe" || f == "e" || f == "escape") return v;  // no autoescape in chat templates
  if (f == "tojson") {
    int indent = -1;
    const Value* iv = !a.empty() ? &a[0] : Kw(kw, "indent");
    if (iv && iv->kind() == Kind::kInt) indent = static_cast<int>(std::clamp<int64_t>(iv->i(), 0, 16));
    return Flat(ToJson(v, indent), ContainsInput(v));
  }
  if (f == "string") return v.kind() == Kind::kString ? v : Flat(ToText(v), false);
  if (f == "length" || f == "count") {
    if (v.kind() == Kind::kString) return Value::Int(static_cast<int64_t>(CodepointCount(v.text())));
    if (v.kind() == Kind::kList) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.kind() == Kind::kDict) return Value::Int(static_cast<int64_t>(v.dict().size()));
    if (v.is_undefined()) return Value::Int(0);
    return Err(n, "length of a value without one");
  }
  if (f == "int") {
    if (v.kind() == Kind::kInt) return v;
    if (IsNumber(v)) return Value::Int(static_cast<int64_t>(AsDouble(v)));
    if (v.kind() == Kind::kString) return Value::Int(std::strtoll(v.text().c_str(), nullptr, 10));
    return Value::Int(0);
  }
  if (f == "float") {
    if (IsNumber(v)) return Value::Float(AsDouble(v));
    if (v.kind() == Kind::kString) return Value::Float(std::strtod(v.text().c_str(), nullptr));
    return Value::Float(0);
  }
  if (f == "abs") {
    if (v.kind() == Kind::kInt) return Value::Int(v.i() < 0 ? -v.i() : v.i());
    if (IsNumber(v)) return Value::Float(std::fabs(AsDouble(v)));
    return Err(n, "abs of a non-number");
  }
  if (f == "round") {
    if (!IsNumber(v)) return Err(n, "round of a non-number");
    const int64_t digits = !a.empty() && a[0].kind() == Kind::kInt ? a[0].i() : 0;
    const double p = std::pow(10.0, static_cast<double>(digits));
    return Value::Float(std::nearbyint(AsDouble(v) * p) / p);
  }
  if (v.kind() == Kind::kString) {
    if (f == "trim" || f == "strip") {
      const std::string* chars = nullptr;
      std::string chars_s;
      if (!a.empty() && a[0].kind() == Kind::kString) {
        chars_s = a[0].text();
        chars = &chars_s;
      }
      return StripPieces(v, chars, true, true);
    }
    if (f == "upper") return MapPieces(v, Upper);
    if (f == "lower") return MapPieces(v, Lower);
    if (f == "title") return Flat(JinjaTitle(v.text()), in);
    if (f == "capitalize") return Flat(PyCapitalize(v.text()), in);
    if (f == "replace") {
      if (a.size() < 2 || a[0].kind() != Kind::kString || a[1].kind() != Kind::kString) return Err(n, "replace needs two strings");
      const int64_t count = a.size() > 2 && a[2].kind() == Kind::kInt ? a[2].i() : -1;
      return Flat(Replace(v.text(), a[0].text(), a[1].text(), count), in || AnyInput(a[1]));
    }
    if (f == "wordcount") {
      int64_t c = 0;
      bool word = false;
      for (char ch : v.text()) {
        if (!IsSpace(ch) && !word) ++c;
        word = !IsSpace(ch);
      }
      return Value::Int(c);
    }
    if (f == "indent") {
      const int64_t width = !a.empty() && a[0].kind() == Kind::kInt ? a[0].i() : 4;
      const bool first = (a.size() > 1 && Truthy(a[1])) || (Kw(kw, "first") && Truthy(*Kw(kw, "first")));
      const std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 64)), ' ');
      std::string s = v.text(), o = first ? pad : "";
      for (size_t i = 0; i < s.size(); ++i) {
        o += s[i];
        if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') o += pad;
      }
      return Flat(o, in);
    }
    if (f == "center") return v;
  }
  if (f == "list") {
    TRELLIS_ASSIGN_OR_RETURN(ValueList l, Iterate(n, v));
    return Value::List(std::move(l));
  }
  if (f == "items") {
    if (v.is_undefined()) return Value::List();
    if (v.kind() != Kind::kDict) return Err(n, "items of a non-dict");
    Args none;
    Kwargs nokw;
    return CallMethod(n, v, "items", none, nokw);
  }
  if (f == "dictsort") {
    if (v.kind() != Kind::kDict) return Err(n, "dictsort of a non-dict");
    ValueDict d = v.dict();
    std::stable_sort(d.begin(), d.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    ValueList l;
    for (const auto& [k, x] : d) l.push_back(Value::List({Value::Str(k), x}));
    return Value::List(std::move(l));
  }
  TRELLIS_ASSIGN_OR_RETURN(ValueList items, Iterate(n, v));
  if (f == "first") return items.empty() ? Value() : items.front();
  if (f == "last") return items.empty() ? Value() : items.back();
  if (f == "reverse") {
    if (v.kind() == Kind::kString) {
      std::string s = v.text();
      std::reverse(s.begin(), s.end());
      return Flat(s, in);
    }
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (f == "join") {
    const Value* attr = Kw(kw, "attribute");
    std::vector<Piece> out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i && !a.empty()) AppendPieces(out, a[0]);
      AppendPieces(out, attr ? ItemAttr(items[i], attr->text()) : items[i]);
    }
    return Value::Pieces(std::move(out));
  }
  if (f == "unique") {
    ValueList u;
    for (const Value& x : items) {
      if (std::none_of(u.begin(), u.end(), [&](const Value& y) { return Equal(x, y); })) u.push_back(x);
    }
    return Value::List(std::move(u));
  }
  if (f == "sort") {
    const Value* attr = Kw(kw, "attribute");
    const bool rev = (!a.empty() && Truthy(a[0])) || (Kw(kw, "reverse") && Truthy(*Kw(kw, "reverse")));
    auto key = [&](const Value& x) { return attr ? ItemAttr(x, attr->text()) : x; };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = key(x), ky = key(y);
      const bool lt = IsNumber(kx) && IsNumber(ky) ? AsDouble(kx) < AsDouble(ky) : ToText(kx) < ToText(ky);
      const bool gt = IsNumber(kx) && IsNumber(ky) ? AsDouble(kx) > AsDouble(ky) : ToText(kx) > ToText(ky);
      return rev ? gt : lt;
    });
    return Value::List(std::move(items));
  }
  if (f == "sum" || f == "min" || f == "max") {
    if (items.empty()) return f == "sum" ? Value::Int(0) : Value();
    Value acc = items[0];
    for (size_t i = 1; i < items.size(); ++i) {
      if (!IsNumber(items[i]) || !IsNumber(acc)) return Err(n, fmt::format("{} of non-numbers", f));
      const double x = AsDouble(acc), y = AsDouble(items[i]);
      if (f == "sum") {
        acc = acc.kind() == Kind::kInt && items[i].kind() == Kind::kInt ? Value::Int(acc.i() + items[i].i()) : Value::Float(x + y);
      } else if ((f == "min") == (y < x)) {
        acc = items[i];
      }
    }
    return acc;
  }
  if (f == "batch") {
    if (a.empty() || a[0].kind() != Kind::kInt || a[0].i() <= 0) return Err(n, "batch needs a positive size");
    ValueList out;
    for (size_t i = 0; i < items.size(); i += static_cast<size_t>(a[0].i())) {
      ValueList b(items.begin() + static_cast<ptrdiff_t>(i),
                  items.begin() + static_cast<ptrdiff_t>(std::min(items.size(), i + static_cast<size_t>(a[0].i()))));
      out.push_back(Value::List(std::move(b)));
    }
    return Value::List(std::move(out));
  }
  if (f == "map") {
    const Value* attr = Kw(kw, "attribute");
    ValueList out;
    for (const Value& x : items) {
      if (attr) {
        Value r = ItemAttr(x, attr->text());
        if (r.is_undefined() && Kw(kw, "default")) r = *Kw(kw, "default");
        out.push_back(r);
      } else if (!a.empty() && a[0].kind() == Kind::kString) {
        // map('filter'): the filters that take no argument.
        Node call = n;
        call.name = a[0].text();
        if (!KnownFilters().count(call.name)) return Err(n, fmt::format("unsupported filter '{}'", call.name));
        auto lit = std::make_shared<Node>();
        lit->k = Node::K::kLiteral;
        lit->line = n.line;
        lit->value = x;
        call.kids = {lit};
        call.kw.clear();
        call.names2.clear();
        TRELLIS_ASSIGN_OR_RETURN(Value r, EvalFilter(call));
        out.push_back(r);
      } else {
        return Err(n, "map needs attribute= or a filter name");
      }
    }
    return Value::List(std::move(out));
  }
  if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
    const bool by_attr = f == "selectattr" || f == "rejectattr";
    const bool keep_true = f == "selectattr" || f == "select";
    if (by_attr && (a.empty() || a[0].kind() != Kind::kString)) return Err(n, fmt::format("{} needs an attribute name", f));
    const size_t ti = by_attr ? 1 : 0;
    ValueList out;
    for (const Value& x : items) {
      const Value subject = by_attr ? ItemAttr(x, a[0].text()) : x;
      bool r = Truthy(subject);
      if (a.size() > ti) {
        if (a[ti].kind() != Kind::kString) return Err(n, "test name must be a string");
        auto test = std::make_shared<Node>();
        test->k = Node::K::kTest;
        test->line = n.line;
        test->name = a[ti].text();
        if (!KnownTests().count(test->name)) return Err(n, fmt::format("unsupported test '{}'", test->name));
        auto lit = std::make_shared<Node>();
        lit->k = Node::K::kLiteral;
        lit->line = n.line;
        lit->value = subject;
        test->kids.push_back(lit);
        for (size_t k = ti + 1; k < a.size(); ++k) {
          auto al = std::make_shared<Node>();
          al->k = Node::K::kLiteral;
          al->line = n.line;
          al->value = a[k];
          test->kids.push_back(al);
        }
        TRELLIS_ASSIGN_OR_RETURN(r, EvalTest(*test));
      }
      if (r == keep_true) out.push_back(x);
    }
    return Value::List(std::move(out));
  }
  if (f == "pprint") return Flat(PyRepr(v, false), ContainsInput(v));
  return Err(n, fmt::format("filter '{}' cannot apply to this value", f));
}

size_t Renderer::CodepointCount(const std::string& s) {
  size_t c = 0;
  for (unsigned char ch : s) c += (ch & 0xC0) != 0x80;
  return c;
}

bool Renderer::ContainsInput(const Value& v) {
  switch (v.kind()) {
    case Kind::kString: return AnyInput(v);
    case Kind::kList: return std::any_of(v.list().begin(), v.list().end(), ContainsInput);
    case Kind::kDict:
      return std::any_of(v.dict().begin(), v.dict().end(), [](const auto& kv) { return ContainsInput(kv.second); });
    default: return false;
  }
}

}  // namespace trellis::jinja

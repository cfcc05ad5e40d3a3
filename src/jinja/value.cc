// Values (jinja.h, value_internal.h): constructors and accessors, Python's str() and repr()
// of a value, truthiness and equality, and JSON as json.dumps writes it (tojson).
#include "jinja/value_internal.h"

#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/core.h>

namespace trellis::jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s, bool input) {
  std::vector<Piece> p;
  if (!s.empty()) p.push_back({std::move(s), input});
  return Pieces(std::move(p));
}
Value Value::Pieces(std::vector<Piece> p) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::make_shared<std::vector<Piece>>(std::move(p));
  return v;
}
Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}
Value Value::MakeCallable(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}
std::string Value::text() const {
  std::string s;
  if (kind_ == Kind::kString) {
    for (const Piece& p : *str_) s += p.text;
  }
  return s;
}
const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}
void Value::Set(const std::string& key, Value v) const {
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

namespace {

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == std::floor(f) && std::fabs(f) < 1e16) return fmt::format("{:.1f}", f);
  return fmt::format("{}", f);  // shortest round-trip, as Python's repr
}

std::string PyQuote(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string o(1, q);
  for (char c : s) {
    if (c == q || c == '\\') o += '\\';
    if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == '\r') o += "\\r";
    else o += c;
  }
  return o + q;
}

void JsonString(const std::string& s, std::string& o) {
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) {
          o += fmt::format("\\u{:04x}", c);
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  o += '"';
}

void JsonInto(const Value& v, int indent, int level, std::string& o) {
  auto newline = [&](int lv) {
    o += '\n';
    o.append(static_cast<size_t>(indent * lv), ' ');
  };
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: o += "null"; return;
    case Kind::kBool: o += v.b() ? "true" : "false"; return;
    case Kind::kInt: o += std::to_string(v.i()); return;
    case Kind::kFloat: o += std::isfinite(v.f()) ? FormatFloat(v.f()) : (std::isnan(v.f()) ? "NaN" : (v.f() > 0 ? "Infinity" : "-Infinity")); return;
    case Kind::kString: JsonString(v.text(), o); return;
    case Kind::kList: {
      if (v.list().empty()) {
        o += "[]";
        return;
      }
      o += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) o += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        JsonInto(v.list()[i], indent, level + 1, o);
      }
      if (indent >= 0) newline(level);
      o += ']';
      return;
    }
    case Kind::kDict: {
      if (v.dict().empty()) {
        o += "{}";
        return;
      }
      o += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict()) {
        if (!first) o += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        JsonString(k, o);
        o += ": ";
        JsonInto(x, indent, level + 1, o);
      }
      if (indent >= 0) newline(level);
      o += '}';
      return;
    }
    case Kind::kCallable: o += "null"; return;
  }
}

}  // namespace

bool AnyInput(const Value& v) {
  if (v.kind() != Kind::kString) return false;
  for (const Piece& p : v.pieces()) {
    if (p.input) return true;
  }
  return false;
}

// One piece, input if any of v's was.
Value Flat(const std::string& s, bool input) { return Value::Str(s, input); }

// str(v) as Python prints it in {{ }}.
std::string ToText(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b() ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i());
    case Kind::kFloat: return FormatFloat(v.f());
    case Kind::kString: return v.text();
    default: return PyRepr(v, true);
  }
}

std::string PyRepr(const Value& v, bool top) {
  switch (v.kind()) {
    case Kind::kString: return top ? v.text() : PyQuote(v.text());
    case Kind::kList: {
      std::string s = "[";
      for (size_t i = 0; i < v.list().size(); ++i) s += (i ? ", " : "") + PyRepr(v.list()[i], false);
      return s + "]";
    }
    case Kind::kDict: {
      std::string s = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict()) {
        s += (first ? "" : ", ") + PyQuote(k) + ": " + PyRepr(x, false);
        first = false;
      }
      return s + "}";
    }
    case Kind::kCallable: return "<function>";
    default: return ToText(v);
  }
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b();
    case Kind::kInt: return v.i() != 0;
    case Kind::kFloat: return v.f() != 0;
    case Kind::kString: return !v.text().empty();
    case Kind::kList: return !v.list().empty();
    case Kind::kDict: return !v.dict().empty();
    case Kind::kCallable: return true;
  }
  return false;
}

bool IsNumber(const Value& v) { return v.kind() == Kind::kInt || v.kind() == Kind::kFloat || v.kind() == Kind::kBool; }
double AsDouble(const Value& v) {
  return v.kind() == Kind::kFloat ? v.f() : v.kind() == Kind::kBool ? (v.b() ? 1 : 0) : static_cast<double>(v.i());
}

bool Equal(const Value& a, const Value& b) {
  if (IsNumber(a) && IsNumber(b)) return AsDouble(a) == AsDouble(b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.text() == b.text();
    case Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, x] : a.dict()) {
        const Value* y = b.Find(k);
        if (!y || !Equal(x, *y)) return false;
      }
      return true;
    }
    default: return false;
  }
}

std::string ToJson(const Value& v, int indent) {
  std::string o;
  JsonInto(v, indent, 0, o);
  return o;
}

}  // namespace trellis::jinja

// The renderer's str / dict / list methods (runtime.h): what a template calls on a value,
// s.strip(), s.split(), d.items(), d.get(), l.append(), ..., and the string helpers the
// filters share.
#include "jinja/runtime.h"

#include <fmt/core.h>

#include "jinja/pystr.h"
#include "jinja/value_internal.h"

namespace trellis::jinja {

// Python's str.strip / lstrip / rstrip: whitespace by str.isspace(), or the code points
// of `chars`.
void Renderer::StripRange(std::string_view s, const std::string* chars, bool left, bool right, size_t& b, size_t& e) {
  auto strip = [&](uint32_t cp) { return chars ? HasCodePoint(*chars, cp) : IsPySpace(cp); };
  if (left) {
    while (b < e) {
      uint32_t cp;
      const size_t len = CodePointAt(s, b, &cp);
      if (b + len > e || !strip(cp)) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      uint32_t cp;
      const size_t len = CodePointBefore(s, e, &cp);
      if (e - len < b || !strip(cp)) break;
      e -= len;
    }
  }
}

std::string Renderer::StripChars(const std::string& s, const std::string* chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  StripRange(s, chars, left, right, b, e);
  return s.substr(b, e - b);
}

// Strip over pieces: trims the ends, keeping the pieces apart.
Value Renderer::StripPieces(const Value& v, const std::string* chars, bool left, bool right) {
  std::vector<Piece> p = v.pieces();
  if (left) {
    while (!p.empty()) {
      std::string& t = p.front().text;
      size_t b = 0, e = t.size();
      StripRange(t, chars, true, false, b, e);
      t.erase(0, b);
      if (!t.empty()) break;
      p.erase(p.begin());
    }
  }
  if (right) {
    while (!p.empty()) {
      std::string& t = p.back().text;
      size_t b = 0, e = t.size();
      StripRange(t, chars, false, true, b, e);
      t.resize(e);
      if (!t.empty()) break;
      p.pop_back();
    }
  }
  return Value::Pieces(std::move(p));
}

Value Renderer::MapPieces(const Value& v, const std::function<std::string(const std::string&)>& f) {
  std::vector<Piece> p = v.pieces();
  for (Piece& x : p) x.text = f(x.text);
  return Value::Pieces(std::move(p));
}

std::string Renderer::Upper(const std::string& s) { return PyUpper(s); }
std::string Renderer::Lower(const std::string& s) { return PyLower(s); }

// Stops growing past the output limit (the caller's result is then cut short, and the
// render fails on the output bound when it is written).
std::string Renderer::Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string o;
  size_t pos = 0;
  int64_t done = 0;
  for (;;) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos || (count >= 0 && done >= count) || o.size() > Template::kMaxOutputBytes) break;
    o += s.substr(pos, f - pos) + to;
    pos = f + from.size();
    ++done;
  }
  return o + s.substr(pos);
}

Result<Value> Renderer::CallMethod(const Node& n, const Value& o, const std::string& m, Args& a, Kwargs& kw) {
  std::string arg_text[2];
  auto arg_str = [&](size_t i) -> const std::string* {
    if (i >= a.size() || i >= 2 || a[i].kind() != Kind::kString) return nullptr;
    arg_text[i] = a[i].text();
    return &arg_text[i];
  };
  if (o.kind() == Kind::kString) {
    const std::string s = o.text();
    const bool in = AnyInput(o);
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      return StripPieces(o, arg_str(0), m != "rstrip", m != "lstrip");
    }
    if (m == "upper") return MapPieces(o, Upper);
    if (m == "lower") return MapPieces(o, Lower);
    if (m == "title") return Flat(PyTitle(s), in);
    if (m == "capitalize") return Flat(PyCapitalize(s), in);
    if (m == "startswith" || m == "endswith") {
      std::vector<std::string> cands;
      if (!a.empty() && a[0].kind() == Kind::kList) {
        for (const Value& x : a[0].list()) cands.push_back(x.text());
      } else if (const std::string* p = arg_str(0)) {
        cands.push_back(*p);
      } else {
        return Err(n, fmt::format("{}() takes a string", m));
      }
      for (const std::string& c : cands) {
        if (m == "startswith" ? s.rfind(c, 0) == 0 : (s.size() >= c.size() && s.compare(s.size() - c.size(), c.size(), c) == 0)) {
          return Value::Bool(true);
        }
      }
      return Value::Bool(false);
    }
    if (m == "replace") {
      const std::string* from = arg_str(0);
      const std::string* to = arg_str(1);
      if (!from || !to) return Err(n, "replace() takes two strings");
      const int64_t count = a.size() > 2 && a[2].kind() == Kind::kInt ? a[2].i() : -1;
      return Flat(Replace(s, *from, *to, count), in || AnyInput(a[1]));
    }
    if (m == "split" || m == "rsplit") {
      ValueList parts;
      const std::string* sep = arg_str(0);
      int64_t maxsplit = a.size() > 1 && a[1].kind() == Kind::kInt ? a[1].i() : -1;
      for (auto& [k, v] : kw) {
        if (k == "maxsplit" && v.kind() == Kind::kInt) maxsplit = v.i();
      }
      if (sep && sep->empty()) return Err(n, "split() separator is empty");
      if (sep) {
        size_t pos = 0;
        int64_t done = 0;
        for (;;) {
          const size_t f = s.find(*sep, pos);
          if (f == std::string::npos || (maxsplit >= 0 && done >= maxsplit)) break;
          parts.push_back(Flat(s.substr(pos, f - pos), in));
          pos = f + sep->size();
          ++done;
        }
        parts.push_back(Flat(s.substr(pos), in));
      } else {
        size_t i = 0;
        int64_t done = 0;
        // Python's str.split(): runs of str.isspace() separate; past maxsplit the rest
        // is kept as it is, trailing whitespace included.
        while (i < s.size()) {
          i += SpaceRunAt(s, i, s.size());
          if (i >= s.size()) break;
          size_t e = i;
          if (maxsplit >= 0 && done >= maxsplit) {
            parts.push_back(Flat(s.substr(i), in));
            break;
          }
          while (e < s.size() && SpaceRunAt(s, e, s.size()) == 0) {
            uint32_t cp;
            e += CodePointAt(s, e, &cp);
          }
          parts.push_back(Flat(s.substr(i, e - i), in));
          ++done;
          i = e;
        }
      }
      return Value::List(std::move(parts));
    }
    if (m == "find" || m == "count" || m == "index") {
      const std::string* sub = arg_str(0);
      if (!sub) return Err(n, fmt::format("{}() takes a string", m));
      if (m == "count") {
        if (sub->empty()) return Value::Int(static_cast<int64_t>(s.size()) + 1);
        int64_t c = 0;
        for (size_t p = s.find(*sub); p != std::string::npos; p = s.find(*sub, p + sub->size())) ++c;
        return Value::Int(c);
      }
      const size_t f = s.find(*sub);
      if (f == std::string::npos && m == "index") return Err(n, "substring not found");
      return Value::Int(f == std::string::npos ? -1 : static_cast<int64_t>(f));
    }
    if (m == "join") {
      if (a.empty()) return Err(n, "join() takes a list");
      TRELLIS_ASSIGN_OR_RETURN(ValueList items, Iterate(n, a[0]));
      std::vector<Piece> out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) AppendPieces(out, o);
        AppendPieces(out, items[i]);
      }
      return Value::Pieces(std::move(out));
    }
    if (m == "isspace") {
      if (s.empty()) return Value::Bool(false);
      return Value::Bool(SpaceRunAt(s, 0, s.size()) == s.size());
    }
    if (m == "isdigit" || m == "isalpha") return Value::Bool(PyIsAll(s, m == "isalpha"));
    if (m == "isupper" || m == "islower") return Value::Bool(PyIsUpper(s, m == "isupper"));
  } else if (o.kind() == Kind::kDict) {
    if (m == "items") {
      ValueList l;
      for (const auto& [k, v] : o.dict()) l.push_back(Value::List({Value::Str(k), v}));
      return Value::List(std::move(l));
    }
    if (m == "keys") {
      ValueList l;
      for (const auto& [k, v] : o.dict()) l.push_back(Value::Str(k));
      return Value::List(std::move(l));
    }
    if (m == "values") {
      ValueList l;
      for (const auto& [k, v] : o.dict()) l.push_back(v);
      return Value::List(std::move(l));
    }
    if (m == "get") {
      if (a.empty()) return Err(n, "get() takes a key");
      const Value* v = o.Find(ToText(a[0]));
      if (v) return *v;
      return a.size() > 1 ? a[1] : Value::None();
    }
    if (m == "update") {
      if (!a.empty() && a[0].kind() == Kind::kDict) {
        for (const auto& [k, v] : a[0].dict()) o.Set(k, v);
      }
      for (auto& [k, v] : kw) o.Set(k, v);
      return Value::None();
    }
  } else if (o.kind() == Kind::kList) {
    if (m == "append") {
      if (a.size() != 1) return Err(n, "append() takes one value");
      if (o.list().size() >= static_cast<size_t>(Template::kMaxLoopIterations)) return Err(n, "list too long");
      o.list().push_back(a[0]);
      return Value::None();
    }
    if (m == "index") {
      for (size_t i = 0; i < o.list().size(); ++i) {
        if (!a.empty() && Equal(o.list()[i], a[0])) return Value::Int(static_cast<int64_t>(i));
      }
      return Err(n, "value not in list");
    }
    if (m == "count") {
      int64_t c = 0;
      for (const Value& x : o.list()) c += !a.empty() && Equal(x, a[0]);
      return Value::Int(c);
    }
  }
  if (o.is_undefined()) return Err(n, fmt::format("'{}' called on an undefined value", m));
  return Err(n, fmt::format("unsupported method '{}'", m));
}

}  // namespace trellis::jinja

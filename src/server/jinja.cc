// The Jinja interpreter of jinja.h: a lexer that applies jinja2's whitespace rules
// (trim_blocks, lstrip_blocks, '-' control, the dropped trailing newline), a recursive
// descent parser to a tree of Nodes, and a tree-walking evaluator over Values.
#include "server/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <unordered_map>

#include <fmt/core.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

namespace trellis::jinja {

// ---- values ----

struct Value::Callable {
  // Positional and keyword arguments; returns the value or an error message.
  std::function<Result<Value>(std::vector<Value>&, std::vector<std::pair<std::string, Value>>&)> fn;
};

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

using Kind = Value::Kind;

bool AnyInput(const Value& v) {
  if (v.kind() != Kind::kString) return false;
  for (const Piece& p : v.pieces()) {
    if (p.input) return true;
  }
  return false;
}

// One piece, input if any of v's was.
Value Flat(const std::string& s, bool input) { return Value::Str(s, input); }

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == std::floor(f) && std::fabs(f) < 1e16) return fmt::format("{:.1f}", f);
  return fmt::format("{}", f);  // shortest round-trip, as Python's repr
}

std::string PyRepr(const Value& v, bool top);

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

// ---- lexer ----

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok kind;
  std::string text;  // text, name, string value, operator
  int line;
  int64_t i = 0;
  double f = 0;
};

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.isspace() for one code point (what str.strip(), split() and jinja2's trim
// use): the White_Space property plus the separators U+001C..U+001F.
bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The code point at s[i] and its length in bytes; a byte that starts no well-formed
// sequence is one "code point" of its own (0xFFFFFFFF), never whitespace, never split.
size_t CodePointAt(std::string_view s, size_t i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    *cp = 0xFFFFFFFF;
    return 1;
  }
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) {
      *cp = 0xFFFFFFFF;
      return 1;
    }
    v = (v << 6) | (d & 0x3F);
  }
  *cp = v;
  return len;
}

// The code point ending at s[e - 1] (as CodePointAt would read it) and its length.
size_t CodePointBefore(std::string_view s, size_t e, uint32_t* cp) {
  size_t b = e - 1;
  while (b > 0 && e - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  if (CodePointAt(s, b, cp) == e - b) return e - b;
  *cp = 0xFFFFFFFF;
  return 1;
}

bool HasCodePoint(std::string_view set, uint32_t cp) {
  for (size_t i = 0; i < set.size();) {
    uint32_t c;
    i += CodePointAt(set, i, &c);
    if (c == cp && cp != 0xFFFFFFFF) return true;
  }
  return false;
}

// --- Python's case rules (str.upper, lower, title, capitalize, isupper, ...) -------------
// Full case mappings (Unicode's SpecialCasing: "ß".upper() == "SS", "ǆ".title() == "ǅ")
// and character properties from ICU (libicu, root locale, so no Turkish dotless i), with
// the rules CPython adds: a capital sigma lowers to final sigma at the end of a word, title
// case starts after any character that is not cased. Bytes that are not well-formed UTF-8
// pass through unchanged.

enum class CaseOp { kUpper, kLower, kTitle };

void AppendUtf8(std::string& out, uint32_t cp) {
  char b[4];
  int32_t n = 0;
  U8_APPEND_UNSAFE(b, n, cp);
  out.append(b, static_cast<size_t>(n));
}

// The full mapping of one code point (at most three code points).
void AppendCased(std::string& out, uint32_t cp, CaseOp op) {
  UChar src[2], dst[16];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, cp);
  UErrorCode err = U_ZERO_ERROR;
  const int32_t m = op == CaseOp::kUpper   ? u_strToUpper(dst, 16, src, n, "", &err)
                    : op == CaseOp::kLower ? u_strToLower(dst, 16, src, n, "", &err)
                                           : u_strToTitle(dst, 16, src, n, nullptr, "", &err);
  if (U_FAILURE(err) || m > 16) {
    AppendUtf8(out, cp);
    return;
  }
  for (int32_t i = 0; i < m;) {
    UChar32 c;
    U16_NEXT(dst, i, m, c);
    AppendUtf8(out, static_cast<uint32_t>(c));
  }
}

bool IsCased(uint32_t cp) { return cp != 0xFFFFFFFF && u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED); }
bool IsCaseIgnorable(uint32_t cp) {
  return cp != 0xFFFFFFFF && u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASE_IGNORABLE);
}

// CPython's handle_capital_sigma: U+03A3 at s[i] lowers to final sigma when a cased
// character precedes it and none follows (case-ignorable characters skipped both ways).
bool IsFinalSigma(std::string_view s, size_t i, size_t len) {
  bool before = false, after = false;
  for (size_t j = i; j > 0;) {
    uint32_t c;
    j -= CodePointBefore(s, j, &c);
    if (IsCaseIgnorable(c)) continue;
    before = IsCased(c);
    break;
  }
  for (size_t j = i + len; j < s.size();) {
    uint32_t c;
    j += CodePointAt(s, j, &c);
    if (IsCaseIgnorable(c)) continue;
    after = IsCased(c);
    break;
  }
  return before && !after;
}

// s[i, i + len) (code point cp) lowered, in the context of s.
void AppendLower(std::string& out, std::string_view s, size_t i, size_t len, uint32_t cp) {
  if (cp == 0x3A3) {
    AppendUtf8(out, IsFinalSigma(s, i, len) ? 0x3C2 : 0x3C3);
  } else {
    AppendCased(out, cp, CaseOp::kLower);
  }
}

std::string PyUpper(std::string_view s) {
  std::string o;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t len = CodePointAt(s, i, &cp);
    if (cp == 0xFFFFFFFF) {
      o += s[i];
    } else {
      AppendCased(o, cp, CaseOp::kUpper);
    }
    i += len;
  }
  return o;
}

// s[begin, size) lowered, in the context of the whole of s.
void AppendLowerRange(std::string& o, std::string_view s, size_t begin) {
  for (size_t i = begin; i < s.size();) {
    uint32_t cp;
    const size_t len = CodePointAt(s, i, &cp);
    if (cp == 0xFFFFFFFF) {
      o += s[i];
    } else {
      AppendLower(o, s, i, len, cp);
    }
    i += len;
  }
}

std::string PyLower(std::string_view s) {
  std::string o;
  AppendLowerRange(o, s, 0);
  return o;
}

// str.title(): title case after a character that is not cased, lower case after one that is.
std::string PyTitle(std::string_view s) {
  std::string o;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t len = CodePointAt(s, i, &cp);
    if (cp == 0xFFFFFFFF) {
      o += s[i];
    } else if (prev_cased) {
      AppendLower(o, s, i, len, cp);
    } else {
      AppendCased(o, cp, CaseOp::kTitle);
    }
    prev_cased = IsCased(cp);
    i += len;
  }
  return o;
}

// str.capitalize() (Python >= 3.8): the first character in title case, the rest lowered.
std::string PyCapitalize(std::string_view s) {
  if (s.empty()) return std::string();
  uint32_t cp;
  const size_t len = CodePointAt(s, 0, &cp);
  std::string o;
  if (cp == 0xFFFFFFFF) {
    o += s[0];
  } else {
    AppendCased(o, cp, CaseOp::kTitle);
  }
  AppendLowerRange(o, s, len);
  return o;
}

// jinja2's `title` filter (not str.title): the text split before and after runs of
// whitespace and -({[<, each piece's first character upper-cased and the rest lowered.
std::string JinjaTitle(std::string_view s) {
  auto is_sep = [](uint32_t c) { return IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string o;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    CodePointAt(s, i, &cp);
    const bool sep = is_sep(cp);
    size_t e = i;
    while (e < s.size()) {
      uint32_t c;
      const size_t l = CodePointAt(s, e, &c);
      if (is_sep(c) != sep) break;
      e += l;
    }
    const std::string_view item = s.substr(i, e - i);
    const size_t first = CodePointAt(item, 0, &cp);
    o += PyUpper(item.substr(0, first));
    o += PyLower(item.substr(first));
    i = e;
  }
  return o;
}

// str.isupper() / islower(): some cased character, and none of the other case (or title case).
bool PyIsUpper(std::string_view s, bool upper) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += CodePointAt(s, i, &cp);
    if (cp == 0xFFFFFFFF) continue;
    const auto c = static_cast<UChar32>(cp);
    const bool is_upper = u_hasBinaryProperty(c, UCHAR_UPPERCASE), is_lower = u_hasBinaryProperty(c, UCHAR_LOWERCASE);
    if ((upper ? is_lower : is_upper) || u_istitle(c)) return false;
    cased = cased || (upper ? is_upper : is_lower);
  }
  return cased;
}

// str.isalpha() (letters: Lu Ll Lt Lm Lo) / str.isdigit() (Numeric_Type Decimal or Digit).
bool PyIsAll(std::string_view s, bool alpha) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += CodePointAt(s, i, &cp);
    if (cp == 0xFFFFFFFF) return false;
    const auto c = static_cast<UChar32>(cp);
    const int nt = u_getIntPropertyValue(c, UCHAR_NUMERIC_TYPE);
    if (!(alpha ? u_isalpha(c) : (nt == U_NT_DECIMAL || nt == U_NT_DIGIT))) return false;
  }
  return true;
}

// Length of the run of Python whitespace at the start / end of s[b, e).
size_t SpaceRunAt(std::string_view s, size_t b, size_t e) {
  size_t i = b;
  while (i < e) {
    uint32_t cp;
    const size_t len = CodePointAt(s, i, &cp);
    if (!IsPySpace(cp)) break;
    i += len;
  }
  return i - b;
}
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

Status SyntaxError(int line, const std::string& what) {
  return InvalidArgument(fmt::format("chat template line {}: {}", line, what));
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  Result<std::vector<Token>> Run() {
    // jinja2 drops one trailing newline (keep_trailing_newline=False).
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t start = src_.find('{', pos);
      while (start != std::string_view::npos && start + 1 < src_.size() && src_[start + 1] != '{' &&
             src_[start + 1] != '%' && src_[start + 1] != '#') {
        start = src_.find('{', start + 1);
      }
      if (start == std::string_view::npos || start + 1 >= src_.size()) {
        EmitText(pos, src_.size(), false, false, '\0');
        break;
      }
      const char kind = src_[start + 1];
      size_t body = start + 2;
      bool strip_left = false, no_lstrip = false;
      if (body < src_.size() && src_[body] == '-') {
        strip_left = true;
        ++body;
      } else if (body < src_.size() && src_[body] == '+') {
        no_lstrip = true;
        ++body;
      }
      EmitText(pos, start, strip_left, !no_lstrip && kind != '{', kind);
      const int line = LineAt(start);
      if (kind == '#') {
        const size_t end = src_.find("#}", body);
        if (end == std::string_view::npos) return SyntaxError(line, "unterminated comment");
        const bool strip_right = end > body && src_[end - 1] == '-';
        pos = AfterTag(end + 2, strip_right, true);
        continue;
      }
      out_.push_back({kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", line});
      TRELLIS_ASSIGN_OR_RETURN(pos, LexTag(body, kind == '{'));
      // {% raw %} ... {% endraw %}: the text in between, verbatim.
      const size_t n = out_.size();
      if (kind == '%' && n >= 3 && out_[n - 2].kind == Tok::kName && out_[n - 2].text == "raw" &&
          out_[n - 3].kind == Tok::kBlockBegin) {
        out_.resize(n - 3);
        size_t e = pos;
        for (;;) {
          e = src_.find("{%", e);
          if (e == std::string_view::npos) return SyntaxError(line, "{% raw %} without {% endraw %}");
          size_t k = e + 2;
          if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) ++k;
          while (k < src_.size() && IsSpace(src_[k])) ++k;
          if (src_.substr(k, 6) == "endraw") break;
          e += 2;
        }
        const bool strip = e + 2 < src_.size() && src_[e + 2] == '-';
        std::string t(src_.substr(pos, e - pos));
        if (strip) {
          while (!t.empty() && IsSpace(t.back())) t.pop_back();
        }
        if (!t.empty()) out_.push_back({Tok::kText, t, line});
        const size_t close = src_.find("%}", e);
        if (close == std::string_view::npos) return SyntaxError(line, "unterminated {% endraw %}");
        pos = AfterTag(close + 2, close > 0 && src_[close - 1] == '-', true);
      }
    }
    out_.push_back({Tok::kEnd, "", LineAt(src_.size())});
    return std::move(out_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_++] == '\n') ++line_;
    }
    return line_;
  }

  // Text [a, b) before a tag of kind `kind` ('\0': end of template).
  void EmitText(size_t a, size_t b, bool strip_left, bool lstrip, char /*kind*/) {
    std::string t(src_.substr(a, b - a));
    if (strip_left) {
      while (!t.empty() && IsSpace(t.back())) t.pop_back();
    } else if (lstrip && b < src_.size()) {
      // lstrip_blocks: spaces and tabs between the line start and a block or comment tag.
      const size_t nl = t.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      const bool line_start = nl != std::string::npos || a == 0 || src_[a - 1] == '\n';
      if (line_start && t.find_first_not_of(" \t", l_pos) == std::string::npos) t.resize(l_pos);
    }
    // Newlines as jinja2 normalizes them.
    std::string n;
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] == '\r') {
        n += '\n';
        if (i + 1 < t.size() && t[i + 1] == '\n') ++i;
      } else {
        n += t[i];
      }
    }
    if (!n.empty()) out_.push_back({Tok::kText, std::move(n), LineAt(a)});
  }

  // Position after a tag closed at `end`: '-' strips all following whitespace;
  // trim_blocks drops one newline after a block or comment.
  size_t AfterTag(size_t end, bool strip_right, bool block) {
    if (strip_right) {
      while (end < src_.size() && IsSpace(src_[end])) ++end;
    } else if (block) {
      if (end < src_.size() && src_[end] == '\n') {
        ++end;
      } else if (end + 1 < src_.size() && src_[end] == '\r' && src_[end + 1] == '\n') {
        end += 2;
      }
    }
    return end;
  }

  Result<size_t> LexTag(size_t pos, bool var) {
    int depth = 0;
    for (;;) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) return SyntaxError(LineAt(pos), var ? "unterminated {{" : "unterminated {%");
      const int line = LineAt(pos);
      const char c = src_[pos];
      const std::string_view rest = src_.substr(pos);
      const std::string_view close = var ? "}}" : "%}";
      if (depth == 0 && (rest.substr(0, 2) == close || (c == '-' && rest.substr(1, 2) == close) ||
                         (c == '+' && rest.substr(1, 2) == close))) {
        const bool strip = c == '-';
        out_.push_back({var ? Tok::kVarEnd : Tok::kBlockEnd, "", line});
        return AfterTag(pos + (c == '-' || c == '+' ? 3 : 2), strip, !var);
      }
      if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        out_.push_back({Tok::kName, std::string(src_.substr(pos, e - pos)), line});
        pos = e;
      } else if (c >= '0' && c <= '9') {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() && ((src_[e] >= '0' && src_[e] <= '9') || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && src_[e + 1] >= '0' && src_[e + 1] <= '9') {
          is_float = true;
          ++e;
          while (e < src_.size() && src_[e] >= '0' && src_[e] <= '9') ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && src_[k] >= '0' && src_[k] <= '9') {
            is_float = true;
            e = k;
            while (e < src_.size() && src_[e] >= '0' && src_[e] <= '9') ++e;
          }
        }
        std::string num;
        for (size_t k = pos; k < e; ++k) {
          if (src_[k] != '_') num += src_[k];
        }
        Token t{is_float ? Tok::kFloat : Tok::kInt, num, line};
        errno = 0;
        if (is_float) {
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          t.i = std::strtoll(num.c_str(), nullptr, 10);
          if (errno == ERANGE) return SyntaxError(line, "integer literal out of range");
        }
        out_.push_back(t);
        pos = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t e = pos + 1;
        for (;; ++e) {
          if (e >= src_.size()) return SyntaxError(line, "unterminated string literal");
          if (src_[e] == c) break;
          if (src_[e] == '\\' && e + 1 < src_.size()) {
            const char x = src_[++e];
            switch (x) {
              case 'n': s += '\n'; break;
              case 't': s += '\t'; break;
              case 'r': s += '\r'; break;
              case '\\': s += '\\'; break;
              case '\'': s += '\''; break;
              case '"': s += '"'; break;
              case '\n': break;
              default: s += '\\'; s += x;
            }
          } else {
            s += src_[e];
          }
        }
        out_.push_back({Tok::kString, std::move(s), line});
        pos = e + 1;
      } else {
        static constexpr std::string_view kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string op(1, c);
        for (std::string_view o : kOps2) {
          if (rest.substr(0, 2) == o) op = std::string(o);
        }
        if (op.size() == 1 && std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos) {
          return SyntaxError(line, fmt::format("unexpected character '{}'", c));
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        out_.push_back({Tok::kOp, op, line});
        pos += op.size();
      }
    }
  }

  std::string_view src_;
  std::vector<Token> out_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

// ---- tree ----

struct Node {
  enum class K {
    // statements
    kBody, kText, kOutput, kIf, kFor, kSet, kSetAttr, kSetBlock, kMacro, kBreak, kContinue, kCallBlock,
    // expressions
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary, kAnd, kOr, kNot, kCond,
    kList, kDict, kTuple,
  };
  K k;
  int line = 0;
  std::string name;              // identifier / operator / filter / test / attribute
  Value value;                   // literal
  std::vector<std::shared_ptr<const Node>> kids;
  std::vector<std::string> names;  // for targets, macro parameters
  std::vector<std::shared_ptr<const Node>> kw;  // keyword argument values (kwnames in names2)
  std::vector<std::string> names2;
  bool flag = false;             // kTest: negated; kFor: has else; kIf: has else; kSlice: parts present
};

namespace {

using NodeP = std::shared_ptr<const Node>;

NodeP Mk(Node::K k, int line, std::string name = {}, std::vector<NodeP> kids = {}) {
  auto n = std::make_shared<Node>();
  n->k = k;
  n->line = line;
  n->name = std::move(name);
  n->kids = std::move(kids);
  return n;
}

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

// ---- evaluation ----

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Value& globals) {
    scopes_.push_back({});
    Builtins();
    if (globals.kind() == Kind::kDict) {
      for (const auto& [k, v] : globals.dict()) scopes_.back()[k] = v;
    }
  }

  Status Run(const Node& root, std::vector<Piece>* out) {
    out_ = out;
    Flow f;
    return Exec(root, &f);
  }

 private:
  using Scope = std::unordered_map<std::string, Value>;

  Status Err(const Node& n, const std::string& what) const {
    return InvalidArgument(fmt::format("chat template line {}: {}", n.line, what));
  }

  void Emit(const Value& v) {
    if (v.kind() == Kind::kString) {
      for (const Piece& p : v.pieces()) EmitPiece(p.text, p.input);
    } else {
      EmitPiece(ToText(v), false);
    }
  }
  void EmitPiece(const std::string& s, bool input) {
    if (s.empty()) return;
    out_bytes_ += s.size();
    if (!out_->empty() && out_->back().input == input) {
      out_->back().text += s;
    } else {
      out_->push_back({s, input});
    }
  }

  const Value* Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  using Args = std::vector<Value>;
  using Kwargs = std::vector<std::pair<std::string, Value>>;

  Value Fn(std::function<Result<Value>(Args&, Kwargs&)> f) {
    auto c = std::make_shared<Value::Callable>();
    c->fn = std::move(f);
    return Value::MakeCallable(c);
  }

  void Builtins() {
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

  Status Exec(const Node& n, Flow* flow) {
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
  Result<Value> Capture(const Node& body) {
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

  Value MakeMacro(const Node& n) {
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

  Result<ValueList> Iterate(const Node& at, const Value& v) {
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

  Status ExecFor(const Node& n, Flow* flow) {
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

  Result<Value> Eval(const Node& n) {
    if (++eval_depth_ > Template::kMaxDepth * 4) {
      --eval_depth_;
      return Err(n, "evaluation nested too deeply");
    }
    Result<Value> r = EvalInner(n);
    --eval_depth_;
    return r;
  }

  Result<Value> EvalInner(const Node& n) {
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

  Result<Value> GetAttr(const Value& o, const std::string& name) {
    if (o.kind() == Kind::kDict) {
      if (const Value* v = o.Find(name)) return *v;
    }
    return Value();  // undefined (methods are resolved by EvalCall)
  }

  Result<Value> GetItem(const Node& n, const Value& o, const Value& k) {
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

  Result<Value> EvalSlice(const Node& n) {
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

  Result<std::pair<Args, Kwargs>> EvalArgs(const Node& n, size_t first) {
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

  Result<Value> EvalCall(const Node& n) {
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

  Result<Value> Invoke(const Node& n, const Value& f, Args& a, Kwargs& kw) {
    Result<Value> r = f.callable().fn(a, kw);
    if (!r.ok() && r.status().message().rfind("chat template line", 0) != 0) {
      return Err(n, std::string(r.status().message()));
    }
    return r;
  }

  // Python's str.strip / lstrip / rstrip: whitespace by str.isspace(), or the code points
  // of `chars`.
  static void StripRange(std::string_view s, const std::string* chars, bool left, bool right, size_t& b, size_t& e) {
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

  static std::string StripChars(const std::string& s, const std::string* chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    StripRange(s, chars, left, right, b, e);
    return s.substr(b, e - b);
  }

  // Strip over pieces: trims the ends, keeping the pieces apart.
  static Value StripPieces(const Value& v, const std::string* chars, bool left, bool right) {
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

  static Value MapPieces(const Value& v, const std::function<std::string(const std::string&)>& f) {
    std::vector<Piece> p = v.pieces();
    for (Piece& x : p) x.text = f(x.text);
    return Value::Pieces(std::move(p));
  }

  static std::string Upper(const std::string& s) { return PyUpper(s); }
  static std::string Lower(const std::string& s) { return PyLower(s); }
  // Stops growing past the output limit (the caller's result is then cut short, and the
  // render fails on the output bound when it is written).
  static std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
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

  Result<Value> CallMethod(const Node& n, const Value& o, const std::string& m, Args& a, Kwargs& kw) {
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

  static size_t ToTextSize(const Value& v) {
    if (v.kind() != Kind::kString) return v.kind() == Kind::kList || v.kind() == Kind::kDict ? 0 : 32;
    size_t n = 0;
    for (const Piece& p : v.pieces()) n += p.text.size();
    return n;
  }

  static void AppendPieces(std::vector<Piece>& out, const Value& v) {
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

  Result<Value> EvalBinary(const Node& n) {
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

  Result<bool> EvalTest(const Node& n) {
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
  static Value ItemAttr(const Value& item, const std::string& path) {
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

  const Value* Kw(Kwargs& kw, const char* name) {
    for (auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return nullptr;
  }

  Result<Value> EvalFilter(const Node& n) {
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

  static size_t CodepointCount(const std::string& s) {
    size_t c = 0;
    for (unsigned char ch : s) c += (ch & 0xC0) != 0x80;
    return c;
  }

  static bool ContainsInput(const Value& v) {
    switch (v.kind()) {
      case Kind::kString: return AnyInput(v);
      case Kind::kList: return std::any_of(v.list().begin(), v.list().end(), ContainsInput);
      case Kind::kDict:
        return std::any_of(v.dict().begin(), v.dict().end(), [](const auto& kv) { return ContainsInput(kv.second); });
      default: return false;
    }
  }

  std::vector<Scope> scopes_;
  std::vector<Piece>* out_ = nullptr;
  size_t out_bytes_ = 0;
  int64_t iterations_ = 0;
  int eval_depth_ = 0;
  int call_depth_ = 0;
};

}  // namespace

std::string ToJson(const Value& v, int indent) {
  std::string o;
  JsonInto(v, indent, 0, o);
  return o;
}

Result<Template> Template::Parse(std::string_view source) {
  if (source.size() > kMaxSourceBytes) {
    return InvalidArgument(fmt::format("chat template of {} bytes is larger than the limit of {}", source.size(), kMaxSourceBytes));
  }
  Lexer lexer(source);
  TRELLIS_ASSIGN_OR_RETURN(std::vector<Token> toks, lexer.Run());
  Parser parser(std::move(toks));
  TRELLIS_ASSIGN_OR_RETURN(NodeP root, parser.ParseTemplate());
  Template t;
  t.root_ = root;
  return t;
}

Result<std::vector<Piece>> Template::Render(const Value& globals) const {
  std::vector<Piece> out;
  Renderer r(globals);
  TRELLIS_RETURN_IF_ERROR(r.Run(*root_, &out));
  return out;
}

}  // namespace trellis::jinja

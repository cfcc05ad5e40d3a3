#include "grammar/regex.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace trellis::grammar {
namespace {

// ECMAScript's WhiteSpace and LineTerminator code points: \s.
CharClass Space() {
  CharClass c;
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu,
                      0x3000u, 0xFEFFu}) {
    c.Add(cp, cp);
  }
  c.Add(0x2000, 0x200A);
  return c;
}

CharClass Digit() { return CharClass::Range('0', '9'); }

CharClass Word() {
  CharClass c = CharClass::Range('a', 'z');
  c.Add('A', 'Z');
  c.Add('0', '9');
  c.Add('_', '_');
  return c;
}

// `.`: anything but a line terminator.
CharClass Dot() {
  CharClass c;
  c.Add(0x0A, 0x0A);
  c.Add(0x0D, 0x0D);
  c.Add(0x2028, 0x2029);
  return c.Complement();
}

// One GBNF class endpoint: ASCII letters and digits as they are, everything else \U.
std::string ClassChar(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9')) return std::string(1, char(cp));
  return fmt::format("\\U{:08X}", cp);
}

std::string GbnfClass(const CharClass& c) {
  std::string s = "[";
  for (const auto& [lo, hi] : c.ranges()) s += lo == hi ? ClassChar(lo) : ClassChar(lo) + "-" + ClassChar(hi);
  return s + "]";
}

// A GBNF literal of ASCII text.
std::string GbnfLiteral(std::string_view text) {
  std::string s = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') s += '\\';
    s += ch;
  }
  return s + "\"";
}

// The parsed pattern. Repetition of something that can match the empty string is
// rewritten before it is emitted ((X)* as (X without "")*), since the grammar engine refuses
// a star over a nullable body (the matcher would loop on it).
struct Node {
  enum Kind { kEmpty, kClass, kSeq, kAlt, kRepeat, kRaw } kind = kEmpty;
  CharClass cls;                                 // kClass
  std::string gbnf;                              // kRaw: one character, as the caller's GBNF
  std::vector<std::shared_ptr<const Node>> kids;  // kSeq, kAlt; kRepeat: one
  uint32_t min = 0;
  int64_t max = -1;  // kRepeat; -1 = unbounded
  bool nullable = true;
};
using NodePtr = std::shared_ptr<const Node>;

NodePtr MakeClass(CharClass c) {
  auto n = std::make_shared<Node>();
  n->kind = Node::kClass;
  n->cls = std::move(c);
  n->nullable = false;
  return n;
}

NodePtr MakeList(Node::Kind kind, std::vector<NodePtr> kids) {
  if (kids.size() == 1) return kids[0];
  auto n = std::make_shared<Node>();
  n->kind = kids.empty() ? Node::kEmpty : kind;
  n->nullable = kind == Node::kSeq || kids.empty();
  for (const NodePtr& k : kids) n->nullable = kind == Node::kSeq ? n->nullable && k->nullable : n->nullable || k->nullable;
  n->kids = std::move(kids);
  return n;
}

NodePtr MakeRepeat(NodePtr x, uint32_t min, int64_t max) {
  auto n = std::make_shared<Node>();
  n->kind = Node::kRepeat;
  n->nullable = min == 0 || x->nullable;
  n->kids = {std::move(x)};
  n->min = min;
  n->max = max;
  return n;
}

// The non-empty strings of `n`; null when it has none.
NodePtr NonEmpty(const NodePtr& n) {
  if (!n->nullable) return n;
  switch (n->kind) {
    case Node::kEmpty:
    case Node::kClass:
    case Node::kRaw:
      return nullptr;
    case Node::kAlt: {
      std::vector<NodePtr> alts;
      for (const NodePtr& k : n->kids) {
        if (NodePtr e = NonEmpty(k)) alts.push_back(e);
      }
      return alts.empty() ? nullptr : MakeList(Node::kAlt, std::move(alts));
    }
    case Node::kSeq: {  // every item is nullable: the first non-empty, or it empty and the rest not
      std::vector<NodePtr> rest(n->kids.begin() + 1, n->kids.end());
      const NodePtr tail = MakeList(Node::kSeq, rest);
      std::vector<NodePtr> alts;
      if (NodePtr head = NonEmpty(n->kids[0])) alts.push_back(MakeList(Node::kSeq, {head, tail}));
      if (NodePtr t = NonEmpty(tail)) alts.push_back(t);
      return alts.empty() ? nullptr : MakeList(Node::kAlt, std::move(alts));
    }
    case Node::kRepeat: {
      if (n->max == 0) return nullptr;
      const NodePtr& x = n->kids[0];
      if (!x->nullable) return MakeRepeat(x, 1, n->max);  // min == 0 here
      NodePtr e = NonEmpty(x);
      if (!e) return nullptr;
      return MakeList(Node::kSeq, {e, MakeRepeat(e, 0, n->max < 0 ? -1 : n->max - 1)});
    }
  }
  return nullptr;
}

class RegexCompiler {
 public:
  RegexCompiler(std::vector<uint32_t> p, const RegexOptions& o, const GrammarLimits& l)
      : p_(std::move(p)), o_(o), limits_(l) {}

  Result<std::string> Run() {
    TRELLIS_ASSIGN_OR_RETURN(NodePtr root, Alternation(0));
    if (pos_ < p_.size()) return Error("unmatched ')'");
    std::string out;
    TRELLIS_RETURN_IF_ERROR(Emit(*root, out));
    return out;
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgument(fmt::format("regular expression: {} at offset {}", what, pos_));
  }
  bool More() const { return pos_ < p_.size(); }
  uint32_t Peek(size_t k = 0) const { return pos_ + k < p_.size() ? p_[pos_ + k] : 0xFFFFFFFF; }

  // GBNF text of `n`, appended to `out`, bounded by the limits' source size.
  Status Emit(const Node& n, std::string& out) const {
    if (out.size() > limits_.max_source_bytes) {
      return InvalidArgument(fmt::format("regular expression: its grammar is above {} bytes", limits_.max_source_bytes));
    }
    switch (n.kind) {
      case Node::kEmpty:
        out += "\"\"";
        return Status::Ok();
      case Node::kRaw:
        out += "( " + n.gbnf + " )";
        return Status::Ok();
      case Node::kClass: {
        TRELLIS_ASSIGN_OR_RETURN(std::string c, Class(n.cls));
        out += c;
        return Status::Ok();
      }
      case Node::kSeq:
      case Node::kAlt:
        out += "(";
        for (size_t i = 0; i < n.kids.size(); ++i) {
          out += i == 0 ? " " : n.kind == Node::kAlt ? " | " : " ";
          TRELLIS_RETURN_IF_ERROR(Emit(*n.kids[i], out));
        }
        out += " )";
        return Status::Ok();
      case Node::kRepeat: {
        NodePtr x = n.kids[0];
        uint32_t min = n.min;
        if (x->nullable) {  // (X){m,n} over a nullable X is (X without ""){0,n}
          x = NonEmpty(x);
          min = 0;
          if (!x || n.max == 0) {
            out += "\"\"";
            return Status::Ok();
          }
        }
        out += "(";
        TRELLIS_RETURN_IF_ERROR(Emit(*x, out));
        out += ")";
        if (n.max < 0) {
          out += min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
        } else {
          out += fmt::format("{{{},{}}}", min, n.max);
        }
        return Status::Ok();
      }
    }
    return Status::Ok();
  }

  // Alternatives ('|'-separated sequences) up to ')' or the end; depth 0 is the whole pattern.
  Result<NodePtr> Alternation(int depth) {
    if (depth > limits_.max_nesting) return Error(fmt::format("groups nested deeper than {}", limits_.max_nesting));
    std::vector<NodePtr> alts;
    while (true) {
      TRELLIS_ASSIGN_OR_RETURN(NodePtr seq, Sequence(depth));
      alts.push_back(seq);
      if (Peek() != '|') break;
      ++pos_;
    }
    return MakeList(Node::kAlt, std::move(alts));
  }

  Result<NodePtr> Sequence(int depth) {
    std::vector<NodePtr> items;
    bool start_anchor = false, end_anchor = false;
    if (Peek() == '^') {
      if (depth > 0) return Error("'^' inside a group is not supported");
      start_anchor = true;
      ++pos_;
    }
    while (More() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        if (depth > 0 || (pos_ + 1 < p_.size() && Peek(1) != '|')) return Error("'$' before the end of the pattern is not supported");
        ++pos_;
        end_anchor = true;
        break;
      }
      if (Peek() == '^') return Error("'^' after the start of the pattern is not supported");
      TRELLIS_ASSIGN_OR_RETURN(NodePtr atom, Atom(depth));
      TRELLIS_ASSIGN_OR_RETURN(atom, Quantifier(atom));
      items.push_back(atom);
    }
    if (depth == 0 && o_.search) {  // unanchored sides match anything
      const NodePtr any = AnyStar();
      if (!start_anchor) items.insert(items.begin(), any);
      if (!end_anchor) items.push_back(any);
    }
    return MakeList(Node::kSeq, std::move(items));
  }

  // The padding of search semantics: any character, repeated.
  NodePtr AnyStar() const {
    if (o_.any_char.empty()) return MakeRepeat(MakeClass(CharClass::Any()), 0, -1);
    auto n = std::make_shared<Node>();
    n->kind = Node::kRaw;
    n->gbnf = o_.any_char;
    n->nullable = false;
    return MakeRepeat(n, 0, -1);
  }

  // The quantifier after an atom, applied to it.
  Result<NodePtr> Quantifier(NodePtr atom) {
    uint32_t lo = 0;
    int64_t hi = -1;
    const uint32_t c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      lo = c == '+' ? 1 : 0;
      hi = c == '?' ? 1 : -1;
      ++pos_;
    } else if (c == '{' && QuantifierAhead()) {
      ++pos_;
      auto num = [&](uint64_t& v) {
        const size_t b = pos_;
        v = 0;
        while (More() && Peek() >= '0' && Peek() <= '9') {
          v = std::min<uint64_t>(v * 10 + (Peek() - '0'), uint64_t{1} << 40);
          ++pos_;
        }
        return pos_ > b;
      };
      uint64_t a = 0, b = 0;
      num(a);
      bool has_b = true;
      if (Peek() == ',') {
        ++pos_;
        has_b = num(b);
      } else {
        b = a;
      }
      ++pos_;  // '}'
      if (a > limits_.max_repetition || (has_b && b > limits_.max_repetition)) {
        return Error(fmt::format("a repetition count above {}", limits_.max_repetition));
      }
      if (has_b && b < a) return Error("a repetition {m,n} with n < m");
      lo = static_cast<uint32_t>(a);
      hi = has_b ? static_cast<int64_t>(b) : -1;
    } else {
      return atom;
    }
    if (Peek() == '?') ++pos_;  // lazy: the same strings match whole
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' || (Peek() == '{' && QuantifierAhead())) {
      return Error("a quantifier after a quantifier");
    }
    return MakeRepeat(std::move(atom), lo, hi);
  }

  // Whether a {n}, {n,} or {n,m} quantifier starts at pos_ (otherwise '{' is a literal,
  // as ECMAScript's Annex B reads it).
  bool QuantifierAhead() const {
    size_t i = pos_ + 1;
    bool digits = false;
    while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') ++i, digits = true;
    if (!digits) return false;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') ++i;
    }
    return i < p_.size() && p_[i] == '}';
  }

  Result<NodePtr> Atom(int depth) {
    const uint32_t c = p_[pos_];
    switch (c) {
      case '*': case '+': case '?':
        return Error("nothing to repeat");
      case '(': {
        ++pos_;
        if (Peek() == '?') {
          if (Peek(1) == ':') {
            pos_ += 2;
          } else if (Peek(1) == '<' && Peek(2) != '=' && Peek(2) != '!') {
            pos_ += 2;  // a named group
            while (More() && Peek() != '>') ++pos_;
            if (!More()) return Error("an unterminated group name");
            ++pos_;
          } else if (Peek(1) == '=' || Peek(1) == '!' || Peek(1) == '<') {
            return Error("lookahead and lookbehind are not supported");
          } else {
            return Error("inline flags and other (?...) groups are not supported");
          }
        }
        TRELLIS_ASSIGN_OR_RETURN(NodePtr e, Alternation(depth + 1));
        if (Peek() != ')') return Error("an unclosed '('");
        ++pos_;
        return e;
      }
      case '[': {
        TRELLIS_ASSIGN_OR_RETURN(CharClass cc, ClassAtom());
        return MakeClass(std::move(cc));
      }
      case '.':
        ++pos_;
        return MakeClass(Dot());
      case '\\': {
        ++pos_;
        TRELLIS_ASSIGN_OR_RETURN(CharClass cc, Escape(/*in_class=*/false));
        return MakeClass(std::move(cc));
      }
      default:
        ++pos_;
        return MakeClass(CharClass::Single(c));
    }
  }

  // After a backslash: the class it stands for (a single code point for most).
  Result<CharClass> Escape(bool in_class) {
    if (!More()) return Error("a trailing backslash");
    const uint32_t c = p_[pos_++];
    switch (c) {
      case 'd': return Digit();
      case 'D': return Digit().Complement();
      case 'w': return Word();
      case 'W': return Word().Complement();
      case 's': return Space();
      case 'S': return Space().Complement();
      case 't': return CharClass::Single('\t');
      case 'n': return CharClass::Single('\n');
      case 'r': return CharClass::Single('\r');
      case 'f': return CharClass::Single('\f');
      case 'v': return CharClass::Single('\v');
      case 'b':
        if (in_class) return CharClass::Single('\b');
        return Error("word boundaries (\\b) are not supported");
      case 'B': return Error("word boundaries (\\B) are not supported");
      case '0':
        if (Peek() >= '0' && Peek() <= '9') return Error("octal escapes are not supported");
        return CharClass::Single(0);
      case 'x': return Hex(2);
      case 'u':
        if (Peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (More() && Peek() != '}' && n < 7) {
            const int d = HexDigit(Peek());
            if (d < 0) return Error("a malformed \\u{...}");
            v = v * 16 + static_cast<uint32_t>(d);
            ++pos_, ++n;
          }
          if (Peek() != '}' || n == 0 || v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) return Error("a malformed \\u{...}");
          ++pos_;
          return CharClass::Single(v);
        }
        return Hex(4);
      case 'p': case 'P': return Error("Unicode property classes (\\p{...}) are not supported");
      case 'c': return Error("control escapes (\\c) are not supported");
      case 'k': return Error("backreferences are not supported");
      default:
        if (c >= '1' && c <= '9') return Error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Error(fmt::format("the escape \\{} is not supported", static_cast<char>(c)));
        }
        return CharClass::Single(c);  // escaped punctuation (and any other character) is itself
    }
  }

  static int HexDigit(uint32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }

  Result<CharClass> Hex(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
      const int d = HexDigit(Peek());
      if (d < 0) return Error(n == 2 ? "a malformed \\xHH" : "a malformed \\uHHHH");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v >= 0xD800 && v <= 0xDFFF) return Error("a surrogate code point (\\uD800-\\uDFFF)");
    return CharClass::Single(v);
  }

  // '[' ... ']' with ranges and escapes; '^' first negates.
  Result<CharClass> ClassAtom() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CharClass set;
    while (true) {
      if (!More()) return Error("an unclosed '['");
      if (Peek() == ']') break;
      // One member: a code point (which may start a range) or an escaped class.
      auto member = [&]() -> Result<CharClass> {
        const uint32_t c = p_[pos_++];
        if (c != '\\') return CharClass::Single(c);
        return Escape(/*in_class=*/true);
      };
      TRELLIS_ASSIGN_OR_RETURN(CharClass lo, member());
      const bool single = lo.ranges().size() == 1 && lo.ranges()[0].first == lo.ranges()[0].second;
      if (single && Peek() == '-' && Peek(1) != ']' && Peek(1) != 0xFFFFFFFF) {
        ++pos_;
        TRELLIS_ASSIGN_OR_RETURN(CharClass hi, member());
        const bool hi_single = hi.ranges().size() == 1 && hi.ranges()[0].first == hi.ranges()[0].second;
        if (!hi_single) return Error("a class escape as a range's end");
        const uint32_t a = lo.ranges()[0].first, b = hi.ranges()[0].first;
        if (b < a) return Error("a range out of order");
        set.Add(CharClass::Range(a, b));
      } else {
        set.Add(lo);
      }
    }
    ++pos_;  // ']'
    CharClass out = negate ? set.Complement() : set;
    if (out.empty()) return Error("a class that matches no character");
    return out;
  }

  // A class as GBNF: as it is in raw text; in a JSON string, the characters JSON writes
  // as themselves in one class, and the others as their escapes.
  Result<std::string> Class(const CharClass& c) const {
    if (c.empty()) return Error("a class that matches no character");
    if (!o_.json_string) return GbnfClass(c);
    CharClass special;
    special.Add(0, 0x1F);
    special.Add('"', '"');
    special.Add('\\', '\\');
    CharClass plain;  // c without the special characters
    const CharClass keep = special.Complement();
    for (const auto& [lo, hi] : c.ranges()) {
      for (const auto& [klo, khi] : keep.ranges()) {
        const uint32_t a = std::max(lo, klo), b = std::min(hi, khi);
        if (a <= b) plain.Add(a, b);
      }
    }
    std::vector<std::string> alts;
    if (!plain.empty()) alts.push_back(GbnfClass(plain));
    for (uint32_t cp = 0; cp <= 0x5C; ++cp) {
      if (!c.Contains(cp) || !special.Contains(cp)) continue;
      static const char* kShort[] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     "\\b",   "\\t",   "\\n",   nullptr, "\\f",   "\\r"};
      if (cp == '"') alts.push_back(GbnfLiteral("\\\""));
      else if (cp == '\\') alts.push_back(GbnfLiteral("\\\\"));
      else if (cp < 14 && kShort[cp]) alts.push_back(GbnfLiteral(kShort[cp]));
      else alts.push_back(GbnfLiteral(fmt::format("\\u{:04x}", cp)));
    }
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
    return s + " )";
  }

  std::vector<uint32_t> p_;
  size_t pos_ = 0;
  RegexOptions o_;
  GrammarLimits limits_;
};

}  // namespace

Result<std::string> RegexToGbnf(std::string_view pattern, const RegexOptions& o, const GrammarLimits& limits) {
  if (pattern.size() > limits.max_source_bytes) return InvalidArgument("regular expression is too large");
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(pattern, cps)) return InvalidArgument("regular expression is not UTF-8");
  return RegexCompiler(std::move(cps), o, limits).Run();
}

Result<Grammar> CompileRegex(std::string_view pattern, const GrammarLimits& limits) {
  TRELLIS_ASSIGN_OR_RETURN(std::string e, RegexToGbnf(pattern, {}, limits));
  return ParseGbnf("root ::= " + e + "\n", limits);
}

}  // namespace trellis::grammar

// GBNF parser: llama.cpp's grammar syntax (grammars/README.md there), read into a Grammar.
//
// As in llama.cpp, a rule ends at the end of its line unless the line break falls inside
// parentheses or right after `::=` or `|`.
#include <fmt/format.h>

#include "grammar/grammar.h"

namespace trellis::grammar {
namespace {

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits) : s_(text), b_(limits) {}

  Result<Grammar> Parse() && {
    if (s_.size() > b_.limits().max_source_bytes) {
      return InvalidArgument(fmt::format("grammar is {} bytes, above the limit of {}", s_.size(), b_.limits().max_source_bytes));
    }
    SkipSpace(true);
    while (pos_ < s_.size()) {
      const size_t name_at = pos_;
      std::string_view name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (s_.substr(pos_, 3) != "::=") return Error("expected '::=' after the rule name");
      pos_ += 3;
      SkipSpace(true);
      TRELLIS_ASSIGN_OR_RETURN(uint32_t rule, b_.RuleId(name));
      if (rule_defined_.size() > rule && rule_defined_[rule]) {
        pos_ = name_at;
        return Error(fmt::format("rule '{}' is defined twice", name));
      }
      if (rule_defined_.size() <= rule) rule_defined_.resize(rule + 1, false);
      rule_defined_[rule] = true;
      TRELLIS_RETURN_IF_ERROR(Alternates(rule, 0));
      if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') return Error("expected the end of the rule");
      SkipSpace(true);
    }
    auto root = b_.RuleId("root");
    if (!root.ok()) return root.status();
    if (*root >= rule_defined_.size() || !rule_defined_[*root]) return InvalidArgument("grammar has no 'root' rule");
    return std::move(b_).Build(*root);
  }

 private:
  Status Error(std::string what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument(fmt::format("grammar line {} column {}: {}", line, col, what));
  }

  void SkipSpace(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view Name() {
    const size_t b = pos_;
    while (pos_ < s_.size() && IsWordChar(s_[pos_])) ++pos_;
    return s_.substr(b, pos_ - b);
  }

  // One UTF-8 encoded code point of the source.
  Result<uint32_t> RawCodePoint() {
    const auto c = static_cast<unsigned char>(s_[pos_]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || pos_ + len > s_.size()) return Error("malformed UTF-8");
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s_[pos_ + k]);
      if ((d & 0xC0) != 0x80) return Error("malformed UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return Error("malformed UTF-8");
    pos_ += len;
    return cp;
  }

  // A character of a literal or class, escapes decoded.
  Result<uint32_t> Char() {
    if (pos_ >= s_.size()) return Error("unexpected end of grammar");
    if (s_[pos_] != '\\') return RawCodePoint();
    if (pos_ + 1 >= s_.size()) return Error("unexpected end of grammar after '\\'");
    const char e = s_[pos_ + 1];
    pos_ += 2;
    int digits = 0;
    switch (e) {
      case 'x': digits = 2; break;
      case 'u': digits = 4; break;
      case 'U': digits = 8; break;
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case '\\': case '"': case '[': case ']': case '-': case '^': return static_cast<uint32_t>(e);
      default: pos_ -= 2; return Error(fmt::format("unknown escape '\\{}'", e));
    }
    uint64_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int h = pos_ < s_.size() ? HexValue(s_[pos_]) : -1;
      if (h < 0) return Error(fmt::format("expected {} hex digits after '\\{}'", digits, e));
      v = v * 16 + static_cast<uint64_t>(h);
      ++pos_;
    }
    if (v > kMaxCodePoint) return Error("escaped code point above U+10FFFF");
    return static_cast<uint32_t>(v);
  }

  Result<uint64_t> Integer() {
    SkipSpace(false);
    const size_t b = pos_;
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(s_[pos_] - '0');
      if (v > (1u << 30)) return Error("repetition count too large");
      ++pos_;
    }
    if (pos_ == b) return Error("expected a number");
    SkipSpace(false);
    return v;
  }

  Status Alternates(uint32_t rule, int depth) {
    while (true) {
      std::vector<Element> seq;
      TRELLIS_RETURN_IF_ERROR(Sequence(seq, depth));
      TRELLIS_RETURN_IF_ERROR(b_.AddAlt(rule, seq));
      if (pos_ < s_.size() && s_[pos_] == '|') {
        ++pos_;
        SkipSpace(true);
        continue;
      }
      return Status::Ok();
    }
  }

  Status Sequence(std::vector<Element>& out, int depth) {
    size_t last = out.size();  // where the last atom starts
    bool have_atom = false;
    while (true) {
      SkipSpace(depth > 0);
      if (pos_ >= s_.size()) return Status::Ok();
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        last = out.size();
        while (pos_ < s_.size() && s_[pos_] != '"') {
          TRELLIS_ASSIGN_OR_RETURN(uint32_t cp, Char());
          out.push_back(Element{ElementKind::kClass, b_.ClassId(CharClass::Single(cp))});
        }
        if (pos_ >= s_.size()) return Error("unterminated string literal");
        ++pos_;
        have_atom = true;
      } else if (c == '[') {
        ++pos_;
        bool negated = false;
        if (pos_ < s_.size() && s_[pos_] == '^') {
          negated = true;
          ++pos_;
        }
        CharClass cls;
        while (pos_ < s_.size() && s_[pos_] != ']') {
          TRELLIS_ASSIGN_OR_RETURN(uint32_t lo, Char());
          uint32_t hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            TRELLIS_ASSIGN_OR_RETURN(hi, Char());
            if (hi < lo) return Error("character range with its end before its start");
          }
          cls.Add(lo, hi);
        }
        if (pos_ >= s_.size()) return Error("unterminated character class");
        ++pos_;
        last = out.size();
        out.push_back(Element{ElementKind::kClass, b_.ClassId(negated ? cls.Complement() : cls)});
        have_atom = true;
      } else if (c == '.') {
        ++pos_;
        last = out.size();
        out.push_back(Element{ElementKind::kClass, b_.ClassId(CharClass::Any())});
        have_atom = true;
      } else if (IsWordChar(c)) {
        std::string_view name = Name();
        TRELLIS_ASSIGN_OR_RETURN(uint32_t r, b_.RuleId(name));
        last = out.size();
        out.push_back(Element{ElementKind::kRef, r});
        have_atom = true;
      } else if (c == '(') {
        if (depth + 1 > b_.limits().max_nesting) return Error(fmt::format("groups nested deeper than {}", b_.limits().max_nesting));
        ++pos_;
        SkipSpace(true);
        TRELLIS_ASSIGN_OR_RETURN(uint32_t r, b_.NewRule("group"));
        TRELLIS_RETURN_IF_ERROR(Alternates(r, depth + 1));
        if (pos_ >= s_.size() || s_[pos_] != ')') return Error("expected ')'");
        ++pos_;
        last = out.size();
        out.push_back(Element{ElementKind::kRef, r});
        have_atom = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_atom) return Error(fmt::format("'{}' with nothing before it to repeat", c));
        ++pos_;
        uint64_t min = 0;
        int64_t max = -1;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          TRELLIS_ASSIGN_OR_RETURN(min, Integer());
          max = static_cast<int64_t>(min);
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            SkipSpace(false);
            max = -1;
            if (pos_ < s_.size() && s_[pos_] != '}') {
              TRELLIS_ASSIGN_OR_RETURN(uint64_t m, Integer());
              max = static_cast<int64_t>(m);
            }
          }
          if (pos_ >= s_.size() || s_[pos_] != '}') return Error("expected '}'");
          ++pos_;
        }
        if (min > b_.limits().max_repetition || max > static_cast<int64_t>(b_.limits().max_repetition)) {
          return Error(fmt::format("repetition count above {}", b_.limits().max_repetition));
        }
        std::vector<Element> x(out.begin() + static_cast<std::ptrdiff_t>(last), out.end());
        out.resize(last);
        if (Status st = AppendRepetition(b_, x, static_cast<uint32_t>(min), max, out); !st.ok()) return Error(st.message());
        have_atom = false;  // a repetition is not itself repeated (X** is an error, as in llama.cpp)
      } else {
        return Status::Ok();  // '|', ')', a line break at the top level, or an error the caller reports
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  std::vector<bool> rule_defined_;
};

}  // namespace

Result<Grammar> ParseGbnf(std::string_view text, const GrammarLimits& limits) { return Parser(text, limits).Parse(); }

}  // namespace trellis::grammar

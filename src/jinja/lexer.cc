// The lexer (lexer.h): finds the tags in the text and splits each into tokens.
#include "jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <utility>

#include <fmt/core.h>

#include "jinja/pystr.h"

namespace trellis::jinja {

Status SyntaxError(int line, const std::string& what) {
  return InvalidArgument(fmt::format("chat template line {}: {}", line, what));
}

namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

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

Result<std::vector<Token>> Lex(std::string_view source) {
  Lexer lexer(source);
  return lexer.Run();
}

}  // namespace trellis::jinja

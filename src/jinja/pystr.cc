// Python's str semantics (pystr.h): whitespace, code points, and the case rules on ICU.
#include "jinja/pystr.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

namespace trellis::jinja {

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

namespace {

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

}  // namespace

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

}  // namespace trellis::jinja

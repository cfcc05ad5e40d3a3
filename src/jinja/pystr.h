// Python's str semantics over UTF-8 bytes, as far as the interpreter needs them to render
// what jinja2 renders: whitespace (str.isspace(), and the lexer's ASCII set), code points,
// and the case rules of str.upper / lower / title / capitalize / isupper / islower /
// isalpha / isdigit (ICU's full case mappings and character properties, root locale, with
// CPython's final sigma and title-case rules). Internal to src/jinja.
//
// Code points: a byte that starts no well-formed UTF-8 sequence is one code point of its
// own, 0xFFFFFFFF, that is never whitespace, never cased and never split; case changes
// pass it through unchanged.
//
// Thread safety: functions of their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trellis::jinja {

// ASCII whitespace (" \t\n\r\f\v"): what separates tokens in a tag and what '-' strips.
bool IsSpace(char c);
// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);
// The code point at s[i] (*cp) and its length in bytes (1 for a bad byte).
size_t CodePointAt(std::string_view s, size_t i, uint32_t* cp);
// The code point ending at s[e - 1] and its length.
size_t CodePointBefore(std::string_view s, size_t e, uint32_t* cp);
// Whether the UTF-8 text `set` holds code point cp.
bool HasCodePoint(std::string_view set, uint32_t cp);
// Length of the run of Python whitespace at the start of s[b, e).
size_t SpaceRunAt(std::string_view s, size_t b, size_t e);

// str.upper(), str.lower(), str.title(), str.capitalize().
std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);
// jinja2's `title` filter, which is not str.title().
std::string JinjaTitle(std::string_view s);
// str.isupper() (upper) or str.islower().
bool PyIsUpper(std::string_view s, bool upper);
// str.isalpha() (alpha) or str.isdigit().
bool PyIsAll(std::string_view s, bool alpha);

}  // namespace trellis::jinja

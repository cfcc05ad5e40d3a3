// Regular expressions to grammars: JSON Schema's `pattern`, vLLM's `guided_regex` and
// SGLang's `regex`, as llama.cpp, vLLM and SGLang take them.
//
// The syntax is ECMAScript's (what JSON Schema names), without flags: literals; `.` (any
// character but \n \r U+2028 U+2029); classes [...] and [^...] with ranges; \d \w \s and
// \D \W \S (ECMAScript's sets: \s includes NBSP, U+2028, U+3000, ...); escapes \t \n \r \f
// \v \0 \xHH \uHHHH \u{H...} and escaped punctuation; groups ( ), (?: ) and (?<name> );
// alternation |; quantifiers * + ? {n} {n,} {n,m}, lazy or not (the same set of strings).
// `^` and `$` may open and close each top-level alternative. Everything that a context-free
// grammar cannot express or that changes what matches beyond that is InvalidArgument naming
// it and its offset: backreferences, lookahead and lookbehind, word boundaries, anchors
// elsewhere, \p{...} property classes, inline flags.
//
// Whole-match (guided_regex, regex) or search (JSON Schema's `pattern`: the pattern may
// match anywhere in the string unless anchored) semantics; raw text, or the inside of a
// JSON string (each character written the way JSON needs: `"` as \", `\` as \\, control
// characters as \n, \t, ..., \u00XX), so that the decoded string is what matches.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "util/status.h"

namespace trellis::grammar {

struct RegexOptions {
  bool json_string = false;  // the text is the inside of a JSON string (see the file comment)
  bool search = false;       // unanchored sides match anything (JSON Schema `pattern`)
  // With `search`: a GBNF expression for one character of padding (JSON: "json-char", which
  // the caller's grammar defines); empty = any code point.
  std::string any_char;
};

// A parenthesized GBNF expression matching what `pattern` matches under `o`. Bounded by
// `limits` (nesting, repetition counts, output size).
Result<std::string> RegexToGbnf(std::string_view pattern, const RegexOptions& o = {}, const GrammarLimits& limits = {});

// The grammar of raw text matched whole by `pattern`.
Result<Grammar> CompileRegex(std::string_view pattern, const GrammarLimits& limits = {});

}  // namespace trellis::grammar

// Grammar: a context-free grammar over Unicode code points, the form every constraint
// (GBNF text, JSON Schema, regex) is compiled to before it masks tokens.
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a run
// of elements in `elements`, closed by a kEnd element. Elements are code point classes
// (a terminal matching one code point), class stars (a class repeated zero or more times,
// kept as one element so that long runs such as a JSON string body stay inside one
// grammar position, which is what makes per-position token masks cacheable) and rule
// references. Repetition and grouping in the source are desugared into generated rules
// (`X*` -> `r ::= X r | ""`, right-recursive, which the matcher runs in constant stack
// depth by tail-call elimination).
//
// Every grammar that leaves this header has passed Finish(): references resolve, no rule
// is left-recursive (directly, or through rules that can match the empty string), and
// every alternative can complete (alternatives that cannot are removed; a root that cannot
// complete is an error). That last property is what makes a token mask exact: any stack
// the matcher holds can still reach the end of the document.
//
// Thread safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace trellis::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of code points: sorted, disjoint, non-adjacent closed ranges. Surrogates
// (U+D800-DFFF) are never members: they have no UTF-8 form.
class CharClass {
 public:
  CharClass() = default;
  static CharClass Single(uint32_t cp) { return Range(cp, cp); }
  static CharClass Range(uint32_t lo, uint32_t hi);
  static CharClass Any() { return Range(0, kMaxCodePoint); }

  void Add(uint32_t lo, uint32_t hi);  // REQUIRES: lo <= hi <= kMaxCodePoint
  void Add(const CharClass& other);
  CharClass Complement() const;
  bool Contains(uint32_t cp) const;
  // Whether any member lies in [lo, hi].
  bool Intersects(uint32_t lo, uint32_t hi) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }
  bool operator==(const CharClass& o) const { return ranges_ == o.ranges_; }

 private:
  void Normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

enum class ElementKind : uint8_t {
  kEnd,        // closes an alternative
  kClass,      // one code point of classes[arg]
  kClassStar,  // zero or more code points of classes[arg]
  kRef,        // rules[arg]
};

struct Element {
  ElementKind kind = ElementKind::kEnd;
  uint32_t arg = 0;
};

struct Rule {
  std::string name;
  std::vector<uint32_t> alts;  // index in Grammar::elements of each alternative's first element
};

// Limits on what a grammar may grow to. Exceeding any is InvalidArgument naming it, so a
// hostile grammar is refused in time proportional to these bounds, never a hang.
struct GrammarLimits {
  size_t max_source_bytes = 1 << 20;
  size_t max_rules = 1 << 14;
  size_t max_elements = 1 << 20;
  int max_nesting = 64;          // parentheses (GBNF) / schema depth
  uint32_t max_repetition = 1000;  // the n of X{m,n}
};

struct Grammar {
  std::vector<Element> elements;
  std::vector<CharClass> classes;
  std::vector<Rule> rules;
  uint32_t root = 0;

  // Checks and normalizes a grammar built by a front end (see the file comment).
  // InvalidArgument naming the offending rule.
  Status Finish();

  // Inlines small rules at the start of alternatives (Finish calls it; see grammar.cc).
  void InlineLeadingRefs();

  // GBNF text of the grammar (after desugaring), for messages and tests.
  std::string ToGbnf() const;
  // Content hash (xxh64 of ToGbnf()), the key under which compiled grammars are cached.
  uint64_t Hash() const;
};

// A helper for front ends: adds rules and elements, deduplicating classes.
class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarLimits& limits) : limits_(limits) {}

  // Index of the rule named `name`, created (without alternatives) if new.
  Result<uint32_t> RuleId(std::string_view name);
  // A fresh rule named after `base` (base-1, base-2, ...).
  Result<uint32_t> NewRule(std::string_view base);
  uint32_t ClassId(const CharClass& c);
  // Appends one alternative to `rule`. An alternative is a list of elements without the
  // closing kEnd, which this adds.
  Status AddAlt(uint32_t rule, const std::vector<Element>& alt);
  bool Defined(uint32_t rule) const { return !g_.rules[rule].alts.empty() || defined_[rule]; }
  void MarkDefined(uint32_t rule) { defined_[rule] = true; }
  const std::string& Name(uint32_t rule) const { return g_.rules[rule].name; }
  size_t n_rules() const { return g_.rules.size(); }
  const GrammarLimits& limits() const { return limits_; }

  // The grammar with `root`, checked by Grammar::Finish().
  Result<Grammar> Build(uint32_t root) &&;

 private:
  GrammarLimits limits_;
  Grammar g_;
  std::vector<bool> defined_;
  std::vector<std::pair<std::string, uint32_t>> names_;  // sorted by name
};

// Copies the rules of the (finished) grammar `g` into `b`, each named `prefix` + its name,
// and returns the id its root has there: how grammars are composed (a tool call around
// its arguments' schema, an answer after a reasoning block).
Result<uint32_t> Embed(GrammarBuilder& b, const Grammar& g, std::string_view prefix);

// Appends the code points of the UTF-8 text `s` to `out`; false if `s` is not well-formed
// UTF-8 (overlong forms, surrogates and code points above U+10FFFF are not).
bool DecodeUtf8(std::string_view s, std::vector<uint32_t>& out);

// Elements matching the UTF-8 text `s` exactly (one class per code point), appended to
// `out`. InvalidArgument if `s` is not well-formed UTF-8.
Status AppendLiteral(GrammarBuilder& b, std::string_view s, std::vector<Element>& out);

// Repetition X{min,max} of a sequence (max < 0: unbounded) as elements appended to `out`,
// creating helper rules in `b` (X* and X? forms as the file comment says).
Status AppendRepetition(GrammarBuilder& b, const std::vector<Element>& x, uint32_t min, int64_t max,
                        std::vector<Element>& out);

// Parses llama.cpp's GBNF: `name ::= alternatives` rules, "literals" and [classes] with
// \x \u \U \n \r \t \\ \" \[ \] escapes, [^...] negation, `.` for any character, ( )
// groups, | alternatives, * + ? {m} {m,} {m,n} repetition, # comments. The root rule is
// `root`. Errors name the line and column.
Result<Grammar> ParseGbnf(std::string_view text, const GrammarLimits& limits = {});

}  // namespace trellis::grammar

// Regular expressions to grammars, checked against an independent implementation: the
// C++ library's ECMAScript std::regex, on random patterns and strings (ASCII, where
// std::regex's byte-wise matching and ECMAScript's agree).
#include "grammar/regex.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <random>
#include <regex>

#include "grammar/json_schema.h"
#include "grammar/stacks.h"

namespace trellis::grammar {
namespace {

Grammar RegexGrammar(const std::string& p, const RegexOptions& o = {}) {
  auto e = RegexToGbnf(p, o);
  EXPECT_TRUE(e.ok()) << p << ": " << e.status().message();
  if (!e.ok()) return {};
  auto g = ParseGbnf("root ::= " + *e + "\n");
  EXPECT_TRUE(g.ok()) << p << ": " << g.status().message() << "\n" << *e;
  return g.ok() ? std::move(*g) : Grammar{};
}

// A random pattern over a small alphabet with every construct the converter takes. No
// group holding a * or + is itself repeated: std::regex backtracks exponentially on those
// (seconds per string), the grammar does not.
std::string RandomPattern(std::mt19937_64& rng, int depth, bool* unbounded = nullptr) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  std::string s;
  const int items = 1 + pick(3);
  bool star = false;
  for (int i = 0; i < items; ++i) {
    std::string atom;
    bool inner = false;
    switch (pick(depth < 3 ? 11 : 9)) {
      case 0: case 1: atom = std::string(1, "abc"[pick(3)]); break;
      case 2: atom = "."; break;
      case 3: atom = std::vector<std::string>{"\\d", "\\w", "\\s", "\\D", "\\W", "\\S"}[pick(6)]; break;
      case 4: atom = std::vector<std::string>{"[ab]", "[^a]", "[a-c1]", "[^\\d\\s]", "[\\w\"]", "[-a]"}[pick(6)]; break;
      case 5: atom = std::vector<std::string>{"\\.", "\\\\", "\"", "\\n", "\\x41", "\\u0062", "\\/"}[pick(7)]; break;
      case 6: atom = " "; break;
      case 7: atom = "1"; break;
      case 8: atom = "b"; break;
      case 9: atom = "(" + RandomPattern(rng, depth + 1, &inner) + ")"; break;
      case 10: atom = "(?:" + RandomPattern(rng, depth + 1, &inner) + "|" + RandomPattern(rng, depth + 1, &inner) + ")"; break;
    }
    if (!inner) {
      switch (pick(8)) {
        case 0: atom += "*", star = true; break;
        case 1: atom += "+", star = true; break;
        case 2: atom += "?"; break;
        case 3: atom += "{" + std::to_string(pick(3)) + "," + std::to_string(2 + pick(2)) + "}"; break;
        case 4: atom += "{2}"; break;
        case 5: atom += "*?", star = true; break;
        default: break;
      }
    }
    s += atom;
    star = star || inner;
  }
  if (unbounded) *unbounded = *unbounded || star;
  if (depth == 0 && pick(4) == 0) s += "|" + RandomPattern(rng, 1);
  return s;
}

std::string RandomText(std::mt19937_64& rng) {
  static const char kChars[] = "abcab1A. \n\"\\{/";
  std::string s;
  const int n = static_cast<int>(rng() % 7);
  for (int i = 0; i < n; ++i) s += kChars[rng() % (sizeof kChars - 1)];
  return s;
}

// Whole match, search, and the JSON-string form of both, equal to std::regex's answers.
TEST(RegexTest, MatchesAsStdRegexDoes) {
  std::mt19937_64 rng(7);
  int compared = 0, matched = 0;
  for (int n = 0; n < 250; ++n) {
    const std::string p = RandomPattern(rng, 0);
    SCOPED_TRACE(p);
    const std::regex re(p, std::regex::ECMAScript);
    const Grammar whole = RegexGrammar(p);
    RegexOptions search;
    search.search = true;
    const Grammar found = RegexGrammar(p, search);
    // The JSON forms inside quotes, with the JSON string character as the search padding.
    RegexOptions json_whole, json_search;
    json_whole.json_string = json_search.json_string = json_search.search = true;
    json_search.any_char = "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})";
    auto jw = RegexToGbnf(p, json_whole), js = RegexToGbnf(p, json_search);
    ASSERT_TRUE(jw.ok() && js.ok());
    auto gjw = ParseGbnf("root ::= \"\\\"\" " + *jw + " \"\\\"\"\n");
    auto gjs = ParseGbnf("root ::= \"\\\"\" " + *js + " \"\\\"\"\n");
    ASSERT_TRUE(gjw.ok() && gjs.ok()) << gjw.status().message() << gjs.status().message();
    if (whole.rules.empty() || found.rules.empty()) continue;
    std::vector<std::string> texts;
    for (int k = 0; k < 30; ++k) texts.push_back(RandomText(rng));
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, re), want_search = std::regex_search(t, re);
      const std::string quoted = nlohmann::json(t).dump();
      EXPECT_EQ(Matches(whole, t), want) << "whole match of '" << t << "'";
      EXPECT_EQ(Matches(found, t), want_search) << "search in '" << t << "'";
      EXPECT_EQ(Matches(*gjw, quoted), want) << "JSON whole match of " << quoted;
      EXPECT_EQ(Matches(*gjs, quoted), want_search) << "JSON search in " << quoted;
      ++compared;
      matched += want ? 1 : 0;
    }
  }
  EXPECT_GT(matched, 200);  // the random cases are not all misses
  RecordProperty("compared", compared);
}

TEST(RegexTest, EcmaScriptSetsBeyondAscii) {
  const Grammar s = RegexGrammar("\\s+"), dot = RegexGrammar("."), w = RegexGrammar("\\w");
  for (const char* space : {"\xC2\xA0", "\xE2\x80\xA8", "\xE3\x80\x80", "\xEF\xBB\xBF", "\t\v\f"}) {
    EXPECT_TRUE(Matches(s, space)) << space;
  }
  EXPECT_FALSE(Matches(s, "\xC2\x85"));  // NEL is not ECMAScript whitespace
  EXPECT_TRUE(Matches(dot, "\xE6\x97\xA5"));
  EXPECT_FALSE(Matches(dot, "\xE2\x80\xA8"));  // a line terminator
  EXPECT_FALSE(Matches(w, "\xC3\xA9"));         // \w is ASCII
  EXPECT_TRUE(Matches(RegexGrammar("\\u{1F600}|\\u00e9"), "\xF0\x9F\x98\x80"));
  EXPECT_TRUE(Matches(RegexGrammar("[\\u00e0-\\u00ff]+"), "\xC3\xA9\xC3\xA0"));
  EXPECT_TRUE(Matches(RegexGrammar("(?<year>\\d{4})-\\d\\d"), "2026-12"));
  EXPECT_TRUE(Matches(RegexGrammar("a{,2}"), "a{,2}"));  // not a quantifier: literal braces (Annex B)
  // Control characters inside a JSON string are written escaped.
  RegexOptions j;
  j.json_string = true;
  auto e = RegexToGbnf("[\\x00-\\x1f]", j);
  ASSERT_TRUE(e.ok());
  auto g = ParseGbnf("root ::= " + *e);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(Matches(*g, "\\u0001"));
  EXPECT_TRUE(Matches(*g, "\\n"));
  EXPECT_FALSE(Matches(*g, "\n"));
}

TEST(RegexTest, RefusesWhatAGrammarCannotSayNamingIt) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreferences"},          {"(?=a)a", "lookahead"},
      {"(?<!a)b", "lookahead and lookbehind"}, {"\\bword", "word boundaries"},
      {"a^b", "'^' after the start"},          {"a$b", "'$' before the end"},
      {"(^a)", "'^' inside a group"},          {"\\p{L}", "Unicode property"},
      {"(?i)abc", "inline flags"},             {"a**", "a quantifier after a quantifier"},
      {"*a", "nothing to repeat"},             {"(ab", "an unclosed '('"},
      {"ab)", "unmatched ')'"},                {"[ab", "an unclosed '['"},
      {"[z-a]", "a range out of order"},       {"a{2,1}", "n < m"},
      {"a{5000}", "a repetition count above"}, {"[^\\s\\S]", "matches no character"},
      {"\\", "a trailing backslash"},          {"\\q", "the escape \\q"},
      {"\\uD800", "surrogate"},                {"\xFF", "not UTF-8"},
  };
  for (const auto& [p, want] : cases) {
    auto e = RegexToGbnf(p);
    ASSERT_FALSE(e.ok()) << p;
    EXPECT_NE(e.status().message().find(want), std::string::npos) << p << ": " << e.status().message();
  }
  // Anchors at the edges of each top-level alternative are fine, and mean what they say.
  RegexOptions search;
  search.search = true;
  const Grammar g = RegexGrammar("^ab|cd$", search);
  EXPECT_TRUE(Matches(g, "abX"));
  EXPECT_FALSE(Matches(g, "Xab"));
  EXPECT_TRUE(Matches(g, "Xcd"));
  EXPECT_FALSE(Matches(g, "cdX"));
}

// Hostile patterns are refused or compiled within bounded time, never a hang or a crash.
TEST(RegexTest, HostilePatternsAreBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& p : {std::string(100000, '('), std::string(5000, '(') + "a" + std::string(5000, ')'),
                               std::string(3000, 'a') + "?" + std::string("(a?){3000}") + "*"}) {
    EXPECT_FALSE(CompileRegex(p).ok()) << p.substr(0, 40);
  }
  auto nested = CompileRegex("((a{1000}){1000}){1000}");  // a rule per level: small
  ASSERT_TRUE(nested.ok());
  EXPECT_FALSE(Matches(*nested, "aaaa"));
  auto ambiguous = CompileRegex("(a|b|)*(a*)*(a?)+");
  ASSERT_TRUE(ambiguous.ok()) << ambiguous.status().message();
  EXPECT_TRUE(Matches(*ambiguous, "abab"));
  auto long_literal = CompileRegex(std::string(200000, 'a'));
  ASSERT_TRUE(long_literal.ok());
  EXPECT_FALSE(Matches(*long_literal, "a"));
  auto dashes = CompileRegex("[" + std::string(100000, '-') + "]");
  ASSERT_TRUE(dashes.ok());
  EXPECT_TRUE(Matches(*dashes, "-"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

// JSON Schema `pattern`: the decoded string matches somewhere, quotes and backslashes
// written escaped.
TEST(RegexTest, SchemaPatternMatchesTheDecodedString) {
  auto g = CompileJsonSchema(R"({"type": "string", "pattern": "^[a-z\"\\\\]{2,3}-\\d$"})");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(Matches(*g, R"("ab-1")"));
  EXPECT_TRUE(Matches(*g, R"("a\"\\-7")"));
  EXPECT_FALSE(Matches(*g, R"("a"-7")"));
  EXPECT_FALSE(Matches(*g, R"("abcd-1")"));
  auto anywhere = CompileJsonSchema(R"({"type": "string", "pattern": "x+y"})");
  ASSERT_TRUE(anywhere.ok());
  EXPECT_TRUE(Matches(*anywhere, R"("--xxy\n\u00e9")"));
  EXPECT_FALSE(Matches(*anywhere, R"("yx")"));
}

}  // namespace
}  // namespace trellis::grammar

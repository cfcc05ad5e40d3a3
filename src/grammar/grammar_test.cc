#include "grammar/grammar.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "grammar/stacks.h"
#include "util/test_files.h"

namespace trellis::grammar {
namespace {

Grammar MustParse(std::string_view text) {
  auto g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << text;
  return g.ok() ? std::move(*g) : Grammar{};
}

struct MatchCase {
  const char* grammar;
  std::vector<std::string> accept;
  std::vector<std::string> reject;
};

TEST(GbnfTest, MatchesWhatTheGrammarSays) {
  const MatchCase cases[] = {
      {R"~(root ::= "yes" | "no")~", {"yes", "no"}, {"", "y", "yess", "No"}},
      {R"~(root ::= [a-c]+ "!")~", {"a!", "abcabc!"}, {"!", "abd!", "a"}},
      {R"~(root ::= [^a-z]*)~", {"", "ABC", "123 !", "\xC3\x89T\xC3\x89" /* ÉTÉ */}, {"a", "\xC3\xA9t\xC3\xA9"}},
      {R"~(root ::= "x"{2,4})~", {"xx", "xxx", "xxxx"}, {"x", "xxxxx"}},
      {R"~(root ::= "x"{3})~", {"xxx"}, {"xx", "xxxx"}},
      {R"~(root ::= "x"{2,})~", {"xx", "xxxxxxxx"}, {"x"}},
      {R"~(root ::= ("ab" | "c")* "d"?)~", {"", "ab", "cab", "abcd", "d"}, {"a", "abd d", "dd"}},
      {"root ::= greeting \" \" name\ngreeting ::= \"hi\" | \"hello\"\nname ::= [A-Z] [a-z]*",
       {"hi Bob", "hello A"},
       {"hi bob", "hey Bob"}},
      {R"~(root ::= "\x41\u00e9\U0001F600\n\t\\\"\[\]")~", {"A\xC3\xA9\xF0\x9F\x98\x80\n\t\\\"[]"}, {"A"}},
      {R"~(root ::= [\u4e00-\u9fff]+)~", {"\xE4\xB8\xAD\xE6\x96\x87"}, {"a", "\xE4\xB8"}},
      {R"~(root ::= .)~", {"a", "\xC3\xA9", "\xF0\x9F\x98\x80"}, {"", "ab", "\xC3", "\xC0\x80", "\xED\xA0\x80"}},
      // A rule continues across lines inside parentheses and after '|'.
      {"root ::= (\n  \"a\"\n  \"b\"\n) |\n  \"c\"\n", {"ab", "c"}, {"a"}},
      // Comments anywhere.
      {"# top\nroot ::= \"a\" # the letter\n  # more\n", {"a"}, {"b"}},
      // Right recursion of any depth.
      {R"~(root ::= "(" root ")" | "")~", {"", "()", "((()))"}, {"(()", ")("}},
  };
  for (const MatchCase& c : cases) {
    SCOPED_TRACE(c.grammar);
    const Grammar g = MustParse(c.grammar);
    for (const auto& s : c.accept) EXPECT_TRUE(Matches(g, s)) << "should accept '" << s << "'";
    for (const auto& s : c.reject) EXPECT_FALSE(Matches(g, s)) << "should reject '" << s << "'";
  }
}

TEST(GbnfTest, PrefixesOfCodePointsOnlyWhereAMemberCanFollow) {
  // [\u00e0-\u00ff]: C3 A0..C3 BF. C3 alone is a prefix; C3 80 is not (U+00C0 is outside).
  const Grammar g = MustParse(R"~(root ::= [\u00e0-\u00ff])~");
  EXPECT_TRUE(IsPrefix(g, "\xC3"));
  EXPECT_FALSE(IsPrefix(g, "\xC3\x80"));
  EXPECT_TRUE(Matches(g, "\xC3\xA0"));
  EXPECT_FALSE(IsPrefix(g, "\xC4"));
  // Overlong and surrogate encodings are never prefixes of anything.
  const Grammar any = MustParse("root ::= .*");
  EXPECT_FALSE(IsPrefix(any, "\xC0"));
  EXPECT_FALSE(IsPrefix(any, "\xE0\x80"));
  EXPECT_FALSE(IsPrefix(any, "\xED\xA0"));
  EXPECT_FALSE(IsPrefix(any, "\xF4\x90"));
  EXPECT_FALSE(IsPrefix(any, "\xF5"));
  EXPECT_TRUE(IsPrefix(any, "\xF4\x8F\xBF"));
}

TEST(GbnfTest, RefusesBadGrammarsNamingTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "no 'root' rule"},
      {"other ::= \"a\"", "no 'root' rule"},
      {"root ::= missing", "'missing' is used but never defined"},
      {"root ::= root \"a\" | \"b\"", "left-recursive"},
      {"root ::= x\nx ::= y \"a\"\ny ::= \"\" | x", "left-recursive"},
      {"root ::= \"a\"* root | \"b\"", "left-recursive"},
      {"root ::= \"abc", "unterminated string"},
      {"root ::= [abc", "unterminated character class"},
      {"root ::= \"\\q\"", "unknown escape"},
      {"root ::= \"\\x4\"", "hex digits"},
      {"root ::= [z-a]", "end before its start"},
      {"root ::= * \"a\"", "nothing before it"},
      {"root ::= \"a\"{5,2}", "n < m"},
      {"root ::= \"a\"{1,100000}", "above"},
      {"root ::= (\"a\"", "expected ')'"},
      {"root ::= \"a\" )", "expected the end of the rule"},
      {"root = \"a\"", "'::='"},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
      {"root ::= x\nx ::= x \"a\" | \"b\"", "left-recursive"},
      {"root ::= x\nx ::= \"a\" x", "can never match"},  // no way out of x
      {"root ::= [^\\x00-\\U0010FFFF]", "can never match"},
      {"root ::= \"\xFF\"", "malformed UTF-8"},
  };
  for (auto [text, want] : cases) {
    auto g = ParseGbnf(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(want), std::string::npos) << text << " -> " << g.status().message();
  }
}

TEST(GbnfTest, DropsAlternativesThatCanNeverComplete) {
  // `dead` can never finish, so "b" dead is not an option: "b" must not be a prefix.
  const Grammar g = MustParse("root ::= \"a\" | \"b\" dead\ndead ::= \"c\" dead");
  EXPECT_TRUE(Matches(g, "a"));
  EXPECT_FALSE(IsPrefix(g, "b"));
}

TEST(GbnfTest, HostileGrammarsAreRefusedOrBoundedQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  // Nesting far past the limit.
  std::string deep = "root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')');
  auto g = ParseGbnf(deep);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("nested deeper"), std::string::npos);
  // Nested repetitions stay small: each level repeats one reference, not the text.
  g = ParseGbnf("root ::= ((((\"abcdefgh\"{1000}){1000}){1000}){1000})");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_LT(g->elements.size(), 20000u);
  // Too large a source.
  g = ParseGbnf("root ::= \"" + std::string(2 << 20, 'a') + "\"");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("bytes"), std::string::npos);
  // A chain of 200 nullable diamonds: 2^200 paths, but each frame is expanded once.
  std::string chain = "root ::=";
  for (int i = 0; i < 200; ++i) chain += " d";
  chain += " \"z\"\nd ::= e | f\ne ::= \"x\" | \"\"\nf ::= \"y\" | \"\"";
  const Grammar diamonds = MustParse(chain);
  EXPECT_TRUE(Matches(diamonds, "z"));
  EXPECT_TRUE(Matches(diamonds, "xyxz"));
  // Exponentially many rules are bounded by max_rules.
  std::string many;
  for (int i = 0; i < 20000; ++i) many += "r" + std::to_string(i) + " ::= \"a\"\n";
  g = ParseGbnf("root ::= r0\n" + many);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("rules"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

TEST(GbnfTest, AmbiguityIsCappedNotFollowed) {
  // Every split of a run of a's into x's and y's is a distinct parse with a distinct stack
  // depth below the top: the set would grow without bound.
  const Grammar g = MustParse("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"");
  StackArena arena;
  StackMachine m(g, arena);
  std::vector<StackId> set;
  ASSERT_TRUE(m.Start(set).ok());
  Status st = m.AdvanceBytes(set, std::string(20, 'a'));
  // 2^k continuations after k a's: refused once past kMaxStacks.
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
}

TEST(GbnfTest, SmallRulesAreInlinedWhereAlternativesStart) {
  // x* with x ::= [a-z] | "\\" [nt]: the star rule reads x's characters itself, so a
  // token of many letters stays in one frame (token_mask.h).
  const Grammar g = MustParse(R"~(root ::= "<" x* ">"
x ::= [a-z] | "\\" [nt])~");
  const std::string printed = g.ToGbnf();
  EXPECT_NE(printed.find("::= [a-z] star-"), std::string::npos) << printed;
  EXPECT_TRUE(Matches(g, "<ab\\ncd>"));
  EXPECT_FALSE(Matches(g, "<ab\\x>"));
  // Rules that may start empty are not inlined (it would multiply alternatives).
  const Grammar e = MustParse("root ::= y \"z\"\ny ::= \"a\" | \"\"");
  EXPECT_NE(e.ToGbnf().find("root ::= y"), std::string::npos) << e.ToGbnf();
}

TEST(GbnfTest, PrintedGrammarParsesToTheSameGrammar) {
  const char* text = R"~(root ::= item ("," item)* [\u00e9\-\]]? "\"q\""
item ::= [a-z0-9_]+ | "(" root ")" | [^\x00-\x1f]{0,3})~";
  const Grammar g = MustParse(text);
  const std::string printed = g.ToGbnf();
  const Grammar again = MustParse(printed);
  EXPECT_EQ(again.ToGbnf(), printed);
  EXPECT_EQ(again.Hash(), g.Hash());
  EXPECT_NE(MustParse("root ::= \"a\"").Hash(), MustParse("root ::= \"b\"").Hash());
}

// Every grammar in tests/data/grammars parses, and its .txt sample lines (if any)
// "+ text" must match and "- text" must not.
TEST(GbnfTest, SampleGrammarsParseAndMatchTheirSamples) {
  const std::string dir = std::string(TRELLIS_TEST_DATA) + "/grammars/";
  for (const char* name : {"json", "arithmetic", "list", "c", "chess", "japanese"}) {
    SCOPED_TRACE(name);
    const std::string text = trellis::testing::ReadFileBytes(dir + name + ".gbnf");
    ASSERT_FALSE(text.empty()) << dir << name << ".gbnf";
    const Grammar g = MustParse(text);
    std::istringstream samples(trellis::testing::ReadFileBytes(dir + name + ".samples"));
    std::string line;
    int n = 0;
    while (std::getline(samples, line)) {
      if (line.size() < 2) continue;
      std::string s = line.substr(2);
      for (size_t p; (p = s.find("\\n")) != std::string::npos;) s.replace(p, 2, "\n");
      if (line[0] == '+') {
        EXPECT_TRUE(Matches(g, s)) << "should accept: " << s;
      } else if (line[0] == '-') {
        EXPECT_FALSE(Matches(g, s)) << "should reject: " << s;
      }
      ++n;
    }
    EXPECT_GT(n, 3);
  }
}

}  // namespace
}  // namespace trellis::grammar

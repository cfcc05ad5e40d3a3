#include "grammar/token_mask.h"

#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "util/test_files.h"

namespace trellis::grammar {
namespace {

// A vocabulary shaped like a real one: every single byte, JSON and code fragments, words
// with and without a leading space, multi-byte characters, pieces that split a character
// (byte-fallback style), two control tokens (no bytes) and an end token.
std::shared_ptr<const TokenVocabulary> MakeVocab(uint64_t seed, int n_words, int32_t* eog_out = nullptr) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> pieces;
  pieces.push_back("");  // a control token
  for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
  for (const char* f : {"{\"", "\":", "\": ", "\", \"", "\"}", "}", "},", "[{", "]}", "true", "false", "null", " {",
                        "\n", "\n  ", "  ", "\\n", "\\\"", "\\u00", "0.", "12", "-1", "e+", "()", "();", " = ", "int ",
                        "return", " return 0;", "1. e4", " Nf3", "O-O", "- ", "こんにちは", "。", "日本", "語を",
                        "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xC3", "\xA9", "\xE2\x82", "\x82\xAC",
                        // across the ends of several rules at once
                        "ab,", "x:.", "b,:.-", ":.-", "z.-", "1,", "7}", "42}", "\":1", "ab\":", "c\":9,"}) {
    pieces.emplace_back(f);
  }
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_\"{}[],:.- ";
  for (int i = 0; i < n_words; ++i) {
    std::string w = (rng() % 2) ? " " : "";
    const int len = 1 + static_cast<int>(rng() % 7);
    for (int k = 0; k < len; ++k) w += letters[rng() % letters.size()];
    pieces.push_back(w);
  }
  pieces.push_back(pieces[300]);  // a duplicate piece under another id
  pieces.push_back("");           // another control token
  const auto eog = static_cast<int32_t>(pieces.size());
  pieces.push_back("</s>");  // its text must never be matched as text
  if (eog_out) *eog_out = eog;
  return std::make_shared<TokenVocabulary>(std::move(pieces), std::vector<int32_t>{eog});
}

// The mask against the slow reference: every token tried alone from the current state.
void ExpectMaskExact(GrammarMatcher& m, const TokenMask& mask) {
  const TokenVocabulary& v = m.compiled().vocab();
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    bool want;
    if (v.is_eog(id)) {
      want = m.complete();
    } else if (v.piece(id).empty()) {
      want = false;
    } else {
      auto r = m.Allows(v.piece(id));
      ASSERT_TRUE(r.ok()) << r.status().message();
      want = *r;
    }
    ASSERT_EQ(mask.Test(id), want) << "token " << id << " '" << v.piece(id) << "'";
  }
}

// Walks `steps` random allowed tokens, checking the mask exactly at every step and that a
// refused token is refused by Accept and leaves the state as it was.
// `out`, when given, receives the compiled grammar.
void RandomWalks(const Grammar& g, int walks, int steps, uint64_t seed,
                 std::shared_ptr<const CompiledGrammar>* out = nullptr) {
  auto vocab = MakeVocab(seed, 400);
  auto compiled = std::make_shared<CompiledGrammar>(g, vocab);
  if (out) *out = compiled;
  std::mt19937_64 rng(seed);
  TokenMask mask(vocab->n_vocab());
  int completed = 0;
  for (int w = 0; w < walks; ++w) {
    auto m = GrammarMatcher::Make(compiled);
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::string doc;
    for (int s = 0; s < steps && !(*m)->ended(); ++s) {
      ASSERT_TRUE((*m)->FillMask(mask).ok());
      ExpectMaskExact(**m, mask);
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<int32_t> allowed, refused;
      for (int32_t id = 0; id < vocab->n_vocab(); ++id) (mask.Test(id) ? allowed : refused).push_back(id);
      ASSERT_FALSE(allowed.empty()) << "dead end after '" << doc << "'";
      if (!refused.empty()) {
        const int32_t bad = refused[rng() % refused.size()];
        EXPECT_FALSE((*m)->Accept(bad).ok()) << "accepted refused token '" << vocab->piece(bad) << "'";
      }
      // Prefer to keep going: end only when the walk is long or ending is all there is.
      int32_t pick = allowed[rng() % allowed.size()];
      if (vocab->is_eog(pick) && allowed.size() > 1 && s < steps / 2) pick = allowed[(rng() % (allowed.size() - 1))];
      ASSERT_TRUE((*m)->Accept(pick).ok()) << "'" << vocab->piece(pick) << "' after '" << doc << "'";
      if (!vocab->is_eog(pick)) doc += vocab->piece(pick);
    }
    if ((*m)->ended()) {
      ++completed;
      // A document the walk completed is a document of the grammar.
      auto fresh = GrammarMatcher::Make(compiled);
      ASSERT_TRUE((*fresh)->AcceptBytes(doc).ok()) << doc;
      EXPECT_TRUE((*fresh)->complete()) << doc;
    }
  }
  EXPECT_GT(compiled->cached_positions(), 0u);
  (void)completed;
}

Grammar Parse(std::string_view text) {
  auto g = ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? std::move(*g) : Grammar{};
}

TEST(TokenMaskTest, ExactOnSampleGrammars) {
  const std::string dir = std::string(TRELLIS_TEST_DATA) + "/grammars/";
  uint64_t seed = 1;
  for (const char* name : {"json", "arithmetic", "c", "chess", "japanese", "list"}) {
    SCOPED_TRACE(name);
    RandomWalks(Parse(trellis::testing::ReadFileBytes(dir + name + ".gbnf")), 6, 40, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(TokenMaskTest, ExactAcrossSplitCharactersAndStars) {
  // Multi-byte classes inside stars, where tokens end mid-character; and a star followed
  // by a literal that shares its first byte with the star's class.
  const char* grammars[] = {
      R"~(root ::= "\"" [^"\\]* "\"")~",
      R"~(root ::= [\u00e0-\u00ff\u20ac]* "." | "\u00e9" "x"*)~",
      R"~(root ::= ("ab" | "a")* "abc")~",
      R"~(root ::= [a-z]+ ("," [a-z]+)* | "")~",
  };
  uint64_t seed = 100;
  for (const char* g : grammars) {
    SCOPED_TRACE(g);
    RandomWalks(Parse(g), 8, 30, seed++);
    if (HasFatalFailure()) return;
  }
}

TEST(TokenMaskTest, ExactWhereTheFramesBelowDecide) {
  // Rules that may end at once (bounded strings, optional tails) leave every token they
  // refuse to the frames below; such positions are keyed with more frames, up to the
  // bound and up to the whole stack. Nested four deep, and at the root.
  const char* grammars[] = {
      R"~(root ::= "{" kv ("," kv)* "}"
kv ::= "\"" str "\":" num
str ::= [a-z]{0,12}
num ::= [0-9]{1,5})~",
      R"~(root ::= a "-"
a ::= b "."?
b ::= c ":"?
c ::= d ","?
d ::= [a-z ]{0,6})~",
      R"~(root ::= [a-z]{0,8})~",
  };
  uint64_t seed = 200;
  for (const char* g : grammars) {
    SCOPED_TRACE(g);
    std::shared_ptr<const CompiledGrammar> compiled;
    RandomWalks(Parse(g), 8, 30, seed++, &compiled);
    if (HasFatalFailure()) return;
    if (std::string_view(g).starts_with("root ::= [")) continue;  // one frame, the whole stack: nothing to expand
    EXPECT_GT(compiled->expanded_positions(), 0u);
  }
}

TEST(TokenMaskTest, EndTokenOnlyWhenCompleteAndForcedAtTheEnd) {
  int32_t eog = 0;
  auto vocab = MakeVocab(7, 50, &eog);
  auto compiled = std::make_shared<CompiledGrammar>(Parse(R"~(root ::= "ok" "!"?)~"), vocab);
  auto m = *GrammarMatcher::Make(compiled);
  TokenMask mask(vocab->n_vocab());
  ASSERT_TRUE(m->FillMask(mask).ok());
  EXPECT_FALSE(mask.Test(eog));
  EXPECT_FALSE(m->Accept(eog).ok());
  ASSERT_TRUE(m->AcceptBytes("ok").ok());
  ASSERT_TRUE(m->FillMask(mask).ok());
  EXPECT_TRUE(mask.Test(eog));
  EXPECT_TRUE(mask.Test('!' + 1));  // the single-byte token "!" (id = byte + 1)
  ASSERT_TRUE(m->AcceptBytes("!").ok());
  EXPECT_TRUE(m->only_end());
  ASSERT_TRUE(m->FillMask(mask).ok());
  EXPECT_EQ(mask.Count(), 1u);
  EXPECT_TRUE(mask.Test(eog));
  ASSERT_TRUE(m->Accept(eog).ok());
  EXPECT_TRUE(m->ended());
  EXPECT_FALSE(m->Accept('a' + 1).ok());
}

TEST(TokenMaskTest, ControlTokensAndTheEndTokensTextAreNeverText) {
  int32_t eog = 0;
  auto vocab = MakeVocab(9, 20, &eog);
  // The grammar accepts the end token's text, but the end token is not that text.
  auto compiled = std::make_shared<CompiledGrammar>(Parse(R"~(root ::= "</s>" "x")~"), vocab);
  auto m = *GrammarMatcher::Make(compiled);
  TokenMask mask(vocab->n_vocab());
  ASSERT_TRUE(m->FillMask(mask).ok());
  EXPECT_FALSE(mask.Test(eog));
  EXPECT_FALSE(mask.Test(0));
  EXPECT_TRUE(mask.Test('<' + 1));
  EXPECT_FALSE(m->Accept(0).ok());
}

TEST(TokenMaskTest, LongDocumentsKeepMemoryBounded) {
  // Every step builds frames for the paths its mask tries (on top of a stack that is new
  // each step, so nothing is shared); the arena is compacted to the live stacks, and the
  // state after compaction still works.
  auto vocab = MakeVocab(11, 50);
  auto compiled = std::make_shared<CompiledGrammar>(Parse(R"~(root ::= "[" item ("," item)* "]"
item ::= "x" | "[" item ("," item)* "]")~"), vocab);
  auto m = *GrammarMatcher::Make(compiled);
  TokenMask mask(vocab->n_vocab());
  size_t peak = 0;
  for (int i = 0; i < 30000; ++i) {
    ASSERT_TRUE(m->AcceptBytes("[").ok());
    ASSERT_TRUE(m->FillMask(mask).ok());
    ASSERT_TRUE(*m->Allows("x,[x,[x,x],x],[[x]]"));  // a path tried and dropped
    peak = std::max(peak, m->arena_frames());
  }
  EXPECT_LT(peak, size_t{1} << 19);
  ASSERT_TRUE(m->AcceptBytes("x").ok());
  for (int i = 0; i < 30000; ++i) ASSERT_TRUE(m->AcceptBytes("]").ok());
  EXPECT_TRUE(m->complete());
}

}  // namespace
}  // namespace trellis::grammar

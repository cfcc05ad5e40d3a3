// libFuzzer target for the grammar engine (src/grammar), built only with -DTRELLIS_FUZZ=ON
// and clang. Grammars and schemas come from clients: hostile.
//
// Input: one mode byte (even: GBNF; 1 mod 4: JSON Schema; 3 mod 4: a regular expression,
// matched whole) and the text. Compiling may fail
// (then with a message); a compiled grammar is bound to a small vocabulary and walked for
// up to 24 steps, the input's bytes choosing the tokens. At every step the mask must equal
// the one-token-at-a-time reference, an allowed token must be accepted, a refused one
// refused. Never a crash, a hang or an empty error message.
//
// Run: grammar_fuzz -max_total_time=300 -max_len=4096 -dict=tests/data/grammar_corpus.dict \
//        /tmp/new-corpus tests/data/grammar_corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "grammar/token_mask.h"

namespace trellis::grammar {
namespace {

#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "grammar_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

std::shared_ptr<const TokenVocabulary> Vocab() {
  static const auto v = [] {
    std::vector<std::string> pieces;
    pieces.push_back("");  // a control token
    for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
    for (const char* p : {"{\"", "\":", "\",", "\"}", "true", "null", " a", "ab", "\xC3\xA9", "\xC3", "\xA9", "12",
                          "()", "\\n", "\\\"", "  "}) {
      pieces.emplace_back(p);
    }
    const int32_t eog = static_cast<int32_t>(pieces.size());
    pieces.emplace_back("</s>");
    return std::make_shared<TokenVocabulary>(std::move(pieces), std::vector<int32_t>{eog});
  }();
  return v;
}

void Run(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  GrammarLimits limits;
  limits.max_rules = 512;
  limits.max_elements = 1 << 14;
  limits.max_repetition = 64;
  auto g = (data[0] & 3) == 3 ? CompileRegex(text, limits)
           : (data[0] & 1)    ? CompileJsonSchema(text, limits)
                              : ParseGbnf(text, limits);
  if (!g.ok()) {
    FUZZ_CHECK(!g.status().message().empty());
    return;
  }
  auto compiled = std::make_shared<CompiledGrammar>(std::move(*g), Vocab());
  auto m = GrammarMatcher::Make(compiled);
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kResourceExhausted);  // too ambiguous
    return;
  }
  const TokenVocabulary& v = *Vocab();
  TokenMask mask(v.n_vocab());
  for (size_t step = 0; step < 24 && !(*m)->ended(); ++step) {
    if (Status st = (*m)->FillMask(mask); !st.ok()) {
      FUZZ_CHECK(st.code() == StatusCode::kResourceExhausted);
      return;
    }
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
      bool want;
      if (v.is_eog(id)) {
        want = (*m)->complete();
      } else if (v.piece(id).empty()) {
        want = false;
      } else {
        auto r = (*m)->Allows(v.piece(id));
        if (!r.ok()) return;  // ambiguity past the bound on this path
        want = *r;
      }
      FUZZ_CHECK(mask.Test(id) == want);
      if (want) allowed.push_back(id);
    }
    FUZZ_CHECK(!allowed.empty());  // every live state can be completed
    const uint8_t pick = data[(step * 7 + 1) % size];
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
      if (!mask.Test(id)) {
        FUZZ_CHECK(!(*m)->Accept(id).ok());
        break;
      }
    }
    if (Status st = (*m)->Accept(allowed[pick % allowed.size()]); !st.ok()) {
      FUZZ_CHECK(st.code() == StatusCode::kResourceExhausted);
      return;
    }
  }
}

}  // namespace
}  // namespace trellis::grammar

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trellis::grammar::Run(data, size);
  return 0;
}

// Constrained decoding end to end in the scheduler, and exact masks on real vocabularies.
#include "engine/constraint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <random>

#include "engine/scheduler.h"
#include "engine/test_models.h"
#include "engine/test_scheduler.h"
#include "util/slowdown.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "model/gguf.h"
#include "util/thread_pool.h"

namespace trellis {
namespace {

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << path;
  auto t = Tokenizer::FromGguf(*f);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

// A small random model (f32, the reference models' 1024-token vocabulary), its tokenizer
// and a scheduler over it; `ok()` is false (with a failure recorded) if any part failed.
struct SmallEngine {
  explicit SmallEngine(const std::string& name) {
    const std::string path = testing::WriteSmallModel(name, "f32");
    auto m = Model::Load(path);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return;
    model = std::move(m).value();
    tok = LoadTokenizer(path);
    SchedulerOptions o;
    o.block_size = 16;
    o.kv_blocks = 400;
    o.n_ctx = 512;
    auto s = Scheduler::Create(*model, o, pool);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) sched = std::move(s).value();
  }
  bool ok() const { return model && tok && sched; }
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  ThreadPool pool{2};
  std::unique_ptr<Scheduler> sched;
};

constexpr const char* kPersonSchema = R"~({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "long tag"]}, "maxItems": 3},
    "ok": {"type": "boolean"},
    "note": {"anyOf": [{"type": "null"}, {"type": "number"}]}
  },
  "required": ["name", "age", "tags", "ok"],
  "additionalProperties": false
})~";

// Walks `walks` random documents of `g` `steps` tokens deep on `vocab`; at every step the
// mask must equal the tokens that, tried alone, keep the document completable.
void CheckMasksExact(const grammar::Grammar& g, const std::shared_ptr<const grammar::TokenVocabulary>& vocab,
                     int walks, int steps, uint64_t seed) {
  auto compiled = std::make_shared<grammar::CompiledGrammar>(g, vocab);
  std::mt19937_64 rng(seed);
  grammar::TokenMask mask(vocab->n_vocab());
  for (int walk = 0; walk < walks; ++walk) {
    auto m = *grammar::GrammarMatcher::Make(compiled);
    for (int step = 0; step < steps && !m->ended(); ++step) {
      ASSERT_TRUE(m->FillMask(mask).ok());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
        bool want = vocab->is_eog(id) ? m->complete() : !vocab->piece(id).empty() && *m->Allows(vocab->piece(id));
        ASSERT_EQ(mask.Test(id), want) << "token " << id << " '" << vocab->piece(id) << "' at walk " << walk
                                       << " step " << step;
        if (want) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      // Half the steps take the longest allowed piece (deep into a rule in one token,
      // across rule boundaries), half a random one.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2) {
        for (int32_t id : allowed) {
          if (vocab->piece(id).size() > vocab->piece(pick).size()) pick = id;
        }
      }
      ASSERT_TRUE(m->Accept(pick).ok());
    }
  }
}

std::string ReadData(const std::string& rel) {
  std::ifstream f(std::string(TRELLIS_TEST_DATA) + "/" + rel);
  EXPECT_TRUE(f.good()) << rel;
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// For random positions of random valid documents, the mask equals the tokens that, tried
// alone, keep the document completable: on the Llama SentencePiece (32k), GPT-2 BPE (50k)
// and Qwen3 (151k, byte-level BPE with CJK and code pieces) vocabularies, whose pieces
// split characters, carry leading spaces and merge punctuation with letters; for a JSON
// Schema, llama.cpp-style GBNF grammars (JSON, C, arithmetic) and a regular expression.
TEST(ConstraintTest, MaskIsExactOnRealVocabularies) {
  auto schema = grammar::CompileJsonSchema(kPersonSchema);
  ASSERT_TRUE(schema.ok()) << schema.status().message();
  std::vector<std::pair<std::string, grammar::Grammar>> grammars = {{"person schema", *schema}};
  for (const char* file : {"json.gbnf", "c.gbnf", "arithmetic.gbnf"}) {
    auto g = grammar::ParseGbnf(ReadData(std::string("grammars/") + file));
    ASSERT_TRUE(g.ok()) << file << ": " << g.status().message();
    grammars.emplace_back(file, *g);
  }
  auto re = grammar::CompileRegex(R"([a-z]{2,6}(\.[a-z]+)?@(x|yz)\.com( #[0-9]{1,3})?)");
  ASSERT_TRUE(re.ok()) << re.status().message();
  grammars.emplace_back("regex", *re);
  for (const char* file : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "qwen3-vocab.gguf"}) {
    SCOPED_TRACE(file);
    const bool large = std::string_view(file) == "qwen3-vocab.gguf";
    if (TestEmulated() && large) continue;  // slowdown.h
    auto tok = LoadTokenizer(std::string(TRELLIS_TEST_DATA) + "/vocab/" + file);
    auto vocab = MakeTokenVocabulary(*tok);
    for (const auto& [name, g] : grammars) {
      SCOPED_TRACE(name);
      // 151k reference checks a step: the schema only, one shorter walk.
      if (large && name != "person schema") continue;
      CheckMasksExact(g, vocab, large ? 1 : 3, large ? 8 : 12, 5);
      if (HasFatalFailure()) return;
    }
  }
}

// Control tokens named as rendered (a tool-call syntax's markers) count as their text:
// the decoder shows them, and a grammar that writes their text may pick them; others stay
// without bytes. Phi-3's vocabulary has <|user|> and <|end|> as control tokens.
TEST(ConstraintTest, RenderedControlTokensCountAsTheirText) {
  auto tok = LoadTokenizer(std::string(TRELLIS_TEST_DATA) + "/vocab/ggml-vocab-phi-3.gguf");
  const std::vector<int32_t> user = tok->Encode("<|user|>", false, true);
  const std::vector<int32_t> end = tok->Encode("<|end|>", false, true);
  ASSERT_EQ(user.size(), 1u);
  ASSERT_EQ(end.size(), 1u);
  ASSERT_EQ(tok->TokenToPiece(user[0]), "");  // a control token
  StreamDecoder plain(*tok);
  EXPECT_EQ(plain.Push(user[0]), "");
  StreamDecoder shown(*tok, std::vector<int32_t>{user[0]});
  EXPECT_EQ(shown.Push(user[0]), "<|user|>");
  EXPECT_EQ(shown.Push(end[0]), "");

  auto g = grammar::ParseGbnf(R"(root ::= "<|user|>" [a-z]+)");
  ASSERT_TRUE(g.ok());
  const std::vector<int32_t> rendered = {user[0]};
  auto vocab = MakeTokenVocabulary(*tok, rendered);
  EXPECT_EQ(vocab->piece(user[0]), "<|user|>");
  EXPECT_EQ(vocab->piece(end[0]), "");
  auto m = *grammar::GrammarMatcher::Make(std::make_shared<grammar::CompiledGrammar>(*g, vocab));
  grammar::TokenMask mask(vocab->n_vocab());
  ASSERT_TRUE(m->FillMask(mask).ok());
  EXPECT_TRUE(mask.Test(user[0]));
  auto without = *grammar::GrammarMatcher::Make(std::make_shared<grammar::CompiledGrammar>(*g, MakeTokenVocabulary(*tok)));
  ASSERT_TRUE(without->FillMask(mask).ok());
  EXPECT_FALSE(mask.Test(user[0]));
}

// A random-weight model never writes valid JSON by itself: held to the schema's grammar,
// every answer over seeds and temperatures is a complete document of the schema that
// ends with the end token, and reads back as the object the schema describes.
TEST(ConstraintTest, EveryConstrainedAnswerIsValid) {
  SmallEngine e("constraint.gguf");
  ASSERT_TRUE(e.ok());
  const Tokenizer* tok = e.tok.get();
  auto g = grammar::CompileJsonSchema(kPersonSchema);
  ASSERT_TRUE(g.ok());
  GrammarCache cache(MakeTokenVocabulary(*tok));
  auto compiled = cache.Get(*g);
  EXPECT_EQ(cache.Get(*g), compiled);  // the same grammar compiles once
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt = {1, static_cast<int32_t>(10 + i), 20, 30};
    r.max_tokens = 480;
    r.sampling.temperature = std::vector<float>{0.0f, 0.8f, 1.5f}[static_cast<size_t>(i % 3)];
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = 1000 + static_cast<uint64_t>(i);
    r.is_stop = [tok](int32_t id) { return tok->IsEog(id); };
    r.grammar = compiled;
    reqs.push_back(r);
  }
  auto out = testing::RunAll(*e.sched, reqs);
  for (size_t i = 0; i < out.size(); ++i) {
    SCOPED_TRACE(i);
    const RequestResult& res = out[i].result;
    ASSERT_EQ(res.reason, FinishReason::kStop) << FinishReasonName(res.reason) << " " << res.error.ToString();
    ASSERT_FALSE(res.tokens.empty());
    EXPECT_TRUE(tok->IsEog(res.tokens.back()));
    std::string text;
    for (size_t k = 0; k + 1 < res.tokens.size(); ++k) text += tok->TokenToPiece(res.tokens[k]);
    auto check = *grammar::GrammarMatcher::Make(compiled);
    ASSERT_TRUE(check->AcceptBytes(text).ok()) << text;
    EXPECT_TRUE(check->complete()) << text;
    // Independently of the grammar: the JSON reader's view of the answer.
    const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(doc.is_object()) << text;
    EXPECT_TRUE(doc["name"].is_string() && doc["age"].is_number_integer() && doc["tags"].is_array() && doc["ok"].is_boolean()) << text;
    EXPECT_LE(doc["tags"].size(), 3u) << text;
    for (const auto& [k, v] : doc.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags" || k == "ok" || k == "note") << text;
  }
}

// Unconstrained, the same model does not write such documents: the check above has teeth.
TEST(ConstraintTest, UnconstrainedAnswersAreNotJson) {
  SmallEngine e("constraint_free.gguf");
  ASSERT_TRUE(e.ok());
  Request r;
  r.prompt = {1, 10, 20, 30};
  r.max_tokens = 40;
  r.sampling.temperature = 0.8f;
  auto out = testing::RunAll(*e.sched, {r});
  std::string text;
  for (int32_t t : out[0].result.tokens) text += e.tok->TokenToPiece(t);
  EXPECT_FALSE(nlohmann::json::accept(text)) << text;
}

}  // namespace
}  // namespace trellis

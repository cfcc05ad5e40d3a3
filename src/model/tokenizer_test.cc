#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "model/gguf_writer.h"
#include "model/unicode.h"
#include "util/slowdown.h"
#include "util/test_files.h"

namespace trellis {
namespace {

const std::string kVocabDir = std::string(TRELLIS_TEST_DATA) + "/vocab/";

struct VocabCase {
  std::string input;
  std::vector<int32_t> expected;
};

// *.inp holds the inputs separated by "\n__ggml_vocab_test__\n" (the file ends with one);
// *.out one line of space-separated ids per input (llama.cpp's test-tokenizer-0 format).
std::vector<VocabCase> ReadCases(const std::string& vocab) {
  const std::string inp = trellis::testing::ReadFileBytes(kVocabDir + vocab + ".inp");
  const std::string out = trellis::testing::ReadFileBytes(kVocabDir + vocab + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(inp.substr(pos));
      break;
    }
    inputs.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<VocabCase> cases;
  std::istringstream lines(out);
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    VocabCase c;
    if (i < inputs.size()) c.input = inputs[i];
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.expected.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(inputs.size(), cases.size()) << vocab;
  return cases;
}

std::unique_ptr<Tokenizer> Load(const std::string& vocab) {
  auto gguf = GgufFile::Open(kVocabDir + vocab);
  EXPECT_TRUE(gguf.ok()) << gguf.status().ToString();
  if (!gguf.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(*gguf);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (!tok.ok()) return nullptr;
  return std::move(*tok);
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

std::string Escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return "\"" + out + "\"";
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int r = CheckUtf8Sequence(s.substr(i));
    if (r <= 0) return false;
    i += static_cast<size_t>(r);
  }
  return true;
}

// Inputs llama.cpp's BPE detokenizer does not reproduce: it removes spaces before ?!., and
// inside " ' " and " 's"-style contractions (clean_up_tokenization_spaces).
bool AlteredByCleanSpaces(const std::string& s) {
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] != ' ') continue;
    const char x = s[i + 1];
    if (x == '?' || x == '!' || x == '.' || x == ',') return true;
    if (x == '\'') return true;
  }
  return false;
}

void CheckVocabVectors(const std::string& vocab, size_t min_cases) {
  auto tok = Load(vocab);
  ASSERT_NE(tok, nullptr);
  const std::vector<VocabCase> cases = ReadCases(vocab);
  ASSERT_GE(cases.size(), min_cases);
  int failures = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> got = tok->Encode(c.input, /*add_bos=*/false, /*parse_special=*/false);
    if (got != c.expected) {
      ++failures;
      ADD_FAILURE() << vocab << ": input " << Escaped(c.input) << "\n  expected: " << Ids(c.expected)
                    << "\n  actual:   " << Ids(got);
    }
  }
  std::printf("%s: %zu/%zu vectors match\n", vocab.c_str(), cases.size() - failures, cases.size());
}

TEST(TokenizerTest, LlamaSpmVectors) { CheckVocabVectors("ggml-vocab-llama-spm.gguf", 40); }
// Phi-3's own vocabulary (32064 tokens: Llama 2's SPM plus its chat tokens) and vectors,
// from llama.cpp's models/ at the reference commit.
TEST(TokenizerTest, Phi3Vectors) { CheckVocabVectors("ggml-vocab-phi-3.gguf", 40); }
// Qwen3's own vocabulary (151669 tokens, byte-level BPE, the qwen2 pre-tokenizer), made
// from its tokenizer.json by tools/hf_vocab_to_gguf.py; llama.cpp's vectors for it.
TEST(TokenizerTest, Qwen3Vectors) { CheckVocabVectors("qwen3-vocab.gguf", 60); }

// The pre-tokenizers and SPM settings of the other families, on the shipped vocabularies
// with one key changed (tests/data/vocab/README.md: variants/): the Qwen2 regex (one word per
// digit), the Llama 3 regex (digits in threes, case-folded contractions, merges ignored)
// and Gemma's SentencePiece without the space prefix. Expected ids: llama.cpp's tokenizer
// on the same variant files (tools/llama_tokenize_dump.cc), 46 standard inputs + 20 that
// exercise digits, case, newlines, marks and spaces.
void CheckVariant(const std::string& name, const std::string& base, const std::string& key, const GgufValue& value) {
  auto g = GgufFile::Open(kVocabDir + base);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  GgufWriter w;
  for (const auto& [k, v] : g->metadata()) {
    if (k != key) w.SetValue(k, v);
  }
  w.SetValue(key, value);
  const std::string path = ::testing::TempDir() + "/variant-" + name + ".gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto vg = GgufFile::Open(path);
  ASSERT_TRUE(vg.ok());
  auto tok = Tokenizer::FromGguf(*vg);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::vector<VocabCase> cases = ReadCases("variants/" + name);
  ASSERT_EQ(cases.size(), 66u) << name;
  int failures = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> got = (*tok)->Encode(c.input, false, false);
    if (got != c.expected) {
      ++failures;
      ADD_FAILURE() << name << ": input " << Escaped(c.input) << "\n  expected: " << Ids(c.expected)
                    << "\n  actual:   " << Ids(got);
    }
  }
  std::printf("%s: %zu/%zu vectors match\n", name.c_str(), cases.size() - failures, cases.size());
}

GgufValue Str(const std::string& s) {
  GgufValue v;
  v.type = GgufValueType::kString;
  v.str = s;
  return v;
}

TEST(TokenizerTest, Qwen2PreTokenizerVectors) {
  CheckVariant("gpt-2+qwen2", "ggml-vocab-gpt-2.gguf", "tokenizer.ggml.pre", Str("qwen2"));
}
TEST(TokenizerTest, Llama3PreTokenizerVectors) {
  CheckVariant("gpt-2+llama-bpe", "ggml-vocab-gpt-2.gguf", "tokenizer.ggml.pre", Str("llama-bpe"));
}
TEST(TokenizerTest, GemmaStyleSpmWithoutSpacePrefixVectors) {
  GgufValue no;
  no.type = GgufValueType::kBool;
  no.u64 = 0;
  CheckVariant("llama-spm+no-space-prefix", "ggml-vocab-llama-spm.gguf", "tokenizer.ggml.add_space_prefix", no);
}
TEST(TokenizerTest, Gpt2Vectors) { CheckVocabVectors("ggml-vocab-gpt-2.gguf", 40); }

void CheckRoundTrips(const std::string& vocab) {
  auto tok = Load(vocab);
  ASSERT_NE(tok, nullptr);
  int checked = 0;
  for (const VocabCase& c : ReadCases(vocab)) {
    if (!IsValidUtf8(c.input)) continue;
    if (tok->kind() == TokenizerKind::kBpe && AlteredByCleanSpaces(c.input)) continue;
    const std::vector<int32_t> ids = tok->Encode(c.input, false, false);
    EXPECT_EQ(tok->Decode(ids), c.input) << vocab << " ids " << Ids(ids);
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

TEST(TokenizerTest, SpmRoundTrip) { CheckRoundTrips("ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerTest, BpeRoundTrip) { CheckRoundTrips("ggml-vocab-gpt-2.gguf"); }

TEST(TokenizerTest, SpmMetadata) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), TokenizerKind::kSpm);
  EXPECT_EQ(tok->n_vocab(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->IsEog(2));
  EXPECT_FALSE(tok->IsEog(1));
  EXPECT_FALSE(tok->IsEog(15043));
  EXPECT_EQ(tok->TokenText(1), "<s>");
  EXPECT_EQ(tok->FindToken("\xE2\x96\x81Hello"), 15043);
  EXPECT_EQ(tok->FindToken("no such token at all"), std::nullopt);
  EXPECT_EQ(tok->TokenToPiece(15043), " Hello");
  EXPECT_EQ(tok->TokenToPiece(13), "\n");  // <0x0A>
  EXPECT_EQ(tok->TokenToPiece(1), "");
  EXPECT_EQ(tok->TokenToPiece(1, /*render_special=*/true), "<s>");
  EXPECT_EQ(tok->TokenToPiece(-1), "");
  EXPECT_EQ(tok->TokenToPiece(1 << 30), "");
}

TEST(TokenizerTest, SpmAddBosAndSpecialParsing) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("Hello", true, false), (std::vector<int32_t>{1, 15043}));
  EXPECT_EQ(tok->Encode("", true, false), (std::vector<int32_t>{1}));
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  // Control texts are recognized only with parse_special; a space is re-prefixed after them.
  const std::vector<int32_t> special = tok->Encode("<s>Hello</s>", false, true);
  EXPECT_EQ(special, (std::vector<int32_t>{1, 15043, 2}));
  const std::vector<int32_t> plain = tok->Encode("<s>Hello</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(tok->Decode(plain), "<s>Hello</s>");
  EXPECT_EQ(tok->Decode(special), " Hello");  // the leading space is stripped from <s> only
  EXPECT_EQ(tok->Decode(special, /*render_special=*/true), "<s> Hello</s>");
}

TEST(TokenizerTest, BpeMetadataAndSpecialParsing) {
  auto tok = Load("ggml-vocab-gpt-2.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), TokenizerKind::kBpe);
  EXPECT_EQ(tok->n_vocab(), 50257);
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->IsEog(50256));
  EXPECT_EQ(tok->TokenToPiece(tok->FindToken("\xC4\xA0world").value()), " world");  // "Ġworld"
  const std::vector<int32_t> ids = tok->Encode("Hi<|endoftext|>there", false, true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 50256);
  EXPECT_EQ(tok->Decode(ids), "Hithere");
  EXPECT_EQ(tok->Decode(ids, true), "Hi<|endoftext|>there");
  const std::vector<int32_t> plain = tok->Encode("Hi<|endoftext|>there", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(tok->Decode(plain), "Hi<|endoftext|>there");
}

TEST(StreamDecoderTest, SpmByteFallbackEmoji) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  const std::string text = "Hi \xF0\x9F\xA6\x99 and \xF0\x9F\x98\x81!";  // two emoji, byte tokens
  const std::vector<int32_t> ids = tok->Encode(text, false, false);
  StreamDecoder dec(*tok);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    const std::string chunk = dec.Push(id);
    EXPECT_TRUE(IsValidUtf8(chunk)) << Escaped(chunk);
    if (chunk.empty()) ++held;
    all += chunk;
  }
  all += dec.Flush();
  EXPECT_GT(held, 0);  // some byte tokens had to wait for the rest of their sequence
  EXPECT_EQ(all, " " + text);  // pieces keep SPM's prefix space
}

TEST(StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  auto byte_token = [&](int b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    return tok->FindToken(name).value();
  };
  StreamDecoder dec(*tok);
  EXPECT_EQ(dec.Push(byte_token(0xF0)), "");
  EXPECT_EQ(dec.Push(byte_token(0x9F)), "");
  // 'A' cannot continue the sequence: the held bytes become one U+FFFD, then 'A'.
  EXPECT_EQ(dec.Push(tok->FindToken("A").value()), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(dec.Push(byte_token(0x80)), "\xEF\xBF\xBD");  // stray continuation byte
  EXPECT_EQ(dec.Push(byte_token(0xE2)), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");  // incomplete tail at the end
  EXPECT_EQ(dec.Flush(), "");
}

TEST(TokenizerTest, UnknownModelIsAClearError) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "t5");
  w.SetStringArray("tokenizer.ggml.tokens", {"<pad>", "a"});
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok());
  auto gguf = GgufFile::Parse(*buf);
  ASSERT_TRUE(gguf.ok());
  auto tok = Tokenizer::FromGguf(*gguf);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(tok.status().message().find("'tokenizer.ggml.model=t5'"), std::string::npos)
      << tok.status().ToString();
}

TEST(TokenizerTest, UnknownPreTokenizerIsAClearError) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "chatglm-bpe");
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.SetStringArray("tokenizer.ggml.merges", {"a b"});
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok());
  auto gguf = GgufFile::Parse(*buf);
  ASSERT_TRUE(gguf.ok());
  auto tok = Tokenizer::FromGguf(*gguf);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(tok.status().message().find("chatglm-bpe"), std::string::npos) << tok.status().ToString();
}

TEST(TokenizerTest, MissingModelKeyIsAnError) {
  GgufWriter w;
  w.SetStringArray("tokenizer.ggml.tokens", {"a"});
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok());
  auto gguf = GgufFile::Parse(*buf);
  ASSERT_TRUE(gguf.ok());
  auto tok = Tokenizer::FromGguf(*gguf);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
}

// A tiny llama3-style vocab: checks the llama3 pre-tokenizer split (digits in threes,
// case-insensitive contractions, a non-letter joining the following letters) and
// ignore_merges, through the ids it produces.
TEST(TokenizerTest, Llama3PreTokenizer) {
  // Byte-level alphabet for the characters used, plus whole-word tokens.
  std::vector<std::string> tokens;
  for (char c : std::string("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'!?,.")) {
    tokens.push_back(std::string(1, c));
  }
  const std::vector<std::string> words = {"\xC4\xA0" "Hello", "'S", "123", "45", "\xC4\x8A", "Hi",
                                          "<|eot_id|>", "<|begin_of_text|>"};
  tokens.insert(tokens.end(), words.begin(), words.end());
  tokens.push_back("\xC4\xA0");  // "Ġ" = space
  std::vector<int32_t> types(tokens.size(), 1);
  types[tokens.size() - 3] = 3;  // <|eot_id|> control
  types[tokens.size() - 2] = 3;  // <|begin_of_text|> control
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "llama-bpe");
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", types);
  w.SetStringArray("tokenizer.ggml.merges", {"H i"});
  w.SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens.size() - 2));
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok());
  auto gguf = GgufFile::Parse(*buf);
  ASSERT_TRUE(gguf.ok());
  auto res = Tokenizer::FromGguf(*gguf);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  const Tokenizer& tok = **res;
  EXPECT_TRUE(tok.add_bos());
  auto id = [&](std::string_view t) { return tok.FindToken(t).value(); };
  const int32_t eot = id("<|eot_id|>");
  EXPECT_TRUE(tok.IsEog(eot));
  EXPECT_EQ(tok.eot_id(), eot);
  // " Hello" is one token (ignore_merges); "'S" is a contraction; 12345 -> "123" "45".
  EXPECT_EQ(tok.Encode(" Hello'S12345", false, false),
            (std::vector<int32_t>{id("\xC4\xA0" "Hello"), id("'S"), id("123"), id("45")}));
  // "Hi" comes from the merge; "!" then "\n" via the byte alphabet (Ċ).
  EXPECT_EQ(tok.Encode("Hi!\n", true, false),
            (std::vector<int32_t>{tok.bos_id(), id("Hi"), id("!"), id("\xC4\x8A")}));
  EXPECT_EQ(tok.Encode("Hi<|eot_id|>", false, true), (std::vector<int32_t>{id("Hi"), eot}));
  EXPECT_EQ(tok.Decode(tok.Encode(" Hello'S12345", false, false)), " Hello'S12345");
}

void FuzzEncode(const std::string& vocab) {
  auto tok = Load(vocab);
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(1234);
  const std::string alphabet = std::string("ab <>|/s\n\t'0\xE2\x96\x81\xF0\x9F\x98\x81\xC3\xA4") +
                               std::string(1, '\0') + "<s></s><|endoftext|>";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) {
      c = (rng() % 2) ? static_cast<char>(rng() & 0xFF) : alphabet[rng() % alphabet.size()];
    }
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok->Encode(s, iter % 2 == 0, special);
      for (int32_t id : ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, tok->n_vocab());
      }
      if (!s.empty()) {
        ASSERT_FALSE(ids.empty()) << Escaped(s);
      }
      (void)tok->Decode(ids, special);
      StreamDecoder dec(*tok, special);
      std::string streamed;
      for (int32_t id : ids) streamed += dec.Push(id);
      streamed += dec.Flush();
      ASSERT_TRUE(IsValidUtf8(streamed));
    }
  }
}

TEST(TokenizerTest, FuzzSpm) { FuzzEncode("ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerTest, FuzzBpe) { FuzzEncode("ggml-vocab-gpt-2.gguf"); }

// SPM byte fallback keeps every byte, so arbitrary bytes survive Encode -> Decode, as long
// as there is no space: a malformed lead byte can swallow the bytes of an escaped space
// (U+2581) into its symbol, which llama.cpp then emits as raw bytes, not as " ".
TEST(TokenizerTest, SpmRoundTripsArbitraryBytesWithoutSpaces) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(99);
  for (int iter = 0; iter < 500; ++iter) {
    std::string s(1 + rng() % 40, '\0');
    for (char& c : s) {
      c = static_cast<char>(rng() & 0xFF);
      if (c == ' ') c = 'x';
    }
    if (s.find("\xE2\x96\x81") != std::string::npos) continue;
    EXPECT_EQ(tok->Decode(tok->Encode(s, false, false)), s);
  }
}

std::string LongText(size_t bytes) {
  const std::string para =
      "The quick brown fox jumps over the lazy dog. Ünïcödé текст 日本語のテキスト 1234567 "
      "don't we'll you're\n\t  indented    code(x) { return x * 2; } \xF0\x9F\xA6\x99\n";
  std::string s;
  while (s.size() < bytes) s += para;
  s.resize(bytes);
  return s;
}

void CheckLongInput(const std::string& vocab) {
  auto tok = Load(vocab);
  ASSERT_NE(tok, nullptr);
  const std::string text = LongText(100 * 1024);
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok->Encode(text, false, true);
  auto t1 = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  std::printf("%s: encoded 100 KiB into %zu tokens in %.2f ms (%.3f ms/KiB)\n", vocab.c_str(),
              ids.size(), ms, ms / 100);
  EXPECT_LT(ms, 1000.0 * TestSlowdown());  // Release takes ~30 ms; quadratic would take minutes
  // One long run without any split points must not be quadratic either.
  const std::string letters(100 * 1024, 'a');
  t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids2 = tok->Encode(letters, false, false);
  t1 = std::chrono::steady_clock::now();
  const double ms2 = std::chrono::duration<double, std::milli>(t1 - t0).count();
  EXPECT_LT(ms2, 1000.0 * TestSlowdown());
  EXPECT_EQ(tok->Decode(ids2), letters);
}

TEST(TokenizerTest, LongInputSpm) { CheckLongInput("ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerTest, LongInputBpe) { CheckLongInput("ggml-vocab-gpt-2.gguf"); }

// EncodeWithSpecialRanges with everything special is Encode(parse_special=true), with
// nothing special Encode(parse_special=false), on random text full of special texts.
void CheckSpecialRangesExtremes(const std::string& vocab) {
  auto tok = Load(vocab);
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"a", " b", "\n", "<s>", "</s>", "<|endoftext|>", "<", "s>", "|", "\xC3\xA4",
                                          std::string(1, '\0'), "  ", "Hello"};
  for (int iter = 0; iter < 1000; ++iter) {
    std::string s;
    for (unsigned k = rng() % 12; k > 0; --k) s += parts[rng() % parts.size()];
    const ByteRange all[] = {{0, s.size()}};
    const bool bos = iter % 2 == 0;
    ASSERT_EQ(tok->EncodeWithSpecialRanges(s, bos, all), tok->Encode(s, bos, true)) << Escaped(s);
    ASSERT_EQ(tok->EncodeWithSpecialRanges(s, bos, {}), tok->Encode(s, bos, false)) << Escaped(s);
  }
}
TEST(TokenizerTest, SpecialRangesExtremesSpm) { CheckSpecialRangesExtremes("ggml-vocab-llama-spm.gguf"); }
TEST(TokenizerTest, SpecialRangesExtremesBpe) { CheckSpecialRangesExtremes("ggml-vocab-gpt-2.gguf"); }

TEST(TokenizerTest, SpecialRangesRecognizeControlTextsOnlyInside) {
  auto tok = Load("ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  // "<s>" (0..3) may be special, "Hi</s>" (3..9) may not, the closing "</s>" (9..13) may.
  const std::string text = "<s>Hi</s></s>";
  const ByteRange ranges[] = {{0, 3}, {9, 13}};
  const std::vector<int32_t> ids = tok->EncodeWithSpecialRanges(text, false, ranges);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // the inner "</s>" is text
  EXPECT_EQ(tok->Decode(ids, /*render_special=*/true), "<s> Hi</s></s>");
  // The text between is tokenized exactly as Encode would tokenize it after a <s>.
  const std::vector<int32_t> inner = tok->Encode("Hi</s>", false, false);
  std::vector<int32_t> expect = {1};
  expect.insert(expect.end(), inner.begin(), inner.end());
  expect.push_back(2);
  EXPECT_EQ(ids, expect);
  // An occurrence straddling a range boundary is not special either.
  const ByteRange half[] = {{0, 5}};
  const std::vector<int32_t> straddle = tok->EncodeWithSpecialRanges("ab</s>", false, half);
  EXPECT_EQ(std::count(straddle.begin(), straddle.end(), 2), 0);
  EXPECT_EQ(straddle, tok->Encode("ab</s>", false, false));
}

TEST(TokenizerTest, MaxTokenBytesBoundsEncodedText) {
  for (const char* vocab : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"}) {
    auto tok = Load(vocab);
    ASSERT_NE(tok, nullptr);
    const size_t mx = tok->max_token_bytes();
    EXPECT_GE(mx, 4u);
    for (int32_t id = 0; id < tok->n_vocab(); ++id) ASSERT_LE(tok->TokenToPiece(id, true).size(), mx);
    std::mt19937 rng(3);
    for (int iter = 0; iter < 300; ++iter) {
      std::string s = LongText(1 + rng() % 3000);
      for (int k = 0; k < 5; ++k) s[rng() % s.size()] = static_cast<char>(rng());
      const std::vector<int32_t> ids = tok->Encode(s, false, true);
      ASSERT_LE(s.size(), ids.size() * mx) << vocab;
    }
  }
}

TEST(UnicodeTest, FlagsAndByteAlphabet) {
  EXPECT_TRUE(CodepointFlags('a') & kUnicodeLetter);
  EXPECT_TRUE(CodepointFlags(0x4E2D) & kUnicodeLetter);  // 中
  EXPECT_TRUE(CodepointFlags('7') & kUnicodeNumber);
  EXPECT_TRUE(CodepointFlags(0x00BD) & kUnicodeNumber);  // ½
  EXPECT_TRUE(CodepointFlags(0x3000) & kUnicodeWhitespace);
  EXPECT_TRUE(CodepointFlags('\n') & kUnicodeWhitespace);
  EXPECT_FALSE(CodepointFlags(0x1C) & kUnicodeWhitespace);  // not White_Space
  EXPECT_TRUE(CodepointFlags(0x110000) & kUnicodeUndefined);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(UnicodeToByte(ByteToUnicode(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);  // Ġ
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(CodepointsFromUtf8("a\xC3"), (std::vector<uint32_t>{'a', kReplacementChar}));
  EXPECT_EQ(CodepointsFromUtf8("\xE4\xB8\xAD"), (std::vector<uint32_t>{0x4E2D}));
}

}  // namespace
}  // namespace trellis

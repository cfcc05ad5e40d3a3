#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>

#include "model/gguf_writer.h"

namespace trellis {
namespace {

std::vector<uint8_t> SmallFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 2);
  w.SetFloat32("llama.rope.freq_base", 10000.0f);
  w.SetBool("flag", true);
  w.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  w.SetFloat32Array("tokenizer.ggml.scores", {0.f, 0.f, 0.f, -1.5f});
  w.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1});
  std::vector<float> data(64);
  for (int i = 0; i < 64; ++i) data[i] = static_cast<float>(i);
  EXPECT_TRUE(w.AddTensorData("w", {32, 2}, GgmlType::kF32,
                              {reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4})
                  .ok());
  EXPECT_TRUE(w.AddTensorData("b", {32}, GgmlType::kF32,
                              {reinterpret_cast<const uint8_t*>(data.data()), 32 * 4})
                  .ok());
  auto buf = w.WriteToBuffer();
  EXPECT_TRUE(buf.ok());
  return *buf;
}

TEST(GgufTest, WriteThenRead) {
  std::vector<uint8_t> buf = SmallFile();
  auto g = GgufFile::Parse(buf);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(*g->GetString("general.architecture"), "llama");
  EXPECT_EQ(*g->GetUint("llama.block_count"), 2u);
  EXPECT_FLOAT_EQ(static_cast<float>(*g->GetFloat("llama.rope.freq_base")), 10000.0f);
  EXPECT_TRUE(*g->GetBool("flag"));
  auto toks = g->GetArray("tokenizer.ggml.tokens", GgufValueType::kString);
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ((*toks)->strings[3], "a");
  auto scores = g->GetArray("tokenizer.ggml.scores", GgufValueType::kFloat32);
  ASSERT_TRUE(scores.ok());
  EXPECT_EQ((*scores)->floats[3], -1.5);
  ASSERT_EQ(g->tensors().size(), 2u);
  const GgufTensorInfo* w = g->FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(w->size_bytes, 256u);
  EXPECT_EQ(static_cast<size_t>(w->data - buf.data()) % 32, 0u);
  float x;
  std::memcpy(&x, w->data + 4 * 63, 4);
  EXPECT_EQ(x, 63.0f);
  const GgufTensorInfo* b = g->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->offset % 32, 0u);
}

TEST(GgufTest, WrongTypesAreNamed) {
  std::vector<uint8_t> buf = SmallFile();
  auto g = GgufFile::Parse(buf);
  ASSERT_TRUE(g.ok());
  auto s = g->GetUint("general.architecture");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("general.architecture"), std::string::npos);
  EXPECT_EQ(g->GetString("missing").status().code(), StatusCode::kNotFound);
}

// Every proper prefix of a valid file must fail cleanly (never crash or read past it).
TEST(GgufTest, EveryTruncationIsAnError) {
  std::vector<uint8_t> buf = SmallFile();
  for (size_t n = 0; n < buf.size(); ++n) {
    std::vector<uint8_t> cut(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
    auto g = GgufFile::Parse(cut);
    // The last tensor's trailing alignment padding may be missing and still be valid.
    if (g.ok()) {
      for (const auto& t : g->tensors()) ASSERT_LE(t.data + t.size_bytes, cut.data() + cut.size());
      continue;
    }
    EXPECT_NE(g.status().code(), StatusCode::kOk);
  }
}

TEST(GgufTest, CorruptionsGetClearErrors) {
  std::vector<uint8_t> good = SmallFile();
  auto expect_error = [&](std::vector<uint8_t> bad, const std::string& needle) {
    auto g = GgufFile::Parse(bad);
    ASSERT_FALSE(g.ok()) << needle;
    EXPECT_NE(g.status().message().find(needle), std::string::npos) << g.status().ToString();
  };
  {
    auto bad = good;
    bad[0] = 'X';
    expect_error(bad, "not a GGUF file");
  }
  {
    auto bad = good;
    bad[4] = 7;
    expect_error(bad, "version 7");
  }
  {
    auto bad = good;
    uint64_t huge = uint64_t{1} << 50;
    std::memcpy(bad.data() + 16, &huge, 8);  // metadata count
    expect_error(bad, "metadata count");
  }
  {
    auto bad = good;
    uint64_t huge = ~uint64_t{0};
    std::memcpy(bad.data() + 24, &huge, 8);  // first key's length
    expect_error(bad, "metadata key");
  }
}

TEST(GgufTest, ReadsLlamaCppVocabFile) {
  auto g = GgufFile::Open(std::string(TRELLIS_TEST_DATA) + "/vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*g->GetString("tokenizer.ggml.model"), "llama");
  auto toks = g->GetArray("tokenizer.ggml.tokens", GgufValueType::kString);
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ((*toks)->count, 32000u);
}

TEST(GgufTest, ReadsReferenceModel) {
  auto g = GgufFile::Open(std::string(TRELLIS_TEST_DATA) + "/reference/ref-a-q4_k_m.gguf");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*g->GetString("general.architecture"), "llama");
  const GgufTensorInfo* t = g->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dims[0], 256);
}

TEST(GgufTest, MissingFileIsNotFound) {
  auto g = GgufFile::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace trellis

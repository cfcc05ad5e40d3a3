#include "model/gguf.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "model/gguf_writer.h"
#include "util/fault_env.h"

namespace trellis {
namespace {

GgufWriter SmallWriter() {
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
  return w;
}

std::vector<uint8_t> SmallFile() {
  auto buf = SmallWriter().WriteToBuffer();
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

// Offset of the first tensor info's `offset` field in a writer-built file.
size_t TensorOffsetField(const std::vector<uint8_t>& buf, const GgufFile& g, size_t tensor) {
  size_t pos = g.data_offset();
  // Walk back from the data section: infos end before the padding; simplest is to search
  // forward for the tensor's name and skip its fixed-size fields.
  const std::string& name = g.tensors()[tensor].name;
  for (size_t i = 24; i + 8 + name.size() <= buf.size(); ++i) {
    uint64_t len;
    std::memcpy(&len, buf.data() + i, 8);
    if (len == name.size() && std::memcmp(buf.data() + i + 8, name.data(), name.size()) == 0) {
      pos = i + 8 + name.size();
      uint32_t n_dims;
      std::memcpy(&n_dims, buf.data() + pos, 4);
      return pos + 4 + 8 * n_dims + 4;
    }
  }
  return pos;
}

TEST(GgufTest, OverlappingTensorsAreRejected) {
  GgufWriter w;
  std::vector<uint8_t> zeros(128);
  ASSERT_TRUE(w.AddTensorData("first", {16}, GgmlType::kF32, {zeros.data(), 64}).ok());
  ASSERT_TRUE(w.AddTensorData("second", {8}, GgmlType::kF32, {zeros.data(), 32}).ok());
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok());
  auto g = GgufFile::Parse(*buf);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->FindTensor("second")->offset, 64u);
  std::vector<uint8_t> bad = *buf;
  const uint64_t inside_first = 32;
  std::memcpy(bad.data() + TensorOffsetField(*buf, *g, 1), &inside_first, 8);
  auto o = GgufFile::Parse(bad);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(o.status().message().find("overlaps tensor 'first'"), std::string::npos) << o.status().ToString();
}

TEST(GgufTest, ByteSwappedVersionIsNamed) {
  std::vector<uint8_t> buf = SmallFile();
  const uint8_t be3[4] = {0, 0, 0, 3};
  std::memcpy(buf.data() + 4, be3, 4);
  auto g = GgufFile::Parse(buf);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(g.status().message().find("big-endian"), std::string::npos) << g.status().ToString();
}

TEST(GgufTest, OffsetOverflowIsNamed) {
  std::vector<uint8_t> buf = SmallFile();
  auto g = GgufFile::Parse(buf);
  ASSERT_TRUE(g.ok());
  const uint64_t huge = ~uint64_t{31};  // aligned, but data_offset + huge wraps
  std::memcpy(buf.data() + TensorOffsetField(buf, *g, 0), &huge, 8);
  auto o = GgufFile::Parse(buf);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("overflows"), std::string::npos) << o.status().ToString();
}

// A header count is bounded only by the file size. In a large file a corrupt count used
// to be reserved up front (~200 bytes per entry), which threw std::bad_alloc out of Parse.
// Here: a sparse 8 GiB file of zeros claiming 600M metadata entries. The zeros decode as
// empty-keyed uint8 entries, so the parse must stop at the second one (duplicate key).
TEST(GgufTest, HugeCountInLargeFileDoesNotReserveUpFront) {
  const std::string path = testing::TempDir() + "/gguf_sparse_" + std::to_string(::getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const uint32_t head[2] = {0x46554747, 3};
  const uint64_t counts[2] = {0, 600'000'000};
  ASSERT_EQ(std::fwrite(head, 1, 8, f), 8u);
  ASSERT_EQ(std::fwrite(counts, 1, 16, f), 16u);
  std::fclose(f);
  if (::truncate(path.c_str(), int64_t{8} << 30) != 0) {
    std::remove(path.c_str());
    GTEST_SKIP() << "cannot make a sparse 8 GiB file here";
  }
  auto g = GgufFile::Open(path);
  std::remove(path.c_str());
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("appears twice"), std::string::npos) << g.status().ToString();
}

// WriteFile through a failing file system (util/fault_env.h): a full disk, a failed sync
// and a failed rename are each a clear IoError naming the file, and leave neither the
// file nor its temp behind; with the faults gone the same call writes exactly the bytes
// WriteToBuffer gives.
TEST(GgufWriterTest, AFullDiskOrAFailedSyncOrRenameLeavesNothingBehind) {
  const std::string dir = testing::TempDir() + "/gguf_env_" + std::to_string(::getpid());
  ASSERT_TRUE(Env::Default()->CreateDir(dir).ok());
  const std::string path = dir + "/m.gguf";
  const GgufWriter w = SmallWriter();
  FaultEnv env;
  auto nothing_left = [&] { return ::access(path.c_str(), F_OK) != 0 && ::access((path + ".tmp").c_str(), F_OK) != 0; };
  env.space_left = 100;
  Status s = w.WriteFile(path, &env);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find(path), std::string::npos) << s.ToString();
  EXPECT_TRUE(nothing_left());
  env.space_left = std::numeric_limits<uint64_t>::max();
  env.fail_syncs = true;
  EXPECT_EQ(w.WriteFile(path, &env).code(), StatusCode::kIoError);
  EXPECT_TRUE(nothing_left());
  env.fail_syncs = false;
  env.fail_renames = true;
  EXPECT_EQ(w.WriteFile(path, &env).code(), StatusCode::kIoError);
  EXPECT_TRUE(nothing_left());
  env.fail_renames = false;
  EXPECT_EQ(env.injected.load(), 3u);
  ASSERT_TRUE(w.WriteFile(path, &env).ok());
  std::vector<uint8_t> got;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    int c;
    while ((c = std::fgetc(f)) != EOF) got.push_back(static_cast<uint8_t>(c));
    std::fclose(f);
  }
  EXPECT_EQ(got, SmallFile());
  std::remove(path.c_str());
  ::rmdir(dir.c_str());
}

TEST(GgufWriterTest, NestedArraysRoundTrip) {
  GgufValue inner_ints;
  inner_ints.type = GgufValueType::kArray;
  inner_ints.elem_type = GgufValueType::kInt32;
  inner_ints.count = 2;
  inner_ints.ints = {7, -8};
  GgufValue inner_strs;
  inner_strs.type = GgufValueType::kArray;
  inner_strs.elem_type = GgufValueType::kString;
  inner_strs.count = 1;
  inner_strs.strings = {"x"};
  GgufValue outer;
  outer.type = GgufValueType::kArray;
  outer.elem_type = GgufValueType::kArray;
  outer.count = 2;
  outer.nested = {inner_ints, inner_strs};
  GgufWriter w;
  w.SetValue("nested", outer);
  w.SetUint32("after", 5);
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  auto g = GgufFile::Parse(*buf);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const GgufValue* v = g->Find("nested");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->nested.size(), 2u);
  EXPECT_EQ(v->nested[0].ints, (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(v->nested[1].strings, (std::vector<std::string>{"x"}));
  EXPECT_EQ(*g->GetUint("after"), 5u);
}

TEST(GgufWriterTest, ArrayCountMustMatchElements) {
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.elem_type = GgufValueType::kString;
  v.count = 3;
  v.strings = {"only one"};
  GgufWriter w;
  w.SetValue("short", v);
  auto buf = w.WriteToBuffer();
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), StatusCode::kInvalidArgument);
}

// Padding for alignments above 4 KiB used to be copied from a 4 KiB zero buffer (ASan:
// global-buffer-overflow).
TEST(GgufWriterTest, LargeAlignmentPadsCorrectly) {
  GgufWriter w(8192);
  std::vector<uint8_t> data(64, 0x5a);
  ASSERT_TRUE(w.AddTensorData("a", {16}, GgmlType::kF32, data).ok());
  ASSERT_TRUE(w.AddTensorData("b", {16}, GgmlType::kF32, data).ok());
  auto buf = w.WriteToBuffer();
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  auto g = GgufFile::Parse(*buf);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->alignment(), 8192u);
  EXPECT_EQ(g->data_offset(), 8192u);
  EXPECT_EQ(g->FindTensor("b")->offset, 8192u);
  EXPECT_EQ(g->FindTensor("b")->data[63], 0x5a);
}

TEST(GgufWriterTest, InvalidAlignmentIsRejected) {
  for (uint64_t a : {uint64_t{0}, uint64_t{3}, uint64_t{48}, uint64_t{1} << 21}) {
    GgufWriter w(a);
    auto buf = w.WriteToBuffer();
    ASSERT_FALSE(buf.ok()) << a;
    EXPECT_EQ(buf.status().code(), StatusCode::kInvalidArgument);
  }
}

// A caller-set general.alignment used to be written in addition to the writer's own key
// (the reader then rejected the duplicate) or, at the default 32, silently disagree with
// the padding actually written.
TEST(GgufWriterTest, CallerAlignmentKeyIsWrittenOnce) {
  {
    GgufWriter w(64);
    w.SetUint32("general.alignment", 64);
    std::vector<uint8_t> data(16);
    ASSERT_TRUE(w.AddTensorData("a", {4}, GgmlType::kF32, data).ok());
    ASSERT_TRUE(w.AddTensorData("b", {4}, GgmlType::kF32, data).ok());
    auto buf = w.WriteToBuffer();
    ASSERT_TRUE(buf.ok()) << buf.status().ToString();
    auto g = GgufFile::Parse(*buf);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->alignment(), 64u);
    EXPECT_EQ(g->metadata().size(), 1u);
  }
  {
    GgufWriter w;  // 32
    w.SetUint32("general.alignment", 64);
    auto buf = w.WriteToBuffer();
    ASSERT_FALSE(buf.ok());
    EXPECT_NE(buf.status().message().find("general.alignment"), std::string::npos);
  }
}

TEST(GgufWriterTest, ElementCountOverflowIsRejected) {
  GgufWriter w;
  Status s = w.AddTensor("huge", {int64_t{1} << 32, int64_t{1} << 32}, GgmlType::kF32,
                         [](std::span<uint8_t>) { return Status::Ok(); });
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
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

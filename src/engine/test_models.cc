#include "engine/test_models.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "util/checksum.h"
#include "util/mapped_file.h"

namespace trellis::testing {

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size() || b.empty()) return kInf;
  double mean = 0, var = 0, worst = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return kInf;
    mean += b[i];
  }
  mean /= static_cast<double>(b.size());
  for (float v : b) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(b.size()));
  if (!(sd > 0)) return kInf;
  for (size_t i = 0; i < a.size(); ++i) worst = Worse(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst / sd;
}

double RmsOverStd(const float* ours, const float* ref, size_t n) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (n == 0) return kInf;
  double mean = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(ours[i]) || !std::isfinite(ref[i])) return kInf;
    mean += ref[i];
  }
  mean /= static_cast<double>(n);
  double diff2 = 0, var = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ours[i]) - ref[i];
    diff2 += d * d;
    var += (ref[i] - mean) * (ref[i] - mean);
  }
  if (!(var > 0)) return kInf;
  return std::sqrt(diff2 / var);
}

std::string TempPath(const std::string& name) {
  static std::atomic<int> counter{0};
  const std::string dir = ::testing::TempDir();
  return dir + "/trellis_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + "_" + name;
}

std::string WriteSmallModel(const std::string& name, const std::string& type, const std::string& vocab_path,
                            const std::string& arch) {
  auto vocab = GgufFile::Open(vocab_path.empty() ? std::string(TRELLIS_TEST_DATA) + "/reference/ref-a-f16.gguf" : vocab_path);
  EXPECT_TRUE(vocab.ok()) << vocab.status().ToString();
  RandomModelOptions o;
  o.shape = *ModelShapeByName("small");  // gen-model --shape small [--head-dim 128] --seed 7 writes the same file
  if (arch == "qwen3") o.shape.head_dim = 128;
  o.type = type;
  o.arch = arch;
  o.seed = 7;
  const std::string path = TempPath(name);
  Status s = WriteRandomModel(o, *vocab, path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

std::string ReferenceModelPath(const std::string& model) {
  const std::string kDir = std::string(TRELLIS_TEST_DATA) + "/reference/";
  const std::string recipe_path = kDir + model + ".gen.json";
  if (!std::ifstream(recipe_path).good()) return kDir + model + ".gguf";
  const nlohmann::json recipe = nlohmann::json::parse(std::ifstream(recipe_path));
  auto vocab = GgufFile::Open(std::string(TRELLIS_TEST_DATA) + "/" + recipe["vocab"].get<std::string>());
  EXPECT_TRUE(vocab.ok()) << vocab.status().ToString();
  if (!vocab.ok()) return "";
  RandomModelOptions o;
  auto shape = ModelShapeByName(recipe["shape"].get<std::string>());
  EXPECT_TRUE(shape.ok()) << shape.status().ToString();
  if (!shape.ok()) return "";
  o.shape = *shape;
  o.arch = recipe["arch"].get<std::string>();
  o.type = recipe["type"].get<std::string>();
  o.seed = recipe["seed"].get<uint64_t>();
  if (recipe.contains("yarn")) {  // gen-model --yarn F --yarn-orig-ctx N
    o.yarn_factor = recipe["yarn"].get<float>();
    o.yarn_orig_ctx = recipe["yarn_orig_ctx"].get<int>();
  }
  const std::string path = TempPath(model + ".gguf");
  const Status st = WriteRandomModel(o, *vocab, path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto f = MappedFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return "";
  EXPECT_EQ(fmt::format("{:016x}", Checksum64(f->data(), f->size())), recipe["model_xxh3"].get<std::string>())
      << "the random-model generator writes other bytes than the file llama.cpp's logits were made from: "
         "regenerate the reference (tests/data/README.md)";
  return path;
}

void RewriteGguf(const std::string& src, const std::string& dst, const RewriteHooks& hooks) {
  auto g = GgufFile::Open(src);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  GgufWriter w;
  for (const auto& [key, value] : g->metadata()) {
    GgufValue v = value;
    if (hooks.metadata && !hooks.metadata(key, v)) continue;
    w.SetValue(key, v);
  }
  for (const GgufTensorInfo& t : g->tensors()) {
    GgufTensorInfo info = t;
    if (hooks.tensor && !hooks.tensor(info)) continue;
    if (info.type == t.type) {
      ASSERT_TRUE(w.AddTensorData(info.name, info.dims, info.type, {t.data, t.size_bytes}).ok());
    } else {
      ASSERT_TRUE(w.AddTensor(info.name, info.dims, info.type, [](std::span<uint8_t> d) {
                     std::memset(d.data(), 0, d.size());
                     return Status::Ok();
                   }).ok());
    }
  }
  if (hooks.extra) hooks.extra(w);
  Status s = w.WriteFile(dst);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

}  // namespace trellis::testing

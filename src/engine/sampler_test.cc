#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace trellis {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f}; }

TEST(SamplerTest, GreedyIsArgmaxLowestIdOnTies) {
  EXPECT_EQ(Sampler::Greedy(Logits()), 1);
  std::vector<float> tie = {0.f, 5.f, 5.f};
  EXPECT_EQ(Sampler::Greedy(tie), 1);
  SamplerParams p;
  p.temperature = 0;
  Sampler s(p, 6);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l, {}), 1);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplerParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  Sampler s(p, 6);
  for (int i = 0; i < 50; ++i) {
    auto l = Logits();
    EXPECT_EQ(s.Sample(l, {}), 1);
  }
}

TEST(SamplerTest, SeededIsReproducibleAndSeedsDiffer) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 6);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = Logits();
      out.push_back(s.Sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  Sampler s(p, 6);
  std::vector<float> base = Logits();
  double z = 0;
  for (float v : base) z += std::exp(v);
  std::map<int32_t, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    auto l = base;
    counts[s.Sample(l, {})]++;
  }
  for (int i = 0; i < 6; ++i) {
    const double expect = std::exp(base[static_cast<size_t>(i)]) / z;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expect, 0.012) << "token " << i;
  }
}

TEST(SamplerTest, TopPAndMinPCutTheTail) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.min_p = 0;
  p.top_p = 0.5f;  // softmax of Logits(): 1 (0.36), 5 (0.33) ... -> {1, 5} covers >= 0.5
  Sampler s(p, 6);
  for (int i = 0; i < 500; ++i) {
    auto l = Logits();
    const int32_t t = s.Sample(l, {});
    EXPECT_TRUE(t == 1 || t == 5) << t;
  }
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps p >= 0.5 * p_max: 1, 5 (e^-0.1), 2 (e^-0.5 = 0.61)
  Sampler m(p, 6);
  for (int i = 0; i < 500; ++i) {
    auto l = Logits();
    const int32_t t = m.Sample(l, {});
    EXPECT_TRUE(t == 1 || t == 5 || t == 2) << t;
  }
}

TEST(SamplerTest, LowTemperatureConcentrates) {
  SamplerParams p;
  p.temperature = 0.05f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  Sampler s(p, 6);
  int ones = 0;
  for (int i = 0; i < 1000; ++i) {
    auto l = Logits();
    ones += s.Sample(l, {}) == 1;
  }
  EXPECT_GT(ones, 850);  // p(1) = 1 / (1 + e^-2 + e^-10 ...) ~ 0.88 at T = 0.05
}

TEST(SamplerTest, RepetitionPenaltyDemotesSeenTokens) {
  SamplerParams p;
  p.temperature = 0.01f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p, 6);
  auto l = Logits();
  const std::vector<int32_t> history = {1, 1, 1};
  EXPECT_EQ(s.Sample(l, history), 5);  // 3.0 / 2 = 1.5 < 2.9
  EXPECT_FLOAT_EQ(l[1], 1.5f);         // penalized once, not once per occurrence
}

}  // namespace
}  // namespace trellis

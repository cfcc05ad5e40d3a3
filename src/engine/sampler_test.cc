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
  EXPECT_EQ(s.Sample(l, {}, 0), 1);
}

TEST(SamplerTest, TopKOneIsGreedy) {
  SamplerParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  Sampler s(p, 6);
  for (int i = 0; i < 50; ++i) {
    auto l = Logits();
    EXPECT_EQ(s.Sample(l, {}, 0), 1);
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
      out.push_back(s.Sample(l, {}, 0));
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
    counts[s.Sample(l, {}, 0)]++;
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
    const int32_t t = s.Sample(l, {}, 0);
    EXPECT_TRUE(t == 1 || t == 5) << t;
  }
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // keeps p >= 0.5 * p_max: 1, 5 (e^-0.1), 2 (e^-0.5 = 0.61)
  Sampler m(p, 6);
  for (int i = 0; i < 500; ++i) {
    auto l = Logits();
    const int32_t t = m.Sample(l, {}, 0);
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
    ones += s.Sample(l, {}, 0) == 1;
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
  EXPECT_EQ(s.Sample(l, history, 0), 5);  // 3.0 / 2 = 1.5 < 2.9
  EXPECT_FLOAT_EQ(l[1], 1.5f);         // penalized once, not once per occurrence
}

TEST(SamplerTest, RepetitionPenaltyAppliesToGreedyToo) {
  SamplerParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p, 6);
  auto l = Logits();
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(s.Sample(l, history, 1), 5);  // a prompt token: the repetition penalty sees it
}

// repeat_last_n is the window the repetition penalty looks at (llama.cpp's): the last n
// tokens of the history, -1 the whole history, 0 none. Token 1 (logit 3.0, the argmax)
// sits four tokens back.
TEST(SamplerTest, RepetitionWindowIsTheLastNTokens) {
  auto pick = [](int last_n) {
    SamplerParams p;
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = last_n;
    Sampler s(p, 6);
    auto l = Logits();
    const std::vector<int32_t> history = {1, 4, 4, 4};
    return s.Sample(l, history, 0);
  };
  EXPECT_EQ(pick(3), 1);   // outside the window: 3.0 stays the best
  EXPECT_EQ(pick(4), 5);   // inside: 3.0 / 2 < 2.9
  EXPECT_EQ(pick(-1), 5);  // the whole history
  EXPECT_EQ(pick(0), 1);   // off
}

// Greedy picks from the penalized logits: with a big frequency penalty the argmax moves
// away from a token once it has been generated, and again as the next one repeats.
TEST(SamplerTest, FrequencyPenaltyChangesTheGreedyArgmax) {
  SamplerParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0f;
  Sampler s(p, 6);
  std::vector<int32_t> history = {1, 1, 1};  // prompt: not counted
  const size_t n_prompt = history.size();
  std::vector<int32_t> picks;
  for (int i = 0; i < 4; ++i) {
    auto l = Logits();
    picks.push_back(s.Sample(l, history, n_prompt));
    history.push_back(picks.back());
  }
  // 1 (3.0); then 1 -> 1.0, so 5 (2.9); then 5 -> 0.9, so 2 (2.5); then 2 -> 0.5, and
  // 0 (1.0) ties 1 (3.0 - 2) at 1.0: the lowest id wins.
  EXPECT_EQ(picks, (std::vector<int32_t>{1, 5, 2, 0}));
  // Without the penalty greedy repeats itself.
  SamplerParams q;
  q.temperature = 0;
  Sampler plain(q, 6);
  auto l = Logits();
  EXPECT_EQ(plain.Sample(l, std::vector<int32_t>{1, 1, 1, 1}, 3), 1);
}

TEST(SamplerTest, PresencePenalizesOnceFrequencyPerOccurrence) {
  const std::vector<int32_t> history = {4, 1, 1, 1, 3};  // prompt {4}, generated {1, 1, 1, 3}
  auto penalized = [&](float presence, float frequency) {
    SamplerParams p;
    p.temperature = 0;
    p.presence_penalty = presence;
    p.frequency_penalty = frequency;
    Sampler s(p, 6);
    auto l = Logits();
    (void)s.Sample(l, history, 1);
    return l;
  };
  const std::vector<float> base = Logits();
  const auto pres = penalized(0.5f, 0);
  EXPECT_FLOAT_EQ(pres[1], base[1] - 0.5f);  // three times: once
  EXPECT_FLOAT_EQ(pres[3], base[3] - 0.5f);  // once
  EXPECT_FLOAT_EQ(pres[4], base[4]);         // prompt only
  EXPECT_FLOAT_EQ(pres[5], base[5]);
  const auto freq = penalized(0, 0.5f);
  EXPECT_FLOAT_EQ(freq[1], base[1] - 1.5f);  // 3 x 0.5
  EXPECT_FLOAT_EQ(freq[3], base[3] - 0.5f);
  EXPECT_FLOAT_EQ(freq[4], base[4]);
  const auto both = penalized(0.25f, 0.5f);
  EXPECT_FLOAT_EQ(both[1], base[1] - 1.75f);
  const auto negative = penalized(-1.0f, -1.0f);  // negative values encourage repetition
  EXPECT_FLOAT_EQ(negative[1], base[1] + 4.0f);
  // The scratch counts are cleared: a second call on the same sampler penalizes the same.
  SamplerParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.5f;
  Sampler s(p, 6);
  for (int i = 0; i < 2; ++i) {
    auto l = Logits();
    (void)s.Sample(l, history, 1);
    EXPECT_FLOAT_EQ(l[1], base[1] - 1.5f) << i;
  }
}

TEST(SamplerTest, ZeroPenaltiesChangeNothing) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.seed = 99;
  SamplerParams z = p;
  z.presence_penalty = 0.0f;
  z.frequency_penalty = -0.0f;
  Sampler a(p, 6), b(z, 6);
  std::vector<int32_t> history = {0, 1, 2};
  for (int i = 0; i < 200; ++i) {
    auto la = Logits(), lb = Logits();
    const int32_t ta = a.Sample(la, history, 3);
    const int32_t tb = b.Sample(lb, history, 0);  // the split does not matter without penalties
    ASSERT_EQ(ta, tb) << i;
    ASSERT_EQ(la, Logits());  // logits left bit-identical
    ASSERT_EQ(lb, Logits());
    history.push_back(ta);
  }
}

TEST(SamplerTest, ValidatesPenalties) {
  SamplerParams p;
  EXPECT_TRUE(ValidateSamplerParams(p).ok());
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  EXPECT_TRUE(ValidateSamplerParams(p).ok());
  p.presence_penalty = 2.5f;
  EXPECT_FALSE(ValidateSamplerParams(p).ok());
  p.presence_penalty = 0;
  p.frequency_penalty = NAN;
  EXPECT_FALSE(ValidateSamplerParams(p).ok());
  p.frequency_penalty = -3.0f;
  EXPECT_NE(ValidateSamplerParams(p).message().find("frequency_penalty"), std::string::npos);
}

TEST(SamplerTest, LogitBiasAddsAndMinusHundredBans) {
  SamplerParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.0f}, {3, 4.5f}, {99, 100.0f}};  // 99: past n_vocab, ignored
  Sampler greedy(p, 6);
  auto l = Logits();
  EXPECT_EQ(greedy.Sample(l, {}, 0), 3);  // -1 + 4.5 = 3.5 beats 2.9
  EXPECT_TRUE(std::isinf(l[1]) && l[1] < 0);
  p.logit_bias = {{1, -100.0f}};
  Sampler greedy2(p, 6);
  l = Logits();
  EXPECT_EQ(greedy2.Sample(l, {}, 0), 5);  // the argmax is banned: the next best
  // Sampling at a high temperature never draws a banned token, even all but one banned.
  p.temperature = 2.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0;
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}, {3, -100.0f}, {5, -100.0f}};
  Sampler s(p, 6);
  for (int i = 0; i < 200; ++i) {
    l = Logits();
    ASSERT_EQ(s.Sample(l, {}, 0), 4);
  }
  p.logit_bias = {{1, -100.0f}};
  Sampler s2(p, 6);
  for (int i = 0; i < 500; ++i) {
    l = Logits();
    ASSERT_NE(s2.Sample(l, {}, 0), 1);
  }
}

TEST(SamplerTest, ValidatesLogitBias) {
  SamplerParams p;
  p.logit_bias = {{0, -100.0f}, {5, 100.0f}};
  EXPECT_TRUE(ValidateSamplerParams(p).ok());
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(ValidateSamplerParams(p).ok());
  p.logit_bias = {{1, 101.0f}};
  EXPECT_FALSE(ValidateSamplerParams(p).ok());
  p.logit_bias = {{1, NAN}};
  EXPECT_NE(ValidateSamplerParams(p).message().find("logit_bias"), std::string::npos);
}

}  // namespace
}  // namespace trellis

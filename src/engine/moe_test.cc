#include "engine/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace trellis {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed Route(const std::vector<float>& logits, ExpertRouting r) {
  Routed out{std::vector<int32_t>(static_cast<size_t>(r.k)), std::vector<float>(static_cast<size_t>(r.k))};
  std::vector<float> scratch(logits.size());
  RouteExperts(logits.data(), static_cast<int>(logits.size()), r, out.ids.data(), out.w.data(), scratch.data());
  return out;
}

TEST(RouteExperts, SoftmaxTopKInDescendingOrder) {
  const std::vector<float> l = {0.5f, 3.0f, -1.0f, 2.0f, 2.5f};
  const Routed r = Route(l, {ExpertGating::kSoftmax, false, 3});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 4, 3}));
  double z = 0;
  for (float x : l) z += std::exp(x - 3.0);
  EXPECT_NEAR(r.w[0], 1.0 / z, 1e-6);
  EXPECT_NEAR(r.w[1], std::exp(-0.5) / z, 1e-6);
  EXPECT_NEAR(r.w[2], std::exp(-1.0) / z, 1e-6);
}

TEST(RouteExperts, RenormalizedWeightsSumToOneAndEqualSoftmaxOfTheChosen) {
  const std::vector<float> l = {0.1f, -2.0f, 1.7f, 0.9f, 1.2f, -0.4f, 3.3f, 0.0f};
  const Routed a = Route(l, {ExpertGating::kSoftmax, true, 2});
  const Routed b = Route(l, {ExpertGating::kSoftmaxOfChosen, false, 2});
  EXPECT_EQ(a.ids, (std::vector<int32_t>{6, 2}));
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_NEAR(a.w[0] + a.w[1], 1.0f, 1e-6);
  for (size_t j = 0; j < 2; ++j) EXPECT_NEAR(a.w[j], b.w[j], 1e-6);
  EXPECT_NEAR(a.w[0], 1.0 / (1.0 + std::exp(1.7 - 3.3)), 1e-6);
}

TEST(RouteExperts, TiesGoToTheLowerExpertAndKCanBeAll) {
  const Routed r = Route({1.0f, 2.0f, 2.0f, 1.0f}, {ExpertGating::kSoftmax, true, 4});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 0, 3}));
  float sum = 0;
  for (float w : r.w) sum += w;
  EXPECT_NEAR(sum, 1.0f, 1e-6);
  // Softmax of the chosen: the largest logits, whatever the gating of the rest.
  const Routed c = Route({-50.0f, 40.0f, 39.0f, -60.0f}, {ExpertGating::kSoftmaxOfChosen, false, 2});
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(c.w[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

}  // namespace
}  // namespace trellis

#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace trellis {
namespace {

using internal::SimdLevel;

std::vector<float> RandomVec(int64_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(OpsTest, RmsNormMatchesRefAllLevels) {
  std::mt19937 rng(1);
  for (SimdLevel level : internal::SupportedSimdLevels()) {
    for (int64_t n : {1, 7, 8, 15, 16, 33, 64, 2048, 2051}) {
      const auto x = RandomVec(n, rng), w = RandomVec(n, rng);
      std::vector<float> ref(n), got(n);
      RmsNormRef(x.data(), w.data(), n, 1e-5f, ref.data());
      internal::RmsNormAt(level, x.data(), w.data(), n, 1e-5f, got.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], ref[i], 1e-5f * (1.0f + std::fabs(ref[i])))
            << "level " << static_cast<int>(level) << " n " << n << " i " << i;
      }
    }
  }
}

TEST(OpsTest, RmsNormKnownValuesAndAliasing) {
  // x = [1, 2, 3, 4]: mean(x^2) = 7.5.
  std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> w = {1, 1, 2, 0.5f};
  const float s = 1.0f / std::sqrt(7.5f + 1e-6f);
  RmsNorm(x.data(), w.data(), 4, 1e-6f, x.data());  // in place
  EXPECT_NEAR(x[0], 1 * s, 1e-6f);
  EXPECT_NEAR(x[1], 2 * s, 1e-6f);
  EXPECT_NEAR(x[2], 6 * s, 1e-6f);
  EXPECT_NEAR(x[3], 2 * s, 1e-6f);
}

TEST(OpsTest, SoftmaxSumsToOneAndHandlesLargeValues) {
  std::mt19937 rng(2);
  for (SimdLevel level : internal::SupportedSimdLevels()) {
    for (int64_t n : {1, 5, 16, 17, 100, 4096}) {
      auto x = RandomVec(n, rng, -20.0f, 20.0f);
      auto ref = x;
      SoftmaxRef(ref.data(), n);
      internal::SoftmaxAt(level, x.data(), n);
      double sum = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(x[i], ref[i], 1e-6f + 1e-5f * ref[i]);
        sum += x[i];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
    // Large logits: no overflow, max-subtracted.
    std::vector<float> big = {1000.0f, 1000.0f, 999.0f, -1000.0f, 3e38f, 3e38f, 0, 0, 0};
    internal::SoftmaxAt(level, big.data(), static_cast<int64_t>(big.size()));
    EXPECT_NEAR(big[4], 0.5f, 1e-6f);
    EXPECT_NEAR(big[5], 0.5f, 1e-6f);
    EXPECT_NEAR(big[0], 0.0f, 1e-6f);
    std::vector<float> same(37, 88.5f);
    internal::SoftmaxAt(level, same.data(), 37);
    for (float v : same) ASSERT_NEAR(v, 1.0f / 37, 1e-6f);
  }
}

// GeGLU (tanh GELU) against the double-precision reference and its definition at known
// points, every level, gates far out on both sides (the exp clamps must not make NaN).
TEST(OpsTest, GeGluMatchesRefAllLevels) {
  std::mt19937 rng(4);
  for (SimdLevel level : internal::SupportedSimdLevels()) {
    for (int64_t n : {1, 9, 16, 31, 9216}) {
      const auto g = RandomVec(n, rng, -60.0f, 60.0f), u = RandomVec(n, rng);
      std::vector<float> ref(n), got(n);
      GeGluRef(g.data(), u.data(), ref.data(), n);
      internal::GeGluAt(level, g.data(), u.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        ASSERT_NEAR(got[i], ref[i], 1e-6f + 4e-6f * std::fabs(ref[i])) << g[i];
      }
    }
  }
  // gelu(1) = 0.841192 (tanh form), gelu(-3) = -0.003637, gelu(0) = 0.
  const float g[3] = {1.0f, -3.0f, 0.0f}, u[3] = {1.0f, 1.0f, 5.0f};
  float out[3];
  GeGlu(g, u, out, 3);
  EXPECT_NEAR(out[0], 0.841192f, 1e-5f);
  EXPECT_NEAR(out[1], -0.003637f, 1e-5f);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(OpsTest, SwiGluMatchesRefAllLevels) {
  std::mt19937 rng(3);
  for (SimdLevel level : internal::SupportedSimdLevels()) {
    for (int64_t n : {1, 9, 16, 31, 5632}) {
      const auto g = RandomVec(n, rng, -12.0f, 12.0f), u = RandomVec(n, rng);
      std::vector<float> ref(n), got(n);
      SwiGluRef(g.data(), u.data(), ref.data(), n);
      internal::SwiGluAt(level, g.data(), u.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], ref[i], 1e-6f + 2e-6f * std::fabs(ref[i])) << i;
      }
      // out aliases gate.
      auto g2 = g;
      internal::SwiGluAt(level, g2.data(), u.data(), g2.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g2[i], got[i]);
    }
  }
  const float g = 1.5f, u = 2.0f;
  float out;
  SwiGlu(&g, &u, &out, 1);
  EXPECT_NEAR(out, 1.5f / (1.0f + std::exp(-1.5f)) * 2.0f, 1e-6f);
}

TEST(RopeTest, MatchesRef) {
  std::mt19937 rng(4);
  const int n_head = 4, head_dim = 64;
  const int64_t n_tokens = 9, stride = n_head * head_dim + 8;  // padded rows
  const std::vector<float> ff = RandomVec(head_dim / 2, rng, 1.0f, 8.0f);
  std::vector<int32_t> pos(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) pos[t] = static_cast<int32_t>(t * 397 % 3000);
  for (int variant = 0; variant < 4; ++variant) {
    RopeParams p{head_dim, variant % 2 ? 500000.0f : 10000.0f};
    if (variant >= 2) {
      p.freq_scale = 0.25f;
      p.freq_factors = ff.data();
    }
    if (variant == 3) p.n_dims = 32;  // partial rotation
    auto x = RandomVec(n_tokens * stride, rng);
    auto ref = x;
    RopeRef(ref.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    Rope(x.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], ref[i], 2e-3f) << variant << " " << i;
  }
}

// YaRN (ggml's rope_yarn): the correction dims as ggml computes them, and each pair's
// angle: below corr_dims[0] the original frequency, above corr_dims[1] the interpolated
// one (freq_scale), a linear ramp between; Rope against RopeRef with it.
TEST(RopeTest, YarnMixesOriginalAndInterpolatedFrequenciesByTheRamp) {
  float dims[2];
  // 64 dims, original context 4096, base 10000: 64 ln(4096 / (32 * 2 pi)) / (2 ln 10000) =
  // 10.47 -> 10; 64 ln(4096 / (2 pi)) / (2 ln 10000) = 22.5 -> 23.
  RopeYarnCorrDims(64, 4096, 10000.0f, 32.0f, 1.0f, dims);
  EXPECT_EQ(dims[0], 10.0f);
  EXPECT_EQ(dims[1], 23.0f);
  RopeYarnCorrDims(64, 64, 10000.0f, 32.0f, 1.0f, dims);  // a short original context
  EXPECT_EQ(dims[0], 0.0f);                               // clamped at 0
  EXPECT_EQ(dims[1], 9.0f);                               // 64 ln(64 / 2 pi) / 18.42 = 8.06
  const int head_dim = 64;
  RopeParams p{head_dim, 10000.0f};
  p.freq_scale = 0.25f;
  p.ext_factor = 1.0f;
  p.corr_dims[0] = 10;
  p.corr_dims[1] = 23;
  const int32_t pos[1] = {1000};
  for (int i : {0, 5, 10, 16, 23, 31}) {
    std::vector<float> x(head_dim, 0.0f);
    x[2 * i] = 1.0f;
    RopeRef(x.data(), head_dim, 1, pos, 1, head_dim, p);
    const double ramp = 1.0 - std::min(1.0, std::max(0.0, (i - 10.0) / 13.0));
    const double scale = 0.25 * (1.0 - ramp) + ramp;
    const double theta = 1000.0 * scale * std::pow(10000.0, -2.0 * i / head_dim);
    EXPECT_NEAR(x[2 * i], std::cos(theta), 1e-6) << i;
    EXPECT_NEAR(x[2 * i + 1], std::sin(theta), 1e-6) << i;
  }
  std::mt19937 rng(8);
  const int64_t n_tokens = 6, stride = 2 * head_dim;
  std::vector<int32_t> many(n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t) many[t] = static_cast<int32_t>(t * 911 % 5000);
  for (bool neox : {false, true}) {
    p.neox = neox;
    auto x = RandomVec(n_tokens * stride, rng);
    auto ref = x;
    RopeRef(ref.data(), stride, n_tokens, many.data(), 2, head_dim, p);
    Rope(x.data(), stride, n_tokens, many.data(), 2, head_dim, p);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], ref[i], 2e-3f) << neox << " " << i;
  }
}

// NeoX mode pairs dim i with dim i + n_dims/2. Checked against the definition: the
// llama-mode rotation of the same values laid out as adjacent pairs (x[i], x[i + n/2]) ->
// (y[2i], y[2i+1]), for both Rope and RopeRef, with partial rotation and freq factors.
TEST(RopeTest, NeoxPairsEachDimWithTheOneHalfAHeadAway) {
  std::mt19937 rng(6);
  const int n_head = 3, head_dim = 64;
  const int64_t n_tokens = 5, stride = n_head * head_dim;
  const std::vector<float> ff = RandomVec(head_dim / 2, rng, 1.0f, 8.0f);
  const std::vector<int32_t> pos = {0, 1, 17, 511, 2900};
  for (int variant = 0; variant < 3; ++variant) {
    RopeParams p{variant == 2 ? 32 : head_dim, variant ? 1000000.0f : 10000.0f};
    if (variant == 1) p.freq_factors = ff.data();
    const int half = p.n_dims / 2;
    const auto x = RandomVec(n_tokens * stride, rng);
    // Interleave each head's first n_dims dims as adjacent pairs.
    std::vector<float> adj = x;
    for (int64_t r = 0; r < n_tokens * n_head; ++r) {
      for (int i = 0; i < half; ++i) {
        adj[r * head_dim + 2 * i] = x[r * head_dim + i];
        adj[r * head_dim + 2 * i + 1] = x[r * head_dim + i + half];
      }
    }
    RopeRef(adj.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    std::vector<float> want = x;
    for (int64_t r = 0; r < n_tokens * n_head; ++r) {
      for (int i = 0; i < half; ++i) {
        want[r * head_dim + i] = adj[r * head_dim + 2 * i];
        want[r * head_dim + i + half] = adj[r * head_dim + 2 * i + 1];
      }
    }
    RopeParams pn = p;
    pn.neox = true;
    auto ref = x, got = x;
    RopeRef(ref.data(), stride, n_tokens, pos.data(), n_head, head_dim, pn);
    Rope(got.data(), stride, n_tokens, pos.data(), n_head, head_dim, pn);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(ref[i], want[i]) << variant << " " << i;
      ASSERT_NEAR(got[i], want[i], 2e-3f) << variant << " " << i;
    }
    // Not the llama mode: some dim moved differently.
    auto norm = x;
    RopeRef(norm.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    EXPECT_NE(norm, ref) << variant;
  }
}

// attn_factor scales the rotated dims only (cos and sin both), in both modes; the
// unrotated tail of a partial rotation is left alone.
TEST(RopeTest, AttnFactorScalesTheRotatedDims) {
  std::mt19937 rng(7);
  const int n_head = 2, head_dim = 64, n_dims = 48;
  const int64_t n_tokens = 3, stride = n_head * head_dim;
  const std::vector<int32_t> pos = {0, 5, 300};
  for (bool neox : {false, true}) {
    RopeParams p{n_dims, 10000.0f};
    p.neox = neox;
    RopeParams scaled = p;
    scaled.attn_factor = 1.25f;
    const auto x = RandomVec(n_tokens * stride, rng);
    auto a = x, b = x, ra = x, rb = x;
    Rope(a.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    Rope(b.data(), stride, n_tokens, pos.data(), n_head, head_dim, scaled);
    RopeRef(ra.data(), stride, n_tokens, pos.data(), n_head, head_dim, p);
    RopeRef(rb.data(), stride, n_tokens, pos.data(), n_head, head_dim, scaled);
    for (int64_t r = 0; r < n_tokens * n_head; ++r) {
      for (int d = 0; d < head_dim; ++d) {
        const size_t i = static_cast<size_t>(r * head_dim + d);
        const float want = d < n_dims ? 1.25f * a[i] : x[i];
        ASSERT_NEAR(b[i], want, 1e-5f) << neox << " " << i;
        ASSERT_NEAR(rb[i], d < n_dims ? 1.25f * ra[i] : x[i], 1e-5f) << neox << " " << i;
      }
    }
  }
}

TEST(RopeTest, PositionZeroIsIdentityAndNormPreserved) {
  std::mt19937 rng(5);
  const int n_head = 2, head_dim = 32;
  auto x = RandomVec(2 * n_head * head_dim, rng);
  const auto orig = x;
  const int32_t pos[2] = {0, 1234};
  RopeParams p{head_dim, 10000.0f};
  Rope(x.data(), n_head * head_dim, 2, pos, n_head, head_dim, p);
  for (int i = 0; i < n_head * head_dim; ++i) EXPECT_EQ(x[i], orig[i]);
  for (int i = n_head * head_dim; i < 2 * n_head * head_dim; i += 2) {
    const float n0 = std::hypot(orig[i], orig[i + 1]), n1 = std::hypot(x[i], x[i + 1]);
    EXPECT_NEAR(n0, n1, 1e-5f);
  }
}

TEST(RopeTest, KnownValuePos1Theta10000) {
  // Pair i = 1 of head_dim 4: theta = 1 * 10000^(-2/4) = 0.01. Pair 0: theta = 1.
  std::vector<float> x = {1, 0, 0, 1};
  const int32_t pos = 1;
  RopeParams p{4, 10000.0f};
  Rope(x.data(), 4, 1, &pos, 1, 4, p);
  EXPECT_NEAR(x[0], std::cos(1.0f), 1e-6f);
  EXPECT_NEAR(x[1], std::sin(1.0f), 1e-6f);
  EXPECT_NEAR(x[2], -std::sin(0.01f), 1e-6f);
  EXPECT_NEAR(x[3], std::cos(0.01f), 1e-6f);
}

TEST(RopeTest, FreqScaleAndFactorsHonoured) {
  // freq_scale 0.5 at position 4 equals freq_scale 1 at position 2; freq_factors 2 on
  // pair 0 halves its angle.
  std::vector<float> a = {1, 0, 1, 0}, b = {1, 0, 1, 0}, c = {1, 0, 1, 0};
  const int32_t p4 = 4, p2 = 2;
  RopeParams scaled{4, 10000.0f, 0.5f};
  Rope(a.data(), 4, 1, &p4, 1, 4, scaled);
  RopeParams plain{4, 10000.0f};
  Rope(b.data(), 4, 1, &p2, 1, 4, plain);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(a[i], b[i], 1e-6f);

  const float ff[2] = {2.0f, 1.0f};
  RopeParams with_ff{4, 10000.0f, 1.0f, ff};
  Rope(c.data(), 4, 1, &p2, 1, 4, with_ff);
  EXPECT_NEAR(c[0], std::cos(1.0f), 1e-6f);  // theta_0 = 2 / 2
  EXPECT_NEAR(c[1], std::sin(1.0f), 1e-6f);
  EXPECT_NEAR(c[2], std::cos(0.02f), 1e-6f);  // theta_1 = 2 * 0.01
  EXPECT_NEAR(c[3], std::sin(0.02f), 1e-6f);
}

}  // namespace
}  // namespace trellis

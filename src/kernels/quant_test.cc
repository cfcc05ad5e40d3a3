#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels_test_util.h"
#include "util/fp16.h"

namespace trellis {
namespace {

using testing_util::Gaussian;

TEST(QuantTest, BlockSizesMatchGgml) {
  EXPECT_EQ(sizeof(BlockQ4_0), 18u);
  EXPECT_EQ(sizeof(BlockQ8_0), 34u);
  EXPECT_EQ(sizeof(BlockQ4_K), 144u);
  EXPECT_EQ(sizeof(BlockQ6_K), 210u);
  EXPECT_EQ(sizeof(BlockQ8_K), 292u);
  EXPECT_EQ(sizeof(BlockQ5_0), 22u);
  EXPECT_EQ(sizeof(BlockQ5_1), 24u);
  EXPECT_EQ(sizeof(BlockIQ4_NL), 18u);
  EXPECT_EQ(sizeof(BlockQ2_K), 84u);
  EXPECT_EQ(sizeof(BlockQ3_K), 110u);
  EXPECT_EQ(sizeof(BlockIQ4_XS), 136u);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kQ5_1,
                     GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kIQ4_XS}) {
    EXPECT_TRUE(GetGgmlTypeTraits(t).computable);
    EXPECT_EQ(static_cast<size_t>(GetGgmlTypeTraits(t).block_bytes),
              t == GgmlType::kQ5_0 ? 22u : t == GgmlType::kQ5_1 ? 24u : t == GgmlType::kIQ4_NL ? 18u
              : t == GgmlType::kQ2_K ? 84u : t == GgmlType::kQ3_K ? 110u : t == GgmlType::kIQ4_XS ? 136u
              : GetGgmlTypeTraits(t).block_bytes);
  }
  EXPECT_EQ(RowBytes(GgmlType::kQ4_K, 512), 2 * 144);
}

// The read-only types, pinned to hand-built blocks: each value below is worked out from
// ggml's block layout (ggml-common.h), not from Trellis's accessors.
TEST(QuantTest, DequantizeQ5_0AndQ5_1KnownValues) {
  BlockQ5_0 b{};
  b.d = 0x3800;  // 0.5
  // Element k: low nibble k % 16, 5th bit set for k in {1, 17, 31} (qh bits 1, 17, 31).
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const uint32_t qh = 1u << 1 | 1u << 17 | 1u << 31;
  std::memcpy(b.qh, &qh, 4);
  float y[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ5_0, &b, y, 32).ok());
  EXPECT_EQ(y[0], (0 - 16) * 0.5f);
  EXPECT_EQ(y[1], (1 + 16 - 16) * 0.5f);  // 5th bit
  EXPECT_EQ(y[15], (15 - 16) * 0.5f);
  EXPECT_EQ(y[16], (15 - 16) * 0.5f);     // high nibble of qs[0] = 15
  EXPECT_EQ(y[17], (14 + 16 - 16) * 0.5f);
  EXPECT_EQ(y[31], (0 + 16 - 16) * 0.5f);
  BlockQ5_1 c{};
  c.d = 0x3800;   // 0.5
  c.m = 0xBC00;   // -1
  std::memcpy(c.qs, b.qs, 16);
  std::memcpy(c.qh, &qh, 4);
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ5_1, &c, y, 32).ok());
  EXPECT_EQ(y[0], -1.f);
  EXPECT_EQ(y[1], 17 * 0.5f - 1.f);
  EXPECT_EQ(y[17], 30 * 0.5f - 1.f);
}

TEST(QuantTest, DequantizeIQ4KnownValues) {
  BlockIQ4_NL n{};
  n.d = 0x3C00;  // 1
  n.qs[0] = 0xF0;  // element 0: index 0 (-127), element 16: index 15 (113)
  n.qs[5] = 0x78;  // element 5: index 8 (1), element 21: index 7 (-10)
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kIQ4_NL, &n, y, 32).ok());
  EXPECT_EQ(y[0], -127.f);
  EXPECT_EQ(y[16], 113.f);
  EXPECT_EQ(y[5], 1.f);
  EXPECT_EQ(y[21], -10.f);
  EXPECT_EQ(y[1], -127.f);  // index 0
  BlockIQ4_XS x{};
  x.d = 0x3800;  // 0.5
  // Sub-block scales: sub-block 0: low 4 bits 1 (scales_l[0] & 15), high bits 2 (scales_h bits
  // 0-1) -> 33 - 32 = 1; sub-block 3: low 15 (scales_l[1] >> 4), high 1 (bits 6-7) -> 31 - 32 =
  // -1; sub-block 7: low 0, high 3 (bits 14-15) -> 48 - 32 = 16.
  x.scales_l[0] = 0x01;
  x.scales_l[1] = 0xF0;
  x.scales_h = static_cast<uint16_t>(2 | 1 << 6 | 3 << 14);
  std::memset(x.qs, 0x88, sizeof(x.qs));  // every index 8: value 1
  x.qs[16 * 3 + 2] = 0x0F;                 // sub-block 3: element 2 index 15, element 18 index 0
  ASSERT_TRUE(DequantizeRow(GgmlType::kIQ4_XS, &x, y, 256).ok());
  EXPECT_EQ(y[0], 0.5f * 1 * 1);
  EXPECT_EQ(y[96 + 2], 0.5f * -1 * 113);
  EXPECT_EQ(y[96 + 18], 0.5f * -1 * -127);
  EXPECT_EQ(y[224], 0.5f * 16 * 1);
  EXPECT_EQ(y[32], 0.5f * -32 * 1);  // sub-block 1: all scale bits 0 -> -32
}

TEST(QuantTest, DequantizeQ2_KAndQ3_KKnownValues) {
  BlockQ2_K b{};
  b.d = 0x3C00;     // 1
  b.dmin = 0x3800;  // 0.5
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>((g % 16) | ((15 - g) << 4));
  // qs[32 n + l] holds elements 128 n + 32 j + l at bits 2 j: make element 128 + 64 + 5
  // (n = 1, j = 2, l = 5) a 3 and element 37 (n = 0, j = 1, l = 5) a 2.
  b.qs[32 + 5] = 3 << 4;
  b.qs[5] = 2 << 2;
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ2_K, &b, y, 256).ok());
  // group of element k is k / 16: 197 -> 12 (scale 12, min 3); 37 -> 2 (scale 2, min 13)
  EXPECT_EQ(y[197], 1.f * 12 * 3 - 0.5f * 3);
  EXPECT_EQ(y[37], 1.f * 2 * 2 - 0.5f * 13);
  EXPECT_EQ(y[0], -0.5f * 15);
  BlockQ3_K c{};
  c.d = 0x3800;  // 0.5
  // Scale of group 5: low 4 bits scales[5] & 15 = 9, high 2 bits (scales[8 + 1] >> 2) & 3 = 2
  // -> 41 - 32 = 9. Group 13: low scales[5] >> 4 = 4, high (scales[9] >> 6) & 3 = 1 -> 20 - 32.
  c.scales[5] = 0x49;
  c.scales[9] = static_cast<uint8_t>(2 << 2 | 1 << 6);
  // Element 80 (group 5; n = 0, j = 2, l = 16): low bits 1, hmask bit 2 of hmask[16] set -> 1.
  c.qs[16] = 1 << 4;
  c.hmask[16] = 1 << 2;
  // Element 208 (group 13; n = 1, j = 2, l = 16): low bits 3 in qs[48], hmask clear -> -1.
  c.qs[48] = 3 << 4;
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ3_K, &c, y, 256).ok());
  EXPECT_EQ(y[80], 0.5f * 9 * 1);
  EXPECT_EQ(y[208], 0.5f * (20 - 32) * -1);
  EXPECT_EQ(y[81], 0.5f * 9 * -4);  // low 0, hmask clear
}

TEST(QuantTest, DequantizeQ4_0KnownValues) {
  BlockQ4_0 b;
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_0, &b, y, 32).ok());
  EXPECT_EQ(y[0], -4.f);   // (0 - 8) * 0.5
  EXPECT_EQ(y[8], 0.f);
  EXPECT_EQ(y[15], 3.5f);  // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);  // high nibble 15
  EXPECT_EQ(y[31], -4.f);  // high nibble 0
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[j + 16], (7 - j) * 0.5f);
  }
}

TEST(QuantTest, DequantizeQ8_0KnownValues) {
  BlockQ8_0 b;
  b.d = 0x3400;  // 0.25
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
  float y[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_0, &b, y, 32).ok());
  EXPECT_EQ(y[0], -4.f);
  EXPECT_EQ(y[31], 3.75f);
}

TEST(QuantTest, DequantizeQ4_KKnownValues) {
  // Scales and mins by sub-block, and the 12 bytes they pack into (worked by hand).
  const int sc[8] = {1, 2, 3, 4, 17, 18, 33, 63};
  const int mn[8] = {5, 6, 7, 8, 20, 36, 9, 48};
  BlockQ4_K b;
  b.d = 0x3C00;     // 1.0
  b.dmin = 0x3800;  // 0.5
  const uint8_t packed[12] = {65, 66, 131, 196, 69, 134, 7, 200, 65, 66, 145, 15};
  std::memcpy(b.scales, packed, 12);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>(i);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    GetScaleMinK4(j, b.scales, &s, &m);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(m, mn[j]) << j;
  }
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_K, &b, y, 256).ok());
  EXPECT_EQ(y[0], -2.5f);     // 1*1*0 - 0.5*5
  EXPECT_EQ(y[33], -3.f);     // byte 1 high nibble 0: 0 - 0.5*6
  EXPECT_EQ(y[255], 417.f);   // byte 127 high nibble 7: 63*7 - 0.5*48
  EXPECT_EQ(y[64 + 5], 3.f * 5 - 3.5f);  // byte 37 low nibble 5, sub-block 2
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int byte = 32 * c + l;
      EXPECT_EQ(y[64 * c + l], sc[2 * c] * (byte & 15) - 0.5f * mn[2 * c]);
      EXPECT_EQ(y[64 * c + 32 + l], sc[2 * c + 1] * (byte >> 4) - 0.5f * mn[2 * c + 1]);
    }
  }
}

TEST(QuantTest, DequantizeQ6_KKnownValues) {
  BlockQ6_K b;
  b.d = 0x3800;  // 0.5
  std::memset(b.ql, 0x21, sizeof(b.ql));  // low nibble 1, high nibble 2
  std::memset(b.qh, 0xE4, sizeof(b.qh));  // 2-bit fields 0, 1, 2, 3
  for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g + 1);
  // Within each half: elements 0..31 -> q = 1|0<<4 = 1; 32..63 -> 1|1<<4 = 17;
  // 64..95 -> 2|2<<4 = 34; 96..127 -> 2|3<<4 = 50. Value = d * sc * (q - 32).
  const int qv[4] = {1 - 32, 17 - 32, 34 - 32, 50 - 32};
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ6_K, &b, y, 256).ok());
  EXPECT_EQ(y[0], 0.5f * 1 * -31);
  EXPECT_EQ(y[255], 0.5f * 16 * 18);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.5f * (e / 16 + 1) * qv[(e % 128) / 32]) << e;
}

TEST(QuantTest, DequantizeF16Bf16) {
  const uint16_t h[2] = {0x3C00, 0xC000};  // 1, -2
  const uint16_t bf[2] = {0x3F80, 0x4040};  // 1, 3
  float y[2];
  ASSERT_TRUE(DequantizeRow(GgmlType::kF16, h, y, 2).ok());
  EXPECT_EQ(y[0], 1.f);
  EXPECT_EQ(y[1], -2.f);
  ASSERT_TRUE(DequantizeRow(GgmlType::kBF16, bf, y, 2).ok());
  EXPECT_EQ(y[1], 3.f);
}

TEST(QuantTest, RejectsBadArguments) {
  float x[64] = {};
  uint8_t buf[256];
  EXPECT_EQ(QuantizeRow(GgmlType::kQ4_0, x, buf, 33).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_K, buf, x, 32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeRow(GgmlType::kQ5_0, x, buf, 32).code(), StatusCode::kUnsupported);
}

double RelRmsError(GgmlType type, const std::vector<float>& x) {
  std::vector<uint8_t> q(RowBytes(type, x.size()));
  std::vector<float> y(x.size());
  EXPECT_TRUE(QuantizeRow(type, x.data(), q.data(), x.size()).ok());
  EXPECT_TRUE(DequantizeRow(type, q.data(), y.data(), x.size()).ok());
  double e2 = 0, x2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e2 += (y[i] - x[i]) * (y[i] - x[i]);
    x2 += x[i] * x[i];
  }
  return std::sqrt(e2 / x2);
}

TEST(QuantTest, RoundTripErrorBounds) {
  const std::vector<float> x = Gaussian(8192, 1, 0.7f);
  // Measured on N(0,1) data: q4_0 0.086, q4_K 0.071, q5_K 0.035, q6_K 0.017, q8_0 0.0054,
  // bf16 0.0017.
  EXPECT_LT(RelRmsError(GgmlType::kQ4_0, x), 0.15);
  EXPECT_LT(RelRmsError(GgmlType::kQ4_K, x), 0.12);
  EXPECT_LT(RelRmsError(GgmlType::kQ5_K, x), 0.06);
  EXPECT_LT(RelRmsError(GgmlType::kQ5_K, x), RelRmsError(GgmlType::kQ4_K, x) * 0.7);
  EXPECT_LT(RelRmsError(GgmlType::kQ6_K, x), 0.03);
  EXPECT_LT(RelRmsError(GgmlType::kQ8_0, x), 0.01);
  EXPECT_LT(RelRmsError(GgmlType::kF16, x), 1e-3);
  EXPECT_LT(RelRmsError(GgmlType::kBF16, x), 5e-3);
  EXPECT_EQ(RelRmsError(GgmlType::kF32, x), 0.0);
  // Offset data exercises Q4_K's mins.
  std::vector<float> shifted = Gaussian(4096, 2, 0.5f);
  for (float& f : shifted) f += 1.5f;
  EXPECT_LT(RelRmsError(GgmlType::kQ4_K, shifted), 0.05);
  EXPECT_LT(RelRmsError(GgmlType::kQ5_K, shifted), 0.025);
}

TEST(QuantTest, DequantizeQ5_KKnownValues) {
  // Q4_K's scales (see above); the 5th bit of element k is bit k / 32 of qh[k % 32].
  BlockQ5_K b;
  b.d = 0x3C00;     // 1.0
  b.dmin = 0x3800;  // 0.5
  const uint8_t packed[12] = {65, 66, 131, 196, 69, 134, 7, 200, 65, 66, 145, 15};
  std::memcpy(b.scales, packed, 12);
  for (int i = 0; i < 128; ++i) b.qs[i] = static_cast<uint8_t>(i);
  std::memset(b.qh, 0, sizeof(b.qh));
  b.qh[0] = 0x01;  // element 0 (sub-block 0)
  b.qh[1] = 0x80;  // element 7 * 32 + 1 = 225 (sub-block 7)
  float y[256];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ5_K, &b, y, 256).ok());
  EXPECT_EQ(y[0], 13.5f);              // 1*1*(0 + 16) - 0.5*5
  EXPECT_EQ(y[33], -3.f);              // qs[1] high nibble 0, no 5th bit: 0 - 0.5*6
  EXPECT_EQ(y[225], 63.f * 22 - 24);   // qs[97] high nibble 6, + 16: 63*22 - 0.5*48
  EXPECT_EQ(y[255], 63.f * 7 - 24);    // qs[127] high nibble 7, no 5th bit
  EXPECT_EQ(sizeof(BlockQ5_K), 176u);
  EXPECT_EQ(RowBytes(GgmlType::kQ5_K, 512), 2 * 176);
}

TEST(QuantTest, ZeroBlocksQuantizeToZero) {
  std::vector<float> x(256, 0.f), y(256, 1.f);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    std::vector<uint8_t> q(RowBytes(t, 256));
    ASSERT_TRUE(QuantizeRow(t, x.data(), q.data(), 256).ok());
    ASSERT_TRUE(DequantizeRow(t, q.data(), y.data(), 256).ok());
    for (float v : y) EXPECT_EQ(v, 0.f);
  }
}

TEST(QuantTest, QuantizeRowQ8_0MatchesDefinition) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // amax 16
  BlockQ8_0 b;
  QuantizeRowQ8_0(x, &b, 32);
  EXPECT_EQ(b.d, Fp32ToFp16(16.f / 127.f));
  EXPECT_EQ(b.qs[0], -127);
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[24], static_cast<int8_t>(std::round(8.f * 127.f / 16.f)));  // 63.5 -> 64
}

TEST(QuantTest, QuantizeRowQ8_KBsumsAndScale) {
  const std::vector<float> x = Gaussian(512, 3);
  BlockQ8_K b[2];
  QuantizeRowQ8_K(x.data(), b, 512);
  for (int blk = 0; blk < 2; ++blk) {
    int imax = 0;
    for (int j = 0; j < 256; ++j) {
      if (std::fabs(x[256 * blk + j]) > std::fabs(x[256 * blk + imax])) imax = j;
    }
    EXPECT_EQ(b[blk].qs[imax], -127);  // the largest magnitude maps to -127
    EXPECT_FLOAT_EQ(b[blk].d, x[256 * blk + imax] / -127.f);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += b[blk].qs[16 * g + i];
      EXPECT_EQ(b[blk].bsums[g], sum);
    }
    for (int j = 0; j < 256; ++j) EXPECT_NEAR(b[blk].qs[j] * b[blk].d, x[256 * blk + j], std::fabs(b[blk].d) * 0.5001);
  }
}

}  // namespace
}  // namespace trellis

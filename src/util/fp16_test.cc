#include "util/fp16.h"

#include <gtest/gtest.h>

#include <cmath>

namespace trellis {
namespace {

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(Fp16ToFp32(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7c00)));
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(Fp32ToFp16(1e6f), 0x7c00);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -26)), 0x0000);
}

TEST(Fp16Test, RoundTripEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // nan payloads
    EXPECT_EQ(Fp32ToFp16(Fp16ToFp32(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Fp16Test, RoundsToNearestEven) {
  // 1 + 2^-11 lies exactly between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Bf16Test, RoundTrip) {
  EXPECT_EQ(Bf16ToFp32(0x3f80), 1.0f);
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3f80);
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) continue;
    EXPECT_EQ(Fp32ToBf16(Bf16ToFp32(static_cast<uint16_t>(h))), h);
  }
}

}  // namespace
}  // namespace trellis

#include "kernels/packed.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/kernels_test_util.h"
#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis {
namespace {

using testing_util::AlignedBuffer;
using testing_util::Gaussian;

// Every type with an x16 layout.
constexpr GgmlType kPackedTypes[] = {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                                     GgmlType::kIQ4_NL, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                                     GgmlType::kIQ4_XS, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kF16,
                                     GgmlType::kBF16};

struct Packed {
  std::vector<uint8_t> bytes;  // original rows
  AlignedBuffer packed{0};
  WeightMatrix w;
};

Packed MakePacked(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  Packed m;
  const std::vector<float> src = Gaussian(rows * cols, seed);
  const int64_t rb = RowBytes(type, cols);
  m.bytes.resize(static_cast<size_t>(rb * rows));
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(testing_util::MakeWeightRow(type, src.data() + r * cols, cols, m.bytes.data() + r * rb, rng));
  m.w = WeightMatrix{type, m.bytes.data(), rows, cols, rb};
  m.packed = AlignedBuffer(PackedBytes(m.w));
  const int64_t groups = (rows + kPackRows - 1) / kPackRows;
  // Two calls over disjoint ranges: the result must not depend on how packing is split.
  PackWeights(m.w, 0, groups / 2, m.packed.ptr);
  PackWeights(m.w, groups / 2, groups, m.packed.ptr);
  m.w.packed = m.packed.ptr;
  return m;
}

// Element k of row r from the packed copy, undoing the layout by hand (the documented
// contract in packed.h), as the value the original block holds: (q, f16 scale).
std::pair<int, uint16_t> PackedElement(const WeightMatrix& w, int64_t r, int64_t k) {
  const int64_t nb = w.cols / 32, b = k / 32, e = k % 32;
  const bool q4 = w.type == GgmlType::kQ4_0;
  const int lines = q4 ? 4 : 8;
  const uint8_t* g = w.packed + (r / kPackRows) * PackedGroupBytes(w.type, w.cols);
  const int64_t rr = r % kPackRows;
  const uint8_t* qs = g + b * 64 * lines;
  const uint16_t scale = reinterpret_cast<const uint16_t*>(g + nb * 64 * lines)[16 * b + rr];
  if (q4) {
    const int i = static_cast<int>(e / 8), q = static_cast<int>(e % 4);
    const uint8_t byte = qs[64 * i + 4 * rr + q];
    const int nib = (e % 8) < 4 ? (byte & 0xF) : (byte >> 4);
    return {nib - 8, scale};
  }
  const int j = static_cast<int>(e / 4), q = static_cast<int>(e % 4);
  return {static_cast<int>(qs[64 * j + 4 * rr + q]) - 128, scale};
}

TEST(PackedTest, LayoutHoldsEveryWeightAndScale) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const Packed m = MakePacked(type, 21, 96, 1);
    for (int64_t r = 0; r < m.w.rows; ++r) {
      for (int64_t k = 0; k < m.w.cols; ++k) {
        const auto [q, scale] = PackedElement(m.w, r, k);
        const uint8_t* row = m.bytes.data() + r * m.w.row_bytes;
        int want;
        uint16_t want_scale;
        if (type == GgmlType::kQ4_0) {
          const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(row)[k / 32];
          const int e = static_cast<int>(k % 32);
          want = (e < 16 ? blk.qs[e] & 0xF : blk.qs[e - 16] >> 4) - 8;
          want_scale = blk.d;
        } else {
          const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(row)[k / 32];
          want = blk.qs[k % 32];
          want_scale = blk.d;
        }
        ASSERT_EQ(q, want) << "r=" << r << " k=" << k;
        ASSERT_EQ(scale, want_scale) << "r=" << r << " k=" << k;
      }
    }
    // Rows past the end of the last group are zero-scaled.
    for (int64_t r = m.w.rows; r < 32; ++r) EXPECT_EQ(PackedElement(m.w, r, 0).second, 0);
  }
}

// Q5_0, Q5_1 and IQ4_NL: every element's 5 (4) bits, scale and Q5_1's min where packed.h
// says they are.
TEST(PackedTest, LowBitBlockLayoutsHoldEveryWeightScaleAndMin) {
  for (GgmlType type : {GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL}) {
    SCOPED_TRACE(GetGgmlTypeTraits(type).name);
    const Packed m = MakePacked(type, 21, 96, 2);
    const int64_t nb = m.w.cols / 32;
    const int lines = PackedLines(type);
    for (int64_t r = 0; r < m.w.rows; ++r) {
      const uint8_t* g = m.w.packed + (r / kPackRows) * PackedGroupBytes(type, m.w.cols);
      const int rr = static_cast<int>(r % kPackRows);
      const uint8_t* row = m.bytes.data() + r * m.w.row_bytes;
      for (int64_t k = 0; k < m.w.cols; ++k) {
        const int64_t b = k / 32;
        const int e = static_cast<int>(k % 32), i = e / 8, q = e % 4, half = (e % 8) / 4;
        const uint8_t* qs = g + b * 64 * lines;
        const uint8_t byte = qs[64 * i + 4 * rr + q];
        int got = half ? byte >> 4 : byte & 0xF;
        if (lines == 5) got |= ((qs[256 + 4 * rr + q] >> (2 * i + half)) & 1) << 4;
        const uint16_t* scales = reinterpret_cast<const uint16_t*>(g + nb * 64 * lines);
        int want;
        uint16_t want_d;
        if (type == GgmlType::kQ5_0) {
          const BlockQ5_0& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
          want = Q5Element(blk, e);
          want_d = blk.d;
        } else if (type == GgmlType::kQ5_1) {
          const BlockQ5_1& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
          want = Q5Element(blk, e);
          want_d = blk.d;
          ASSERT_EQ(scales[16 * nb + 16 * b + rr], blk.m) << "r=" << r << " k=" << k;
        } else {
          const BlockIQ4_NL& blk = reinterpret_cast<const BlockIQ4_NL*>(row)[b];
          ASSERT_EQ(kIq4NlValues[got], IQ4NlElement(blk, e)) << "r=" << r << " k=" << k;
          want = e < 16 ? blk.qs[e] & 0xF : blk.qs[e - 16] >> 4;
          want_d = blk.d;
        }
        ASSERT_EQ(got, want) << "r=" << r << " k=" << k;
        ASSERT_EQ(scales[16 * b + rr], want_d) << "r=" << r << " k=" << k;
      }
    }
  }
}

TEST(PackedTest, Q4KLayoutHoldsEveryWeightScaleAndMin) {
  const Packed m = MakePacked(GgmlType::kQ4_K, 19, 512, 3);
  const size_t group_bytes = PackedGroupBytes(GgmlType::kQ4_K, 512);
  for (int64_t r = 0; r < m.w.rows; ++r) {
    const uint8_t* g = m.w.packed + (r / kPackRows) * group_bytes;
    const int rr = static_cast<int>(r % kPackRows);
    const BlockQ4_K* blocks = reinterpret_cast<const BlockQ4_K*>(m.bytes.data() + r * m.w.row_bytes);
    for (int64_t k = 0; k < m.w.cols; ++k) {
      const BlockQ4_K& blk = blocks[k / 256];
      const int e = static_cast<int>(k % 256), j = e / 32, i = (e % 32) / 8, q = e % 4;
      const uint8_t* sb = g + (k / 256) * kPackedQ4KSuperBytes;
      const uint8_t byte = sb[256 * j + 64 * i + 4 * rr + q];
      const int got = (e % 8) < 4 ? (byte & 0xF) : (byte >> 4);
      const uint8_t src = blk.qs[32 * (e / 64) + e % 32];
      const int want = (e % 64) < 32 ? (src & 0xF) : (src >> 4);
      ASSERT_EQ(got, want) << "r=" << r << " k=" << k;
      uint8_t sc, mn;
      GetScaleMinK4(j, blk.scales, &sc, &mn);
      ASSERT_EQ(sb[2048 + 64 + 16 * j + rr], sc);
      ASSERT_EQ(sb[2048 + 64 + 128 + 16 * j + rr], mn);
      ASSERT_EQ(reinterpret_cast<const uint16_t*>(sb + 2048)[rr], blk.d);
      ASSERT_EQ(reinterpret_cast<const uint16_t*>(sb + 2048)[16 + rr], blk.dmin);
    }
  }
}

TEST(PackedTest, IQ4XSLayoutHoldsEveryIndexScaleAndD) {
  const Packed m = MakePacked(GgmlType::kIQ4_XS, 19, 512, 4);
  const size_t group_bytes = PackedGroupBytes(GgmlType::kIQ4_XS, 512);
  for (int64_t r = 0; r < m.w.rows; ++r) {
    const uint8_t* g = m.w.packed + (r / kPackRows) * group_bytes;
    const int rr = static_cast<int>(r % kPackRows);
    const BlockIQ4_XS* blocks = reinterpret_cast<const BlockIQ4_XS*>(m.bytes.data() + r * m.w.row_bytes);
    for (int64_t k = 0; k < m.w.cols; ++k) {
      const BlockIQ4_XS& blk = blocks[k / 256];
      const int e = static_cast<int>(k % 256), j = e / 32, i = (e % 32) / 8, q = e % 4;
      const uint8_t* sb = g + (k / 256) * kPackedIQ4XSSuperBytes;
      const uint8_t byte = sb[256 * j + 64 * i + 4 * rr + q];
      const int got = (e % 8) < 4 ? (byte & 0xF) : (byte >> 4);
      ASSERT_EQ(kIq4NlValues[got], IQ4XsElement(blk, e)) << "r=" << r << " k=" << k;
      ASSERT_EQ(reinterpret_cast<const int8_t*>(sb + 2048 + 32)[16 * j + rr], IQ4XsScale(blk, j));
      ASSERT_EQ(reinterpret_cast<const uint16_t*>(sb + 2048)[rr], blk.d);
    }
  }
}

// Q2_K and Q3_K: every element's 2 (3) bits, each group's scale (and Q2_K's min) and d
// (dmin) where packed.h says they are.
TEST(PackedTest, Q2KAndQ3KLayoutsHoldEveryWeightScaleAndMin) {
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K}) {
    SCOPED_TRACE(GetGgmlTypeTraits(type).name);
    const bool q3 = type == GgmlType::kQ3_K;
    const Packed m = MakePacked(type, 19, 512, 6);
    const size_t group_bytes = PackedGroupBytes(type, 512);
    const int64_t block = q3 ? 192 : 128, super = q3 ? kPackedQ3KSuperBytes : kPackedQ2KSuperBytes;
    for (int64_t r = 0; r < m.w.rows; ++r) {
      const uint8_t* g = m.w.packed + (r / kPackRows) * group_bytes;
      const int rr = static_cast<int>(r % kPackRows);
      const uint8_t* row = m.bytes.data() + r * m.w.row_bytes;
      for (int64_t k = 0; k < m.w.cols; ++k) {
        const int e = static_cast<int>(k % 256), j = e / 32, x = e % 32, mm = x / 16, f = (x % 16) / 4, q = x % 4;
        const uint8_t* sb = g + (k / 256) * super;
        int got = (sb[block * j + 64 * mm + 4 * rr + q] >> (2 * f)) & 3;
        const uint16_t* d = reinterpret_cast<const uint16_t*>(sb + 8 * block + 256);
        if (q3) {
          const BlockQ3_K& blk = reinterpret_cast<const BlockQ3_K*>(row)[k / 256];
          got |= ((sb[block * j + 128 + 4 * rr + q] >> (x / 4)) & 1) << 2;
          ASSERT_EQ(got - 4, Q3KElement(blk, e)) << "r=" << r << " k=" << k;
          ASSERT_EQ(reinterpret_cast<const int8_t*>(sb + 8 * block)[16 * (e / 16) + rr], Q3KScale(blk, e / 16));
          ASSERT_EQ(d[rr], blk.d);
        } else {
          const BlockQ2_K& blk = reinterpret_cast<const BlockQ2_K*>(row)[k / 256];
          ASSERT_EQ(got, Q2KElement(blk, e)) << "r=" << r << " k=" << k;
          ASSERT_EQ(sb[8 * block + 16 * (e / 16) + rr], blk.scales[e / 16]);
          ASSERT_EQ(d[rr], blk.d);
          ASSERT_EQ(d[16 + rr], blk.dmin);
        }
      }
    }
  }
}

TEST(PackedTest, SizesAndTypes) {
  EXPECT_TRUE(PackableType(GgmlType::kQ4_0));
  EXPECT_TRUE(PackableType(GgmlType::kQ8_0));
  EXPECT_TRUE(PackableType(GgmlType::kQ4_K));
  EXPECT_TRUE(PackableType(GgmlType::kQ6_K));
  EXPECT_TRUE(PackableType(GgmlType::kQ5_K));
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ5_K, 512), 2u * 2880);  // 16 x 176 + 64 per super-block
  EXPECT_TRUE(PackableType(GgmlType::kBF16));
  EXPECT_FALSE(PackableType(GgmlType::kF32));
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ6_K, 512), 2u * 3392);  // 16 x 210 + 32 per super-block
  EXPECT_TRUE(PackableType(GgmlType::kF16));
  EXPECT_FALSE(PackingUseful(WeightMatrix{GgmlType::kF16, nullptr, 16, 100, 200}));  // cols % 32 != 0
  EXPECT_EQ(PackedGroupBytes(GgmlType::kF16, 2048), 16u * 2 * 2048);
  // Same size as the original: 16 rows x 18 bytes per Q4_0 block, 16 x 34 per Q8_0 block.
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ4_0, 2048), 16u * 18 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ8_0, 2048), 16u * 34 * 64);
  // Q5_0 16 x 22, Q5_1 16 x 24 and IQ4_NL 16 x 18 bytes per block, as the originals.
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ5_0, 2048), 16u * 22 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ5_1, 2048), 16u * 24 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kIQ4_NL, 2048), 16u * 18 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kIQ4_XS, 512), 2u * 2240);  // 16 x 136 + 64 per super-block
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ2_K, 512), 2u * 1344);    // 16 x 84, as the original
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ3_K, 512), 2u * 1856);    // 16 x 110 + 96 per super-block
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ4_0, 96) % 64, 0u);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ4_K, 2048), 8u * 2368);  // 16 x 144 + 64 per super-block
  EXPECT_EQ(PackedBytes(WeightMatrix{GgmlType::kQ4_0, nullptr, 17, 64, 36}), 2 * PackedGroupBytes(GgmlType::kQ4_0, 64));
}

// Overwrites a matrix's original (row-major) bytes once its reference output is taken:
// all 0xFF makes every f16/bf16 value and block scale NaN, so a run that fell back to the
// row-major kernels instead of the packed copy writes NaN and fails the comparison. That
// is how these tests know the packed kernel ran.
void PoisonRowMajor(Packed& m) { std::fill(m.bytes.begin(), m.bytes.end(), uint8_t{0xFF}); }

// Types whose packed kernel the ISA must have; the tests fail if one is missing, rather
// than skipping it and passing with nothing run.
std::vector<GgmlType> RequiredPacked(KernelIsa isa) {
  if (isa == KernelIsa::kAvx512 || isa == KernelIsa::kAvx2) {
    return {std::begin(kPackedTypes), std::end(kPackedTypes)};
  }
  if (isa == KernelIsa::kNeon && NeonDotprodEnabled()) {  // every integer type
    std::vector<GgmlType> types(std::begin(kPackedTypes), std::end(kPackedTypes));
    std::erase_if(types, [](GgmlType t) { return t == GgmlType::kF16 || t == GgmlType::kBF16; });
    return types;
  }
  return {};
}

// Runs `check(type)` for every type with a packed kernel for `isa`; fails if a required
// type has none.
template <typename F>
void ForEachPackedType(KernelIsa isa, F check) {
  const std::vector<GgmlType> required = RequiredPacked(isa);
  for (GgmlType type : kPackedTypes) {
    if (matmul_internal::GetPackedKernel(isa, type).fn == nullptr) {
      EXPECT_EQ(std::find(required.begin(), required.end(), type), required.end())
          << KernelIsaName(isa) << " has no packed kernel for " << GetGgmlTypeTraits(type).name;
      continue;
    }
    check(type);
  }
}

// The packed kernels of `isa` against a double-precision reference built from the
// dequantized weights and the quantized activations the packed kernels consume: the
// integer dots are exact, so only f32 rounding of scales and sums differs.
void KernelsMatchReferenceFor(KernelIsa isa) {
  struct Shape {
    int64_t rows, cols, n_tokens;
  };
  // Every token count 1..8 of a tile, with 1-3 groups and partial groups (the float
  // kernels choose their tiles by both); 150 tokens of 2048 columns span three of
  // RunPacked's L2 token chunks (tiled activations are addressed by tile there). 896 and
  // 1120 columns (the 32-element types only) end in blocks the Q8_0 quantizers take one by
  // one after the groups of eight.
  const Shape shapes[] = {{16, 256, 1},  {37, 256, 3},  {260, 512, 8}, {260, 512, 70}, {5, 2048, 9},
                          {48, 768, 17}, {40, 256, 2},  {48, 256, 4},  {33, 256, 5},   {47, 512, 6},
                          {35, 512, 7},  {20, 2048, 150}, {24, 896, 11}, {17, 1120, 1}};
  ThreadPool pool(2);
  uint32_t seed = 10;
  ForEachPackedType(isa, [&](GgmlType type) {
    for (const Shape& s : shapes) {
      if (s.cols % GetGgmlTypeTraits(type).block_elems != 0) continue;
      SCOPED_TRACE(testing::Message() << GetGgmlTypeTraits(type).name << " rows=" << s.rows << " cols=" << s.cols
                                      << " n_tokens=" << s.n_tokens);
      Packed m = MakePacked(type, s.rows, s.cols, seed++);
      const int64_t x_stride = s.cols + 3, y_stride = s.rows + 5;
      const std::vector<float> x = Gaussian(s.n_tokens * x_stride, seed++);
      // Reference: dequantized weights . dequantized Q8_0 activations, in double.
      std::vector<float> wdq(static_cast<size_t>(s.rows * s.cols));
      for (int64_t r = 0; r < s.rows; ++r) {
        ASSERT_TRUE(DequantizeRow(type, m.bytes.data() + r * m.w.row_bytes, wdq.data() + r * s.cols, s.cols).ok());
      }
      std::vector<float> y_ref(static_cast<size_t>(s.n_tokens * y_stride), -7.f);
      std::vector<uint8_t> act(matmul_internal::ActRowBytes(GgmlType::kQ8_0, s.cols));
      std::vector<double> xa(static_cast<size_t>(s.cols));  // the activation the kernel sees
      double scale = 0;
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        const float* xt = x.data() + t * x_stride;
        if (type == GgmlType::kF16) {
          for (int64_t c = 0; c < s.cols; ++c) xa[c] = Fp16ToFp32(Fp32ToFp16(xt[c]));
        } else if (type == GgmlType::kBF16) {
          for (int64_t c = 0; c < s.cols; ++c) xa[c] = Bf16ToFp32(Fp32ToBf16(xt[c]));
        } else if (matmul_internal::ActFamily(type) == GgmlType::kQ8_K) {
          std::vector<uint8_t> k8(matmul_internal::ActRowBytes(type, s.cols));
          matmul_internal::QuantizeActRow(type, xt, s.cols, k8.data());
          const int8_t* q = reinterpret_cast<const int8_t*>(k8.data());
          const float* d = reinterpret_cast<const float*>(k8.data() + s.cols);
          for (int64_t c = 0; c < s.cols; ++c) xa[c] = static_cast<double>(q[c]) * d[c / 256];
        } else {
          matmul_internal::QuantizeActRow(GgmlType::kQ8_0, xt, s.cols, act.data());
          const int8_t* q = reinterpret_cast<const int8_t*>(act.data());
          const float* d = reinterpret_cast<const float*>(act.data() + s.cols);
          for (int64_t c = 0; c < s.cols; ++c) xa[c] = static_cast<double>(q[c]) * d[c / 32];
        }
        for (int64_t r = 0; r < s.rows; ++r) {
          double sum = 0;
          for (int64_t c = 0; c < s.cols; ++c) sum += static_cast<double>(wdq[r * s.cols + c]) * xa[c];
          y_ref[static_cast<size_t>(t * y_stride + r)] = static_cast<float>(sum);
          scale = std::max(scale, std::fabs(sum));
        }
      }
      AlignedBuffer scratch(MatMulScratchBytes(type, s.cols, s.n_tokens));
      std::vector<float> y(y_ref.size(), -7.f);
      PoisonRowMajor(m);
      matmul_internal::MatMulWithIsa(isa, m.w, x.data(), x_stride, s.n_tokens, y.data(), y_stride, pool,
                                     scratch.ptr);
      int bad = 0;
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        for (int64_t r = 0; r < y_stride; ++r) {
          const float got = y[static_cast<size_t>(t * y_stride + r)], want = y_ref[static_cast<size_t>(t * y_stride + r)];
          if (r >= s.rows) {
            if (got != -7.f && bad++ < 5) ADD_FAILURE() << "wrote padding at t=" << t << " r=" << r;
          } else if (!(std::fabs(got - want) <= 2e-5 * scale) && bad++ < 5) {
            ADD_FAILURE() << "t=" << t << " r=" << r << " got " << got << " want " << want;
          }
        }
      }
    }
  });
}

// Packed kernels against the original-layout reference (MatMulRef, which quantizes
// activations as llama.cpp does: Q8_0 for Q4_0/Q8_0, Q8_K for Q4_K): the same integer
// dots, so equal up to f32 rounding.
void KernelsAgreeWithOriginalLayoutReferenceFor(KernelIsa isa) {
  ThreadPool pool(2);
  ForEachPackedType(isa, [&](GgmlType type) {
    SCOPED_TRACE(GetGgmlTypeTraits(type).name);
    const int64_t rows = 100, cols = 1024, n_tokens = 12;
    Packed m = MakePacked(type, rows, cols, 77);
    const std::vector<float> x = Gaussian(n_tokens * cols, 78);
    std::vector<float> y_ref(static_cast<size_t>(n_tokens * rows)), y(y_ref.size());
    MatMulRef(m.w, x.data(), cols, n_tokens, y_ref.data(), rows);
    AlignedBuffer scratch(MatMulScratchBytes(type, cols, n_tokens));
    PoisonRowMajor(m);
    matmul_internal::MatMulWithIsa(isa, m.w, x.data(), cols, n_tokens, y.data(), rows, pool, scratch.ptr);
    double err = 0, ref = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err += (y[i] - y_ref[i]) * static_cast<double>(y[i] - y_ref[i]);
      ref += y_ref[i] * static_cast<double>(y_ref[i]);
    }
    EXPECT_LT(std::sqrt(err / ref), 1e-5);  // NaN (a row-major fallback) fails too
  });
}

// The poison does what PoisonRowMajor promises: the same matrix without its packed copy
// (the row-major kernels) writes non-finite values once its bytes are poisoned.
TEST(PackedTest, PoisonedRowMajorBytesGiveNaN) {
  ThreadPool pool(1);
  for (GgmlType type : kPackedTypes) {
    SCOPED_TRACE(GetGgmlTypeTraits(type).name);
    Packed m = MakePacked(type, 16, 256, 5);
    PoisonRowMajor(m);
    m.w.packed = nullptr;
    const std::vector<float> x = Gaussian(2 * 256, 6);
    std::vector<float> y(2 * 16, 0.f);
    AlignedBuffer scratch(MatMulScratchBytes(type, 256, 2));
    matmul_internal::MatMulWithIsa(KernelIsa::kScalar, m.w, x.data(), 256, 2, y.data(), 16, pool, scratch.ptr);
    for (float v : y) ASSERT_FALSE(std::isfinite(v));
  }
}

// Skipped (reported as such, not passed) on CPUs without the ISA.
TEST(PackedTest, Avx512KernelsMatchReference) {
  if (!IsaSupported(KernelIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 VNNI/BF16 on this CPU";
  KernelsMatchReferenceFor(KernelIsa::kAvx512);
  KernelsAgreeWithOriginalLayoutReferenceFor(KernelIsa::kAvx512);
}

TEST(PackedTest, Avx2KernelsMatchReference) {
  if (!IsaSupported(KernelIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  KernelsMatchReferenceFor(KernelIsa::kAvx2);
  KernelsAgreeWithOriginalLayoutReferenceFor(KernelIsa::kAvx2);
}

// Run under qemu-user on x86-64 hosts (scripts/build.sh aarch64); without dotprod
// (TRELLIS_NEON_DOTPROD=0) there are no NEON packed kernels and the row-major tiles run.
TEST(PackedTest, NeonDotprodKernelsMatchReference) {
  if (!IsaSupported(KernelIsa::kNeon) || !NeonDotprodEnabled()) GTEST_SKIP() << "no NEON dotprod on this CPU";
  KernelsMatchReferenceFor(KernelIsa::kNeon);
  KernelsAgreeWithOriginalLayoutReferenceFor(KernelIsa::kNeon);
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

using testing_util::AlignedBuffer;
using testing_util::Gaussian;

// MatMulShared (one conversion of x, one parallel pass over every matrix's tiles) gives
// exactly what one MatMul per matrix gives, packed or not, whatever the thread count.
TEST(PackedTest, SharedMatMulEqualsSeparateMatMuls) {
  for (GgmlType type : kPackedTypes) {
    for (int64_t n_tokens : {1, 5, 21}) {
      SCOPED_TRACE(testing::Message() << GetGgmlTypeTraits(type).name << " n_tokens=" << n_tokens);
      const int64_t cols = 512;
      const Packed a = MakePacked(type, 37, cols, 1), b = MakePacked(type, 16, cols, 2), c = MakePacked(type, 100, cols, 3);
      const std::vector<float> x = Gaussian(n_tokens * cols, 4);
      AlignedBuffer scratch(MatMulScratchBytes(type, cols, n_tokens));
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> ya(static_cast<size_t>(n_tokens * 40), -7.f), yb(static_cast<size_t>(n_tokens * 16), -7.f),
            yc(static_cast<size_t>(n_tokens * 100), -7.f);
        const MatMulOut outs[] = {{&a.w, ya.data(), 40}, {&b.w, yb.data(), 16}, {&c.w, yc.data(), 100}};
        MatMulShared(outs, x.data(), cols, n_tokens, pool, scratch.ptr);
        for (const auto& [m, y, stride] : {std::tuple{&a, &ya, 40}, std::tuple{&b, &yb, 16}, std::tuple{&c, &yc, 100}}) {
          std::vector<float> want(y->size(), -7.f);
          MatMul(m->w, x.data(), cols, n_tokens, want.data(), stride, pool, scratch.ptr);
          EXPECT_EQ(*y, want) << "threads=" << threads << " rows=" << m->w.rows;
        }
      }
    }
  }
  // The AVX2 and NEON packed kernels share the same way.
  for (KernelIsa isa : {KernelIsa::kAvx2, KernelIsa::kNeon}) {
    if (!IsaSupported(isa) || matmul_internal::GetPackedKernel(isa, GgmlType::kQ4_0).fn == nullptr) continue;
    SCOPED_TRACE(KernelIsaName(isa));
    const int64_t cols = 512, n_tokens = 7;
    const Packed a = MakePacked(GgmlType::kQ4_0, 24, cols, 8), b = MakePacked(GgmlType::kQ4_0, 40, cols, 9);
    const std::vector<float> x = Gaussian(n_tokens * cols, 10);
    AlignedBuffer scratch(MatMulScratchBytes(GgmlType::kQ4_0, cols, n_tokens));
    ThreadPool pool(2);
    std::vector<float> ya(static_cast<size_t>(n_tokens * 24)), yb(static_cast<size_t>(n_tokens * 40));
    std::vector<float> wa(ya.size()), wb(yb.size());
    const MatMulOut outs[] = {{&a.w, ya.data(), 24}, {&b.w, yb.data(), 40}};
    matmul_internal::MatMulSharedWithIsa(isa, outs, x.data(), cols, n_tokens, pool, scratch.ptr);
    matmul_internal::MatMulWithIsa(isa, a.w, x.data(), cols, n_tokens, wa.data(), 24, pool, scratch.ptr);
    matmul_internal::MatMulWithIsa(isa, b.w, x.data(), cols, n_tokens, wb.data(), 40, pool, scratch.ptr);
    EXPECT_EQ(ya, wa);
    EXPECT_EQ(yb, wb);
  }
  // Mixed types share a conversion where their kernels read the same activation bytes
  // (Q4_K_M's Q4_K q and k with a Q6_K v; Q8_0 with IQ4_NL, both offset by 128 when
  // tiled) and not otherwise (Q4_0 with Q8_0 tiled: their offsets differ; one or two
  // tokens, where Q6_K reads rows and Q4_K tiles; F16): the same results either way.
  struct Mix {
    GgmlType a, b, c;
    int64_t n_tokens;
    bool shared_avx512;  // what SharedPackedKernels must say on AVX-512
  };
  const Mix mixes[] = {{GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K, 5, true},
                       {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, 21, true},
                       {GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K, 1, false},
                       {GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kQ8_0, 9, true},
                       {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_0, 9, false},
                       {GgmlType::kQ4_K, GgmlType::kQ4_0, GgmlType::kQ4_K, 9, false}};
  for (const Mix& mix : mixes) {
    SCOPED_TRACE(testing::Message() << GetGgmlTypeTraits(mix.a).name << "+" << GetGgmlTypeTraits(mix.b).name << "+"
                                    << GetGgmlTypeTraits(mix.c).name << " n_tokens=" << mix.n_tokens);
    const int64_t cols = 512, n = mix.n_tokens;
    const Packed a = MakePacked(mix.a, 37, cols, 11), b = MakePacked(mix.b, 16, cols, 12), c = MakePacked(mix.c, 100, cols, 13);
    const std::vector<float> x = Gaussian(n * cols, 14);
    size_t bytes = 0;
    for (GgmlType t : {mix.a, mix.b, mix.c}) bytes = std::max(bytes, MatMulScratchBytes(t, cols, n));
    AlignedBuffer scratch(bytes);
    ThreadPool pool(2);
    std::vector<float> ya(static_cast<size_t>(n * 37), -7.f), yb(static_cast<size_t>(n * 16), -7.f),
        yc(static_cast<size_t>(n * 100), -7.f);
    const MatMulOut outs[] = {{&a.w, ya.data(), 37}, {&b.w, yb.data(), 16}, {&c.w, yc.data(), 100}};
    if (BestKernelIsa() == KernelIsa::kAvx512) {
      std::array<matmul_internal::PackedKernel, matmul_internal::kMaxSharedOuts> pks;
      EXPECT_EQ(matmul_internal::SharedPackedKernels(KernelIsa::kAvx512, outs, n, pks), mix.shared_avx512);
    }
    MatMulShared(outs, x.data(), cols, n, pool, scratch.ptr);
    for (const auto& [m, y, stride] : {std::tuple{&a, &ya, 37}, std::tuple{&b, &yb, 16}, std::tuple{&c, &yc, 100}}) {
      std::vector<float> want(y->size(), -7.f);
      MatMul(m->w, x.data(), cols, n, want.data(), stride, pool, scratch.ptr);
      EXPECT_EQ(*y, want) << "rows=" << m->w.rows;
    }
  }
  const Packed q4 = MakePacked(GgmlType::kQ4_0, 20, 256, 5), f16 = MakePacked(GgmlType::kF16, 20, 256, 6);
  const std::vector<float> x = Gaussian(3 * 256, 7);
  AlignedBuffer scratch(std::max(MatMulScratchBytes(GgmlType::kQ4_0, 256, 3), MatMulScratchBytes(GgmlType::kF16, 256, 3)));
  ThreadPool pool(2);
  std::vector<float> y1(60), y2(60), w1(60), w2(60);
  const MatMulOut outs[] = {{&q4.w, y1.data(), 20}, {&f16.w, y2.data(), 20}};
  MatMulShared(outs, x.data(), 256, 3, pool, scratch.ptr);
  MatMul(q4.w, x.data(), 256, 3, w1.data(), 20, pool, scratch.ptr);
  MatMul(f16.w, x.data(), 256, 3, w2.data(), 20, pool, scratch.ptr);
  EXPECT_EQ(y1, w1);
  EXPECT_EQ(y2, w2);
}

}  // namespace
}  // namespace trellis

#include "kernels/packed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis {
namespace {

std::vector<float> Gaussian(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

struct Aligned {
  explicit Aligned(size_t n) : storage(n + 64) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    ptr = storage.data() + ((64 - p % 64) % 64);
  }
  std::vector<uint8_t> storage;
  uint8_t* ptr;
};

struct Packed {
  std::vector<uint8_t> bytes;  // original rows
  Aligned packed{0};
  WeightMatrix w;
};

Packed MakePacked(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  Packed m;
  const std::vector<float> src = Gaussian(rows * cols, seed);
  const int64_t rb = RowBytes(type, cols);
  m.bytes.resize(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(QuantizeRow(type, src.data() + r * cols, m.bytes.data() + r * rb, cols).ok());
  m.w = WeightMatrix{type, m.bytes.data(), rows, cols, rb};
  m.packed = Aligned(PackedBytes(m.w));
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

TEST(PackedTest, SizesAndTypes) {
  EXPECT_TRUE(PackableType(GgmlType::kQ4_0));
  EXPECT_TRUE(PackableType(GgmlType::kQ8_0));
  EXPECT_FALSE(PackableType(GgmlType::kQ4_K));
  EXPECT_FALSE(PackingUseful(GgmlType::kF16));
  // Same size as the original: 16 rows x 18 bytes per Q4_0 block, 16 x 34 per Q8_0 block.
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ4_0, 2048), 16u * 18 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ8_0, 2048), 16u * 34 * 64);
  EXPECT_EQ(PackedGroupBytes(GgmlType::kQ4_0, 96) % 64, 0u);
  EXPECT_EQ(PackedBytes(WeightMatrix{GgmlType::kQ4_0, nullptr, 17, 64, 36}), 2 * PackedGroupBytes(GgmlType::kQ4_0, 64));
}

// The packed AVX-512 kernels against the scalar reference (MatMulRef, original layout):
// the integer dots are exact, so only the f32 order of the per-block sums differs.
TEST(PackedTest, KernelsMatchReference) {
  if (!IsaSupported(KernelIsa::kAvx512)) GTEST_SKIP() << "no AVX-512 VNNI";
  struct Shape {
    int64_t rows, cols, n_tokens;
  };
  const Shape shapes[] = {{16, 64, 1}, {37, 96, 3}, {260, 512, 8}, {260, 512, 70}, {5, 2048, 9}, {48, 256, 17}};
  ThreadPool pool(2);
  int seed = 10;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(testing::Message() << GetGgmlTypeTraits(type).name << " rows=" << s.rows << " cols=" << s.cols
                                      << " n_tokens=" << s.n_tokens);
      const Packed m = MakePacked(type, s.rows, s.cols, static_cast<uint32_t>(seed++));
      const int64_t x_stride = s.cols + 3, y_stride = s.rows + 5;
      const std::vector<float> x = Gaussian(s.n_tokens * x_stride, static_cast<uint32_t>(seed++));
      std::vector<float> y_ref(static_cast<size_t>(s.n_tokens * y_stride), -7.f);
      MatMulRef(m.w, x.data(), x_stride, s.n_tokens, y_ref.data(), y_stride);
      Aligned scratch(MatMulScratchBytes(type, s.cols, s.n_tokens));
      std::vector<float> y(y_ref.size(), -7.f);
      matmul_internal::MatMulWithIsa(KernelIsa::kAvx512, m.w, x.data(), x_stride, s.n_tokens, y.data(), y_stride, pool,
                                     scratch.ptr);
      double scale = 0;
      for (float v : y_ref) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      int bad = 0;
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        for (int64_t r = 0; r < y_stride; ++r) {
          const float got = y[static_cast<size_t>(t * y_stride + r)], want = y_ref[static_cast<size_t>(t * y_stride + r)];
          if (r >= s.rows) {
            if (got != -7.f && bad++ < 5) ADD_FAILURE() << "wrote padding at t=" << t << " r=" << r;
          } else if (!(std::fabs(got - want) <= 1e-5 * scale) && bad++ < 5) {
            ADD_FAILURE() << "t=" << t << " r=" << r << " got " << got << " want " << want;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace trellis

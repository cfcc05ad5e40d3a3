#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
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

using matmul_internal::MatMulWithIsa;

// Quantized weights plus their exact f32 dequantization.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequant;  // (rows, cols)
  WeightMatrix w;
};

TestMatrix MakeMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m;
  const std::vector<float> src = Gaussian(rows * cols, seed);
  const int64_t rb = RowBytes(type, cols);
  m.bytes.resize(rb * rows);
  m.dequant.resize(rows * cols);
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = m.bytes.data() + r * rb;
    EXPECT_TRUE(testing_util::MakeWeightRow(type, src.data() + r * cols, cols, row, rng));
    EXPECT_TRUE(DequantizeRow(type, row, m.dequant.data() + r * cols, cols).ok());
  }
  m.w = WeightMatrix{type, m.bytes.data(), rows, cols, rb};
  return m;
}

ThreadPool& Pool(int n) {
  static ThreadPool p1(1), p2(2), p3(3);
  return n == 1 ? p1 : n == 2 ? p2 : p3;
}

std::vector<KernelIsa> AvailableIsas() {
  std::vector<KernelIsa> v;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512, KernelIsa::kNeon}) {
    if (IsaSupported(isa)) v.push_back(isa);
  }
  return v;
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float f : v) s += static_cast<double>(f) * f;
  return std::sqrt(s / std::max<size_t>(v.size(), 1));
}

// Expected relative rms error of the activation conversion against exact f32 math.
double ActivationErrorBound(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 1e-5;
    case GgmlType::kF16: return 2e-3;
    case GgmlType::kBF16: return 1e-2;
    default: return 2e-2;  // 8-bit activations
  }
}

struct Shape {
  int64_t rows, cols, n_tokens;
};

class MatMulTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(MatMulTest, MatchesReferenceForEveryIsaAndThreadCount) {
  const GgmlType type = GetParam();
  const Shape shapes[] = {{37, 256, 1}, {37, 256, 70}, {260, 512, 3}, {260, 512, 33},
                          {37, 2048, 8}, {260, 2048, 1}, {64, 256, 70}, {5, 512, 8}};
  int case_index = 0;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "rows=" << s.rows << " cols=" << s.cols << " n_tokens=" << s.n_tokens);
    const TestMatrix m = MakeMatrix(type, s.rows, s.cols, 100 + case_index);
    const int64_t x_stride = s.cols + 3, y_stride = s.rows + 5;
    const std::vector<float> x = Gaussian(s.n_tokens * x_stride, 200 + case_index);

    std::vector<float> y_ref(s.n_tokens * y_stride, -7.f);
    MatMulRef(m.w, x.data(), x_stride, s.n_tokens, y_ref.data(), y_stride);

    // Reference vs exact f32 math on the dequantized weights.
    std::vector<float> err, exact;
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      for (int64_t r = 0; r < s.rows; ++r) {
        double acc = 0;
        for (int64_t c = 0; c < s.cols; ++c) acc += static_cast<double>(m.dequant[r * s.cols + c]) * x[t * x_stride + c];
        exact.push_back(static_cast<float>(acc));
        err.push_back(static_cast<float>(acc - y_ref[t * y_stride + r]));
      }
    }
    EXPECT_LT(Rms(err) / Rms(exact), ActivationErrorBound(type));

    AlignedBuffer scratch(MatMulScratchBytes(type, s.cols, s.n_tokens));
    for (KernelIsa isa : AvailableIsas()) {
      const int n_threads = 1 + (case_index++ % 3);
      SCOPED_TRACE(testing::Message() << "isa=" << KernelIsaName(isa) << " threads=" << n_threads);
      std::vector<float> y(s.n_tokens * y_stride, -7.f);
      MatMulWithIsa(isa, m.w, x.data(), x_stride, s.n_tokens, y.data(), y_stride, Pool(n_threads), scratch.ptr);
      const double tol = 1e-4 * Rms(exact);
      int bad = 0;
      for (int64_t t = 0; t < s.n_tokens; ++t) {
        for (int64_t r = 0; r < y_stride; ++r) {
          const float got = y[t * y_stride + r], want = y_ref[t * y_stride + r];
          if (r >= s.rows) {
            if (got != -7.f && bad++ < 5) ADD_FAILURE() << "wrote padding at t=" << t << " r=" << r;
          } else if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
            ADD_FAILURE() << "t=" << t << " r=" << r << " got " << got << " want " << want;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MatMulTypes, MatMulTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                           GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                                           GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL, GgmlType::kQ2_K,
                                           GgmlType::kQ3_K, GgmlType::kIQ4_XS),
                         [](const auto& info) { return std::string(GetGgmlTypeTraits(info.param).name); });

// Column counts that are not a multiple of the SIMD width: float tails and an odd number
// of 32-blocks (the AVX-512 kernels take blocks in pairs).
TEST(MatMulTest, OddColumnCountsMatchReference) {
  const struct {
    GgmlType type;
    int64_t cols;
  } cases[] = {{GgmlType::kF32, 45}, {GgmlType::kF16, 100}, {GgmlType::kBF16, 77},
               {GgmlType::kQ4_0, 160}, {GgmlType::kQ8_0, 96}, {GgmlType::kQ4_0, 32}};
  int seed = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(testing::Message() << GetGgmlTypeTraits(c.type).name << " cols=" << c.cols);
    const int64_t rows = 11, n_tokens = 6;
    const TestMatrix m = MakeMatrix(c.type, rows, c.cols, 300 + seed);
    const std::vector<float> x = Gaussian(n_tokens * c.cols, 400 + seed++);
    std::vector<float> y_ref(n_tokens * rows);
    MatMulRef(m.w, x.data(), c.cols, n_tokens, y_ref.data(), rows);
    AlignedBuffer scratch(MatMulScratchBytes(c.type, c.cols, n_tokens));
    for (KernelIsa isa : AvailableIsas()) {
      std::vector<float> y(n_tokens * rows);
      MatMulWithIsa(isa, m.w, x.data(), c.cols, n_tokens, y.data(), rows, Pool(2), scratch.ptr);
      for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_ref[i], 1e-4 * (1 + std::fabs(y_ref[i]))) << KernelIsaName(isa);
    }
  }
}

#if TRELLIS_X86
TEST(MatMulTest, SimdActivationQuantizationIsByteExact) {
  if (!IsaSupported(KernelIsa::kAvx2)) GTEST_SKIP() << "no AVX2";
  const int64_t cols = 1024;
  std::vector<float> x = Gaussian(cols, 9);
  // Exact rounding ties: a block with amax 127 gives id = 1, so k + 0.5 must round away.
  for (int j = 0; j < 32; ++j) x[j] = (j == 0) ? 127.f : static_cast<float>(j % 9) - 4.5f;
  // And the floats next to the ties, which must not round away (the quantizer adds the
  // float below one half before truncating), in a second block with id = 1.
  const float near[] = {127.f, 0.49999997f, -0.49999997f, 0.5f, -0.5f, 1.4999999f, -1.4999999f, 2.4999998f,
                        -2.4999998f, 2.5000002f, 126.49999f, -126.5f, 63.499996f, 5e-8f, -5e-8f, 0.f};
  for (int j = 0; j < 32; ++j) x[32 + j] = near[j % 16];
  for (int j = 256; j < 512; ++j) x[j] = 0.f;  // an all-zero Q8_K block
  x[600] = -9.f;  // largest magnitude negative
  x[601] = 9.f;   // same magnitude later: the first one sets the sign
  x[900] = -11.f;  // a block whose largest magnitude is only negative
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ6_K, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ5_1,
                     GgmlType::kIQ4_XS}) {
    const size_t n = matmul_internal::ActRowBytes(t, cols);
    std::vector<uint8_t> a(n, 0xAB), b(n, 0xAB);
    matmul_internal::QuantizeActRow(t, x.data(), cols, a.data());
    matmul_internal::QuantizeActRowAvx2(t, x.data(), cols, b.data());
    EXPECT_EQ(a, b) << GetGgmlTypeTraits(t).name;
  }
  // A row of 35 blocks: the quantizers take blocks eight at a time, then one by one.
  {
    const std::vector<float> y = Gaussian(35 * 32, 10);
    const size_t n = matmul_internal::ActRowBytes(GgmlType::kQ4_0, 35 * 32);
    std::vector<uint8_t> a(n, 0xAB), b(n, 0xAB);
    matmul_internal::QuantizeActRow(GgmlType::kQ4_0, y.data(), 35 * 32, a.data());
    matmul_internal::QuantizeActRowAvx2(GgmlType::kQ4_0, y.data(), 35 * 32, b.data());
    EXPECT_EQ(a, b) << "35 blocks";
  }
  // Tiled activations (the AVX-512 packed Q4_0 / Q8_0 kernels): each slot holds the row's
  // values, its scales and -offset * its block sums, and writes nothing outside its slot;
  // the second row's 35 blocks end in three the quantizer takes one by one.
  const std::vector<float> y = Gaussian(35 * 32, 11);
  for (const auto& [xs, cols_t] : {std::pair<const std::vector<float>*, int64_t>{&x, cols}, {&y, 35 * 32}}) {
    SCOPED_TRACE(cols_t);
    const size_t n = matmul_internal::ActRowBytes(GgmlType::kQ8_0, cols_t);
    std::vector<uint8_t> row(n);
    matmul_internal::QuantizeActRow(GgmlType::kQ8_0, xs->data(), cols_t, row.data());
    const int64_t nb = cols_t / 32;
    std::vector<uint8_t> tile(static_cast<size_t>(matmul_internal::TiledActStride(cols_t)), 0xAB);
    matmul_internal::QuantizeActTiledAvx2(xs->data(), cols_t, 8, tile.data(), 5);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = tile.data() + b * matmul_internal::kTiledBlockBytes;
      ASSERT_EQ(std::memcmp(blk + 32 * 5, row.data() + 32 * b, 32), 0) << "block " << b;
      float d;
      int32_t corr, sum;
      std::memcpy(&d, blk + 256 + 4 * 5, 4);
      std::memcpy(&corr, blk + 288 + 4 * 5, 4);
      std::memcpy(&sum, row.data() + matmul_internal::Q8_0SumOffset(cols_t) + 4 * b, 4);
      EXPECT_EQ(d, reinterpret_cast<const float*>(row.data() + cols_t)[b]) << "block " << b;
      EXPECT_EQ(corr, -8 * sum) << "block " << b;
      for (int s = 0; s < 8; ++s) {
        if (s == 5) continue;
        for (int k = 0; k < 32; ++k) ASSERT_EQ(blk[32 * s + k], 0xAB) << "slot " << s << " written";
        for (int k = 0; k < 4; ++k) ASSERT_EQ(blk[256 + 4 * s + k], 0xAB) << "slot " << s << " scale written";
        for (int k = 0; k < 4; ++k) ASSERT_EQ(blk[288 + 4 * s + k], 0xAB) << "slot " << s << " sum written";
      }
    }
  }
  // Tiled Q8_K activations (the AVX-512 packed Q4_K / Q5_K kernels): each slot holds the
  // Q8_K row's values, its super-block's scale in each of the 8 blocks, and the int16 pair
  // of the block's 16-value sums (the row's bsums); nothing outside the slot. x has an
  // all-zero super-block, a first-of-two-signs maximum and a negative-only one.
  {
    const size_t n = matmul_internal::ActRowBytes(GgmlType::kQ8_K, cols);
    std::vector<uint8_t> row(n);
    matmul_internal::QuantizeActRow(GgmlType::kQ8_K, x.data(), cols, row.data());
    const float* d = reinterpret_cast<const float*>(row.data() + cols);
    const int16_t* bsums = reinterpret_cast<const int16_t*>(row.data() + matmul_internal::Q8KBsumsOffset(cols));
    std::vector<uint8_t> tile(static_cast<size_t>(matmul_internal::TiledActStride(cols)), 0xAB);
    matmul_internal::QuantizeActTiledQ8KAvx2(x.data(), cols, tile.data(), 3);
    for (int64_t b = 0; b < cols / 32; ++b) {
      const uint8_t* blk = tile.data() + b * matmul_internal::kTiledBlockBytes;
      ASSERT_EQ(std::memcmp(blk + 32 * 3, row.data() + 32 * b, 32), 0) << "Q8_K block " << b;
      float db;
      int16_t pair[2];
      std::memcpy(&db, blk + 256 + 4 * 3, 4);
      std::memcpy(pair, blk + 288 + 4 * 3, 4);
      EXPECT_EQ(db, d[b / 8]) << "Q8_K block " << b;
      EXPECT_EQ(pair[0], bsums[2 * b]) << "Q8_K block " << b;
      EXPECT_EQ(pair[1], bsums[2 * b + 1]) << "Q8_K block " << b;
      for (int s = 0; s < 8; ++s) {
        if (s == 3) continue;
        for (int k = 0; k < 32; ++k) ASSERT_EQ(blk[32 * s + k], 0xAB) << "Q8_K slot " << s << " written";
        for (int k = 0; k < 8; ++k) ASSERT_EQ(blk[256 + 4 * s + k % 4 + (k / 4) * 32], 0xAB) << "Q8_K slot " << s;
      }
    }
  }
}
#endif

TEST(MatMulTest, PublicEntryPointAndGetRow) {
  const TestMatrix m = MakeMatrix(GgmlType::kQ4_K, 9, 512, 7);
  const std::vector<float> x = Gaussian(2 * 512, 8);
  AlignedBuffer scratch(MatMulScratchBytes(GgmlType::kQ4_K, 512, 2));
  std::vector<float> y(2 * 9), y_ref(2 * 9);
  MatMul(m.w, x.data(), 512, 2, y.data(), 9, Pool(2), scratch.ptr);
  MatMulRef(m.w, x.data(), 512, 2, y_ref.data(), 9);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_ref[i], 1e-3);
  std::vector<float> row(512);
  GetRow(m.w, 4, row.data());
  for (int c = 0; c < 512; ++c) EXPECT_EQ(row[c], m.dequant[4 * 512 + c]);
}

TEST(MatMulTest, ScratchBytesIsPureAndSized) {
  EXPECT_EQ(MatMulScratchBytes(GgmlType::kF32, 2048, 8), 0u);
  EXPECT_EQ(MatMulScratchBytes(GgmlType::kQ4_0, 2048, 8), MatMulScratchBytes(GgmlType::kQ4_0, 2048, 8));
  EXPECT_GE(MatMulScratchBytes(GgmlType::kQ4_0, 2048, 1), 2048u + 64 * 4);
  EXPECT_EQ(MatMulScratchBytes(GgmlType::kQ6_K, 2048, 4) % 64, 0u);
  // Room for the packed kernels' tiles: a whole tile even for one token.
  for (int64_t n : {1, 7, 8, 9, 512}) {
    EXPECT_GE(MatMulScratchBytes(GgmlType::kQ4_0, 2048, n), static_cast<size_t>(matmul_internal::TiledActBytes(2048, n))) << n;
  }
}

// Every weight type MatMulTest covers has a NEON tile of its own on aarch64 (with and
// without dotprod: the matmul_neon_nodotprod test runs this again), so MatMulTest's
// "neon" runs test NEON code, not the scalar fallback.
#if TRELLIS_ARM64
TEST(MatMulTest, NeonHasATileForEveryType) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
                        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kIQ4_NL, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kIQ4_XS}) {
    for (int64_t n_tokens : {int64_t{1}, int64_t{64}}) {
      EXPECT_NE(matmul_internal::GetTileKernelNeon(type, n_tokens).fn, nullptr) << GetGgmlTypeTraits(type).name;
    }
  }
}
#endif

TEST(CpuFeaturesTest, BestIsaIsSupported) {
  EXPECT_TRUE(IsaSupported(BestKernelIsa()));
  EXPECT_TRUE(IsaSupported(KernelIsa::kScalar));
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx512vnni) {
    EXPECT_TRUE(f.avx512f);
  }
#if TRELLIS_ARM64
  // Advanced SIMD is part of ARMv8-A: every aarch64 CPU runs the NEON kernels.
  EXPECT_TRUE(f.neon);
  if (std::getenv("TRELLIS_ISA") == nullptr) {
    EXPECT_EQ(BestKernelIsa(), KernelIsa::kNeon);
  }
#else
  EXPECT_FALSE(IsaSupported(KernelIsa::kNeon));
#endif
}

TEST(CpuFeaturesTest, KernelChoiceFromValues) {
  KernelChoice c = KernelChoiceFromValues(nullptr, nullptr, nullptr, nullptr);
  EXPECT_FALSE(c.cap.has_value());
  EXPECT_TRUE(c.avxvnni && c.neon_dotprod && c.repack);
  c = KernelChoiceFromValues("avx2", "0", "0", "0");
  EXPECT_EQ(c.cap, KernelIsa::kAvx2);
  EXPECT_FALSE(c.avxvnni || c.neon_dotprod || c.repack);
  EXPECT_EQ(KernelChoiceFromValues("scalar", "1", nullptr, "yes").cap, KernelIsa::kScalar);
  EXPECT_FALSE(KernelChoiceFromValues("avx512", nullptr, nullptr, nullptr).cap.has_value());
}

// The test binary's main chose the kernels from the environment as the `trellis` binary
// does (test_main.cc), and the choice is fixed once a kernel is chosen. ctest runs this
// again under TRELLIS_AVXVNNI=0 (packed_avx2_novnni) and TRELLIS_ISA=avx2 (isa_avx2_cap).
TEST(CpuFeaturesTest, TheChoiceIsTheEnvironmentsAndFixedOnceUsed) {
  const KernelChoice want = KernelChoiceFromValues(std::getenv("TRELLIS_ISA"), std::getenv("TRELLIS_AVXVNNI"),
                                                   std::getenv("TRELLIS_NEON_DOTPROD"), std::getenv("TRELLIS_REPACK"));
  (void)BestKernelIsa();
  EXPECT_EQ(ChosenKernels().cap, want.cap);
  EXPECT_EQ(ChosenKernels().avxvnni, want.avxvnni);
  EXPECT_EQ(ChosenKernels().repack, want.repack);
  EXPECT_FALSE(ChooseKernels(KernelChoice{}));  // too late: kernels are chosen
  if (!want.avxvnni) {
    EXPECT_FALSE(AvxVnniEnabled());
  }
  if (want.cap == KernelIsa::kAvx2) {
    EXPECT_NE(BestKernelIsa(), KernelIsa::kAvx512);
  }
  if (want.cap == KernelIsa::kScalar) {
    EXPECT_EQ(BestKernelIsa(), KernelIsa::kScalar);
  }
}

}  // namespace
}  // namespace trellis

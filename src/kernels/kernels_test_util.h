// Helpers shared by the kernels tests and bench_kernels (not part of the library).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis::testing_util {

// n samples of N(0, scale^2), reproducible from the seed.
inline std::vector<float> Gaussian(int64_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// n bytes at a 64-byte aligned address (MatMul scratch, packed weights). Movable: the
// pointer stays valid because the vector's buffer moves with it.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : storage(n + 64) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage.data());
    ptr = storage.data() + ((64 - p % 64) % 64);
  }
  std::vector<uint8_t> storage;
  uint8_t* ptr;
};

// Byte offsets of a block's f16 scales, and whether each may be negative: the types Trellis
// reads but does not quantize get random blocks (every bit pattern of their quants and
// packed scales is valid) with these set to moderate values.
struct F16Field {
  int offset;
  bool signed_value;
};
inline std::vector<F16Field> ReadOnlyTypeScales(GgmlType type) {
  switch (type) {
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS: return {{0, false}};
    case GgmlType::kQ5_1: return {{0, false}, {2, true}};
    case GgmlType::kQ2_K: return {{80, false}, {82, false}};
    case GgmlType::kQ3_K: return {{108, false}};
    default: return {};
  }
}

// One row of `cols` weights of `type` at row: src quantized where Trellis quantizes the
// type, else random blocks (ReadOnlyTypeScales) drawn from rng. True on success.
inline bool MakeWeightRow(GgmlType type, const float* src, int64_t cols, uint8_t* row, std::mt19937& rng) {
  const std::vector<F16Field> scales = ReadOnlyTypeScales(type);
  if (scales.empty()) return QuantizeRow(type, src, row, cols).ok();
  const int64_t rb = RowBytes(type, cols), block_bytes = GetGgmlTypeTraits(type).block_bytes;
  for (int64_t i = 0; i < rb; ++i) row[i] = static_cast<uint8_t>(rng());
  for (int64_t b = 0; b < rb / block_bytes; ++b) {
    for (const F16Field& f : scales) {
      float v = std::uniform_real_distribution<float>(0.002f, 0.02f)(rng);
      if (f.signed_value && (rng() & 1)) v = -v;
      const uint16_t h = Fp32ToFp16(v);
      std::memcpy(row + b * block_bytes + f.offset, &h, 2);
    }
  }
  return true;
}

}  // namespace trellis::testing_util

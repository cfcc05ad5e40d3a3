// Helpers shared by the kernels tests (not part of the library).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace trellis::testing_util

// Small AVX2 helpers shared by the AVX2 tile files (matmul_avx2.cc,
// matmul_lowbit_avx2.cc). INCLUDE ONLY from files compiled with the AVX2 flags.
#pragma once

#include <immintrin.h>

namespace trellis::matmul_internal::avx2 {

// Sum of the 8 lanes.
inline float Hsum(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i Load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

}  // namespace trellis::matmul_internal::avx2

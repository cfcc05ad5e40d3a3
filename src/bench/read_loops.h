// Read loops for the bandwidth figures of `bench roofline` and bench_kernels: each sums
// `bytes` (a multiple of 512) from 64-byte aligned `p`, into independent accumulators so
// the loads, not the adds, bound it. x86 only (the benchmark drivers are not built for ARM).
//
// Thread safety: pure functions.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace trellis::bench {

__attribute__((target("avx512f"))) inline uint64_t ReadZmm(const uint8_t* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < bytes; i += 512) {
    const __m512i* q = reinterpret_cast<const __m512i*>(p + i);
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(q + 0));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(q + 1));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(q + 2));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(q + 3));
    a4 = _mm512_add_epi64(a4, _mm512_load_si512(q + 4));
    a5 = _mm512_add_epi64(a5, _mm512_load_si512(q + 5));
    a6 = _mm512_add_epi64(a6, _mm512_load_si512(q + 6));
    a7 = _mm512_add_epi64(a7, _mm512_load_si512(q + 7));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                        _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, a0);
  uint64_t s = 0;
  for (uint64_t x : lanes) s += x;
  return s;
}

__attribute__((target("avx2"))) inline uint64_t ReadYmm(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < bytes; i += 256) {
    const __m256i* q = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(q + 0));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(q + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(q + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(q + 3));
    a4 = _mm256_add_epi64(a4, _mm256_load_si256(q + 4));
    a5 = _mm256_add_epi64(a5, _mm256_load_si256(q + 5));
    a6 = _mm256_add_epi64(a6, _mm256_load_si256(q + 6));
    a7 = _mm256_add_epi64(a7, _mm256_load_si256(q + 7));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
                        _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

inline uint64_t ReadScalar(const uint8_t* p, size_t bytes) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i < bytes / 8; i += 4) {
    a0 += q[i];
    a1 += q[i + 1];
    a2 += q[i + 2];
    a3 += q[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

}  // namespace trellis::bench

// AVX2 kernel over the x16 packed Q4_0 layout (packed.h), for CPUs without AVX-512 VNNI
// (most laptops). Without vpdpbusd, a 4-byte dot is vpmaddubsw (u8 x s8 -> pairs in
// int16) and, once per block, vpmaddwd against ones (-> int32). Nibble products are at
// most 15 * 127 * 2 = 3810 per int16 pair, so the 8 of a 32-element block sum in int16
// without saturating (<= 30480). A ymm holds one half of a group (8 rows); a tile is one
// half x up to 4 tokens (16 ymm registers: 4 int16 sums, 4 f32 accumulators, weights).
//
// Thread safety: pure functions.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/packed.h"

namespace trellis::matmul_internal {
namespace {

inline int32_t Load32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr int kAvx2PackedTokens = 4;

// Rows [8 h, 8 h + 8) of the group x NT tokens.
template <int NT>
void HalfQ4_0(const PackedArgs& p, int h) {
  const uint8_t* arow[NT];
  const float* da[NT];
  const int32_t* asum[NT];
  for (int t = 0; t < NT; ++t) {
    arow[t] = p.a + t * p.a_stride;
    da[t] = reinterpret_cast<const float*>(arow[t] + p.cols);
    asum[t] = reinterpret_cast<const int32_t*>(arow[t] + p.cols + 4 * p.nb);
  }
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(p.g + p.nb * 256);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* wb = p.g + b * 256 + 32 * h;
    __m256i sum[NT];
    for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + 64 * i + 1024), _MM_HINT_T0);
      const __m256i packed = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * i));
      const __m256i lo = _mm256_and_si256(packed, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = arow[t] + 32 * b + 8 * i;
        sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(Load32(a))));
        sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(Load32(a + 4))));
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + 16 * b + 8 * h)));
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum[t], ones), _mm256_set1_epi32(-8 * asum[t][b]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(da[t][b])), acc[t]);
    }
  }
  const int rows = p.nr - 8 * h;  // >= 1
  alignas(32) static constexpr int32_t kLane[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), _mm256_load_si256(reinterpret_cast<const __m256i*>(kLane)));
  for (int t = 0; t < NT; ++t) _mm256_maskstore_ps(p.y + t * p.y_stride + 8 * h, mask, acc[t]);
}

template <int NT>
void TileQ4_0(const PackedArgs& p) {
  HalfQ4_0<NT>(p, 0);
  if (p.nr > 8) HalfQ4_0<NT>(p, 1);
}

// The driver hands tiles of up to kPackedMaxTokens tokens: run them 4 at a time.
void DispatchQ4_0(const PackedArgs& p) {
  static constexpr PackedFn kTable[kAvx2PackedTokens] = {TileQ4_0<1>, TileQ4_0<2>, TileQ4_0<3>, TileQ4_0<4>};
  PackedArgs q = p;
  for (int t0 = 0; t0 < p.nt; t0 += kAvx2PackedTokens) {
    q.a = p.a + t0 * p.a_stride;
    q.y = p.y + t0 * p.y_stride;
    q.nt = std::min(kAvx2PackedTokens, p.nt - t0);
    kTable[q.nt - 1](q);
  }
}

}  // namespace

PackedKernel GetPackedKernelAvx2(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {DispatchQ4_0, 1, GgmlType::kQ8_0};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

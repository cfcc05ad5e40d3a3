// AVX2 + FMA + F16C tile kernels for MatMul, for CPUs without AVX-512. Layouts and the
// tile contract: matmul_internal.h. Numerically the same integer dots as the AVX-512 and
// scalar kernels; only the f32 summation order differs.
//
// Q4_0/Q8_0 (tile 4 rows x 2 tokens): one block per ymm. Q4_0 weights stay unsigned
// (0..15) and the -8 offset is removed by subtracting maddubs(8, a) per token; Q8_0 uses
// maddubs(|w|, sign(a, w)). Q4_K/Q6_K (tile 1 row x 4 tokens): maddubs then vpmaddwd with
// the sub-block scales, accumulating each super-block in int32.
//
// Thread safety: pure functions.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/matmul_avx2_inl.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis::matmul_internal {
namespace {

using avx2::Hsum;
using avx2::Load128;
using avx2::Load256;

// ---- Q4_0 / Q8_0 ----------------------------------------------------------------------

template <GgmlType kType, int NR, int NT>
void TileQ32(const TileArgs& p) {
  constexpr bool kQ4 = kType == GgmlType::kQ4_0;
  constexpr int64_t kBlockBytes = kQ4 ? 18 : 34;
  const int64_t nb = p.cols / 32;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    __m256i av[NT], bias[NT];
    __m256 da[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = p.a + t * p.a_stride;
      av[t] = Load256(a + 32 * b);
      if constexpr (kQ4) bias[t] = _mm256_maddubs_epi16(_mm256_set1_epi8(8), av[t]);
      da[t] = _mm256_set1_ps(reinterpret_cast<const float*>(a + p.cols)[b]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const uint8_t* w = p.w + r * p.w_stride + kBlockBytes * b;
      uint16_t dh;
      std::memcpy(&dh, w, 2);
      const __m256 dw = _mm256_set1_ps(_cvtsh_ss(dh));
      __m256i wv;
      if constexpr (kQ4) {
        const __m128i q = Load128(w + 2);
        wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
      } else {
        wv = Load256(w + 2);
      }
      const __m256i wabs = kQ4 ? wv : _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        __m256i p16;
        if constexpr (kQ4) {
          p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wv, av[t]), bias[t]);
        } else {
          p16 = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(av[t], wv));
        }
        const __m256i isum = _mm256_madd_epi16(p16, ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da[t]), acc[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) p.y[t * p.y_stride + r] = Hsum(acc[r][t]);
}

// ---- Q4_K / Q6_K ----------------------------------------------------------------------

template <int NT>
void TileQ4_K(const TileArgs& p) {
  const int64_t nb = p.cols / kQkK;
  const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(p.w);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = wb[b];
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) GetScaleMinK4(j, x.scales, &sc[j], &mn[j]);
    uint8_t mn2[16];
    for (int j = 0; j < 8; ++j) mn2[2 * j] = mn2[2 * j + 1] = mn[j];
    const __m256i mins = _mm256_cvtepu8_epi16(Load128(mn2));
    const float d = _cvtsh_ss(x.d), dmin = _cvtsh_ss(x.dmin);

    __m256i iacc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) iacc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m256i q = Load256(x.qs + 32 * c);
      const __m256i lo = _mm256_and_si256(q, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i s0 = _mm256_set1_epi16(sc[2 * c]), s1 = _mm256_set1_epi16(sc[2 * c + 1]);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = p.a + t * p.a_stride + kQkK * b + 64 * c;
        iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, Load256(a)), s0));
        iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, Load256(a + 32)), s1));
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = p.a + t * p.a_stride;
      const float da = reinterpret_cast<const float*>(a + p.cols)[b];
      const __m256i msum = _mm256_madd_epi16(Load256(a + p.cols + 4 * nb + 32 * b), mins);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(d * da), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(-dmin * da), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) p.y[t * p.y_stride] = Hsum(acc[t]);
}

template <int NT>
void TileQ6_K(const TileArgs& p) {
  const int64_t nb = p.cols / kQkK;
  const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(p.w);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  // Byte shuffles picking scales (g, g x8 | g+1 x8) for the 8 pairs of 16-groups.
  __m128i sidx[8];
  for (int k = 0; k < 8; ++k) {
    alignas(16) int8_t idx[16];
    for (int i = 0; i < 16; ++i) idx[i] = static_cast<int8_t>(2 * k + i / 8);
    sidx[k] = _mm_load_si128(reinterpret_cast<const __m128i*>(idx));
  }
  __m256 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = wb[b];
    const __m128i sc8 = Load128(x.scales);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i neg32sc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    const float d = _cvtsh_ss(x.d);

    __m256i iacc[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      iacc[t] = _mm256_madd_epi16(Load256(p.a + t * p.a_stride + p.cols + 4 * nb + 32 * b), neg32sc);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = Load256(x.ql + 64 * h), l1 = Load256(x.ql + 64 * h + 32);
      const __m256i hb = Load256(x.qh + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, sidx[4 * h + k]));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const uint8_t* a = p.a + t * p.a_stride + kQkK * b + 128 * h + 32 * k;
          iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], Load256(a)), s));
        }
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const float da = reinterpret_cast<const float*>(p.a + t * p.a_stride + p.cols)[b];
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(d * da), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) p.y[t * p.y_stride] = Hsum(acc[t]);
}

// ---- F32 / F16 / BF16 -----------------------------------------------------------------

struct F32W {
  static __m256 Load(const uint8_t* w, int64_t c) { return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + c); }
  static float Scalar(const uint8_t* w, int64_t c) { return reinterpret_cast<const float*>(w)[c]; }
};
struct F16W {
  static __m256 Load(const uint8_t* w, int64_t c) { return _mm256_cvtph_ps(Load128(w + 2 * c)); }
  static float Scalar(const uint8_t* w, int64_t c) { return Fp16ToFp32(reinterpret_cast<const uint16_t*>(w)[c]); }
};
struct Bf16W {
  static __m256 Load(const uint8_t* w, int64_t c) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(Load128(w + 2 * c)), 16));
  }
  static float Scalar(const uint8_t* w, int64_t c) { return Bf16ToFp32(reinterpret_cast<const uint16_t*>(w)[c]); }
};

// W (f32/f16/bf16) against activations (f32, or bf16 for BF16 weights): 8 columns a step,
// scalar tail.
template <typename W, typename A, int NR, int NT>
void TileFloat(const TileArgs& p) {
  __m256 acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t cols8 = p.cols / 8 * 8;
  for (int64_t c = 0; c < cols8; c += 8) {
    __m256 x[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) x[t] = A::Load(p.a + t * p.a_stride, c);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 w = W::Load(p.w + r * p.w_stride, c);
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_fmadd_ps(w, x[t], acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      float s = Hsum(acc[r][t]);
      for (int64_t c = cols8; c < p.cols; ++c) s += W::Scalar(p.w + r * p.w_stride, c) * A::Scalar(p.a + t * p.a_stride, c);
      p.y[t * p.y_stride + r] = s;
    }
  }
}

// ---- dispatch on the tile's actual size -------------------------------------------------

template <template <int, int> class K>
void Dispatch4x2(const TileArgs& p) {
  static constexpr TileFn kTable[4][2] = {
      {K<1, 1>::Fn, K<1, 2>::Fn}, {K<2, 1>::Fn, K<2, 2>::Fn}, {K<3, 1>::Fn, K<3, 2>::Fn}, {K<4, 1>::Fn, K<4, 2>::Fn}};
  kTable[p.nr - 1][p.nt - 1](p);
}

template <template <int> class K>
void Dispatch1x4(const TileArgs& p) {
  static constexpr TileFn kTable[4] = {K<1>::Fn, K<2>::Fn, K<3>::Fn, K<4>::Fn};
  kTable[p.nt - 1](p);
}

template <int NR, int NT> struct KQ4_0 { static constexpr TileFn Fn = TileQ32<GgmlType::kQ4_0, NR, NT>; };
template <int NR, int NT> struct KQ8_0 { static constexpr TileFn Fn = TileQ32<GgmlType::kQ8_0, NR, NT>; };
template <int NR, int NT> struct KF32 { static constexpr TileFn Fn = TileFloat<F32W, F32W, NR, NT>; };
template <int NR, int NT> struct KF16 { static constexpr TileFn Fn = TileFloat<F16W, F32W, NR, NT>; };
template <int NR, int NT> struct KBF16 { static constexpr TileFn Fn = TileFloat<Bf16W, Bf16W, NR, NT>; };
template <int NT> struct KQ4_K { static constexpr TileFn Fn = TileQ4_K<NT>; };
template <int NT> struct KQ6_K { static constexpr TileFn Fn = TileQ6_K<NT>; };

// ---- activation quantization ----------------------------------------------------------

inline float HmaxAbs(const float* x, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
}

// 32 int32 lanes (4 vectors, element order) -> 32 int8 in order, saturating.
inline __m256i PackToInt8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  const __m256i v = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// roundf(v) for |v| < 2^23 (activations times their scale are within 127):
// trunc(v + copysign(0.49999997f, v)), the largest float below one half, which rounds
// every tie away from zero and nothing else up (checked against roundf for every float
// below 2^23 in magnitude, both signs). The empty asm keeps GCC from fusing the multiply
// that made v into the add (-ffp-contract=fast): that would round once, not twice.
inline __m256i RoundHalfAway(__m256 v) {
  __asm__("" : "+x"(v));
  const __m256 h = _mm256_or_ps(_mm256_set1_ps(0.49999997f), _mm256_and_ps(v, _mm256_set1_ps(-0.f)));
  return _mm256_cvttps_epi32(_mm256_add_ps(v, h));
}

// One block of 32 activations as Q8_0: returns the 32 int8 values; *d = the scale rounded
// through f16, *sum = the values' sum.
inline __m256i QuantizeBlockQ8_0(const float* xb, float* d_out, int32_t* sum) {
  const float d = HmaxAbs(xb, 32) / 127.f;
  const float id = d != 0.f ? 1.f / d : 0.f;
  *d_out = Fp16ToFp32(Fp32ToFp16(d));
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid));
  // Each q[k] holds 8 int32 values in -127..127: their sum is the block's sum.
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *sum = _mm_cvtsi128_si32(s4);
  return PackToInt8(q[0], q[1], q[2], q[3]);
}

// Eight Q8_0 blocks at once (256 activations from x): their abs maxima and sums reduced
// side by side (one transpose-and-reduce for eight rather than a horizontal reduction
// each), the scales divided and rounded through f16 (F16C) eight at a time. The same
// values as QuantizeBlockQ8_0 block by block: max and integer sums do not depend on the
// order, the divisions and the f16 rounding are the same IEEE operations. store(j, q)
// takes block j's 32 values; d[j], sum[j] its scale and sum.
template <typename Store>
inline void QuantizeEightBlocksQ8_0(const float* x, float d[8], int32_t sum[8], Store store) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const float* xb = x + 32 * j;
    m[j] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) m[j] = _mm256_max_ps(m[j], _mm256_and_ps(_mm256_loadu_ps(xb + 8 * k), abs_mask));
  }
  // Lane j of amax: the maximum of m[j]'s eight lanes.
  __m256 a[4], b[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    a[i] = _mm256_max_ps(_mm256_unpacklo_ps(m[2 * i], m[2 * i + 1]), _mm256_unpackhi_ps(m[2 * i], m[2 * i + 1]));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    b[i] = _mm256_max_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44), _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
  }
  const __m256 amax = _mm256_max_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
  const __m256 dv = _mm256_div_ps(amax, _mm256_set1_ps(127.f));
  const __m256 idv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.f), dv), _mm256_cmp_ps(dv, _mm256_setzero_ps(), _CMP_NEQ_OQ));
  _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm256_cvtps_ph(dv, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  alignas(32) float id[8];
  _mm256_store_ps(id, idv);
  __m256i s[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const float* xb = x + 32 * j;
    const __m256 vid = _mm256_set1_ps(id[j]);
    __m256i q[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) q[k] = RoundHalfAway(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid));
    s[j] = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    store(j, PackToInt8(q[0], q[1], q[2], q[3]));
  }
  // Lane j: the sum of s[j]'s lanes.
  const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(sum), _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                                                          _mm256_permute2x128_si256(h0, h1, 0x31)));
}

void QuantizeActQ8_0(const float* x, int64_t cols, uint8_t* dst) {
  float* dd = reinterpret_cast<float*>(dst + cols);
  int32_t* sums = reinterpret_cast<int32_t*>(dst + cols + 4 * (cols / 32));
  float* dsums = reinterpret_cast<float*>(dst + cols + 8 * (cols / 32));
  int64_t b0 = 0;
  for (; b0 + 8 <= cols / 32; b0 += 8) {
    QuantizeEightBlocksQ8_0(x + 32 * b0, dd + b0, sums + b0, [&](int j, __m256i q) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (b0 + j)), q);
    });
    for (int64_t b = b0; b < b0 + 8; ++b) dsums[b] = dd[b] * static_cast<float>(sums[b]);
  }
  for (int64_t b = b0; b < cols / 32; ++b) {
    const __m256i q = QuantizeBlockQ8_0(x + 32 * b, dd + b, sums + b);
    dsums[b] = dd[b] * static_cast<float>(sums[b]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * b), q);
  }
}

// Activations as Q8_K (llama.cpp's quantize_row_q8_K), with the block-sum fields the
// K-quant kernels read (FillQ8KBlockSums' values) written per block: the scale comes from
// the first element of largest magnitude, whose sign is known without a scan unless the
// block holds both +amax and -amax; the sixteen 16-value sums of a block are reduced side
// by side (hadd trees, not a horizontal sum each).
// The quantizer's outputs go to out: out.Zero(b) for an all-zero super-block b;
// otherwise out.Qs(b, k, v) with the 32 bytes of its k-th block of 32 values, then
// out.Done(b, d, g) with its scale and its sixteen 16-value sums in order (g[0] sums 0-3,
// g[1] 4-7, g[2] 8-11, g[3] 12-15).
template <typename Out>
void QuantizeQ8K(const float* x, int64_t cols, Out& out) {
  const int64_t nb = cols / kQkK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + kQkK * b;
    __m256 vmax = _mm256_loadu_ps(xb), vmin = vmax;
    for (int i = 8; i < kQkK; i += 8) {
      const __m256 v = _mm256_loadu_ps(xb + i);
      vmax = _mm256_max_ps(vmax, v);
      vmin = _mm256_min_ps(vmin, v);
    }
    __m128 hi = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    __m128 lo = _mm_min_ps(_mm256_castps256_ps128(vmin), _mm256_extractf128_ps(vmin, 1));
    hi = _mm_max_ps(hi, _mm_movehl_ps(hi, hi));
    lo = _mm_min_ps(lo, _mm_movehl_ps(lo, lo));
    const float top = _mm_cvtss_f32(_mm_max_ss(hi, _mm_movehdup_ps(hi)));
    const float bottom = -_mm_cvtss_f32(_mm_min_ss(lo, _mm_movehdup_ps(lo)));
    const float amax = std::max(top, bottom);
    if (amax == 0.f) {
      out.Zero(b);
      continue;
    }
    float max = top == amax ? amax : -amax;  // the first element of largest magnitude
    if (top == bottom) {  // both signs: which comes first
      for (int j = 0; j < kQkK; ++j) {
        if (std::fabs(xb[j]) == amax) {
          max = xb[j];
          break;
        }
      }
    }
    const float iscale = -127.f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    __m256i quads[8];  // per 32 values: eight sums of four
    for (int k = 0; k < 8; ++k) {
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * k + 8 * i), vs));
      const __m256i v = _mm256_min_epi8(PackToInt8(q[0], q[1], q[2], q[3]), _mm256_set1_epi8(127));
      out.Qs(b, k, v);
      quads[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
    }
    // hadd(hadd(q0, q1), hadd(q2, q3)): low lanes the first 16-value sum of chunks 0..3,
    // high lanes the second; then interleaved into sum order (chunk k: 2k, 2k + 1).
    __m128i g[4];
    for (int h = 0; h < 2; ++h) {
      const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(quads[4 * h], quads[4 * h + 1]),
                                          _mm256_hadd_epi32(quads[4 * h + 2], quads[4 * h + 3]));
      const __m128i first = _mm256_castsi256_si128(a), second = _mm256_extracti128_si256(a, 1);
      g[2 * h] = _mm_unpacklo_epi32(first, second);
      g[2 * h + 1] = _mm_unpackhi_epi32(first, second);
    }
    out.Done(b, 1.f / iscale, g);
  }
}

// d x the eight 32-value sums of a super-block, from its sixteen 16-value sums.
inline __m256 Dsum32(float d, const __m128i (&g)[4]) {
  const __m128i s01 = _mm_hadd_epi32(g[0], g[1]), s23 = _mm_hadd_epi32(g[2], g[3]);
  return _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_setr_m128i(s01, s23)));
}

void QuantizeActQ8_K(const float* x, int64_t cols, uint8_t* dst) {
  struct Row {
    uint8_t* qs;
    float* dd;
    int16_t* bsums;
    float* dsum32;
    int32_t* bias16;
    void Zero(int64_t b) {
      std::memset(qs + kQkK * b, 0, kQkK);
      dd[b] = 0.f;
      std::memset(bsums + 16 * b, 0, 32);
      std::memset(dsum32 + 8 * b, 0, 32);
      std::memset(bias16 + 16 * b, 0, 64);
    }
    void Qs(int64_t b, int k, __m256i v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + kQkK * b + 32 * k), v); }
    void Done(int64_t b, float d, const __m128i (&g)[4]) {
      dd[b] = d;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bsums + 16 * b), _mm_packs_epi32(g[0], g[1]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bsums + 16 * b + 8), _mm_packs_epi32(g[2], g[3]));
      const __m256i m32 = _mm256_set1_epi32(-32);
      for (int i = 0; i < 2; ++i) {
        const __m256i pair = _mm256_setr_m128i(g[2 * i], g[2 * i + 1]);  // sums 8i .. 8i + 7
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(bias16 + 16 * b + 8 * i), _mm256_mullo_epi32(pair, m32));
      }
      _mm256_storeu_ps(dsum32 + 8 * b, Dsum32(d, g));
    }
  } row{dst,
        reinterpret_cast<float*>(dst + cols),
        reinterpret_cast<int16_t*>(dst + Q8KBsumsOffset(cols)),
        reinterpret_cast<float*>(dst + Q8KDsum32Offset(cols)),
        reinterpret_cast<int32_t*>(dst + Q8KBias16Offset(cols))};
  QuantizeQ8K(x, cols, row);
}

}  // namespace

void QuantizeActTiledAvx2(const float* x, int64_t cols, int32_t offset, uint8_t* tile, int slot) {
  const int64_t nb = cols / 32;
  auto finish = [&](int64_t b, float d, int32_t sum) {
    uint8_t* blk = tile + b * kTiledBlockBytes;
    reinterpret_cast<float*>(blk + 32 * kPackedMaxTokens)[slot] = d;
    reinterpret_cast<int32_t*>(blk + 36 * kPackedMaxTokens)[slot] = -offset * sum;
  };
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    float d[8];
    int32_t sum[8];
    QuantizeEightBlocksQ8_0(x + 32 * b, d, sum, [&](int j, __m256i q) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + (b + j) * kTiledBlockBytes + 32 * slot), q);
    });
    for (int j = 0; j < 8; ++j) finish(b + j, d[j], sum[j]);
  }
  for (; b < nb; ++b) {
    float d;
    int32_t sum = 0;
    const __m256i q = QuantizeBlockQ8_0(x + 32 * b, &d, &sum);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + b * kTiledBlockBytes + 32 * slot), q);
    finish(b, d, sum);
  }
}

void QuantizeActTiledQ8KAvx2(const float* x, int64_t cols, uint8_t* tile, int slot) {
  struct Tile {
    uint8_t* tile;
    int slot;
    uint8_t* Block(int64_t b, int k) const { return tile + (8 * b + k) * kTiledBlockBytes; }
    void Set(int64_t b, int k, float d, int32_t pair) const {
      reinterpret_cast<float*>(Block(b, k) + 32 * kPackedMaxTokens)[slot] = d;
      reinterpret_cast<int32_t*>(Block(b, k) + 36 * kPackedMaxTokens)[slot] = pair;
    }
    void Zero(int64_t b) const {
      for (int k = 0; k < 8; ++k) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(Block(b, k) + 32 * slot), _mm256_setzero_si256());
        Set(b, k, 0.f, 0);
      }
    }
    void Qs(int64_t b, int k, __m256i v) const {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(Block(b, k) + 32 * slot), v);
    }
    // Block k holds the int16 pair (sum of its qs 0..15, sum of 16..31): the Q8_K row's bsums.
    void Done(int64_t b, float d, const __m128i (&g)[4]) const {
      alignas(16) int32_t pair[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(pair), _mm_packs_epi32(g[0], g[1]));
      _mm_store_si128(reinterpret_cast<__m128i*>(pair + 4), _mm_packs_epi32(g[2], g[3]));
      for (int k = 0; k < 8; ++k) Set(b, k, d, pair[k]);
    }
  } out{tile, slot};
  QuantizeQ8K(x, cols, out);
}

void QuantizeActRowAvx2(GgmlType type, const float* x, int64_t cols, uint8_t* dst) {
  switch (ActFamily(type)) {
    case GgmlType::kQ8_0: QuantizeActQ8_0(x, cols, dst); break;
    case GgmlType::kQ8_K: QuantizeActQ8_K(x, cols, dst); break;
    case GgmlType::kF16: {
      float* o = reinterpret_cast<float*>(dst);
      int64_t c = 0;
      for (; c + 8 <= cols; c += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(o + c, _mm256_cvtph_ps(h));
      }
      for (; c < cols; ++c) o[c] = Fp16ToFp32(Fp32ToFp16(x[c]));
      break;
    }
    default: QuantizeActRow(type, x, cols, dst); break;
  }
}

TileKernel GetTileKernelAvx2(GgmlType type, int64_t n_tokens) {
  // Decode-sized batches stream weights one row at a time (see kGemvMaxTokens).
  const int rows = n_tokens <= kGemvMaxTokens ? 1 : 4;
  switch (type) {
    case GgmlType::kQ4_0: return {Dispatch4x2<KQ4_0>, rows, 2};
    case GgmlType::kQ8_0: return {Dispatch4x2<KQ8_0>, rows, 2};
    case GgmlType::kQ4_K: return {Dispatch1x4<KQ4_K>, 1, 4};
    case GgmlType::kQ6_K: return {Dispatch1x4<KQ6_K>, 1, 4};
    case GgmlType::kF32: return {Dispatch4x2<KF32>, rows, 2};
    case GgmlType::kF16: return {Dispatch4x2<KF16>, rows, 2};
    case GgmlType::kBF16: return {Dispatch4x2<KBF16>, rows, 2};
    default: return GetTileKernelLowbitAvx2(type, n_tokens);
  }
}

}  // namespace trellis::matmul_internal

// AVX-512 tile kernels for MatMul: VNNI int8 dots for Q4_0/Q8_0/Q4_K/Q6_K, vdpbf16ps for
// BF16, F16C + FMA for F16 and F32. Layouts and the tile contract: matmul_internal.h.
//
// Q4_0/Q8_0 (tile 3 rows x 4 tokens: 4x4 spills accumulators out of the 32 zmm
// registers): a zmm holds two 32-element blocks. Weights are made unsigned (Q4_0: q in 0..15; Q8_0: q + 128) so vpdpbusd can take them, and the
// offset is removed by starting each dot from bias = -offset * sum(a) (per token, shared
// by the rows). Each block's int32 sum is scaled by dw * da in f32.
// Q4_K/Q6_K (tile 1 row x 8 tokens): per 64 elements vpmaddubsw (q u8 x a s8 -> s16)
// then vpdpwssd with the sub-block scales, so a whole 256-super-block accumulates in
// int32; Q6_K's -32 offset folds in through bsums, Q4_K's mins go through bsums in f32.
//
// Thread safety: pure functions.
// GCC 12's AVX-512 intrinsics build results from _mm512_undefined_*(), which trips
// -W(maybe-)uninitialized once inlined; the warnings are false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/quant.h"

namespace trellis::matmul_internal {
namespace {

inline float Hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

// [f(dA) x8, f(dB) x8] from the f16 scales at pA and pA + stride (stride >= 4 bytes).
// Reads the dword ending at the second scale so both come from two plain loads.
inline __m512 PairScalesF16(const uint8_t* pa, int64_t stride) {
  const __m128i lo = _mm_cvtsi32_si128(static_cast<int>(Load32(pa)));
  const __m128i hi = _mm_cvtsi32_si128(static_cast<int>(Load32(pa + stride - 2)));
  const __m128 f = _mm_cvtph_ps(_mm_blend_epi16(lo, hi, 0x2));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

inline __m512 PairScalesF32(const float* p) {
  const __m128 f = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

// ---- Q4_0 / Q8_0 ----------------------------------------------------------------------

template <GgmlType kType>
struct Q32Traits;

template <>
struct Q32Traits<GgmlType::kQ4_0> {
  static constexpr int64_t kBlockBytes = 18;
  static constexpr int kOffset = 8;
  // Blocks at pa, pb -> 64 unsigned nibbles in element order [A 0..31, B 0..31].
  static __m512i Decode(const uint8_t* pa, const uint8_t* pb) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pa + 2)));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 2)));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(v, shift), _mm512_set1_epi8(0x0F));
  }
};

template <>
struct Q32Traits<GgmlType::kQ8_0> {
  static constexpr int64_t kBlockBytes = 34;
  static constexpr int kOffset = 128;
  static __m512i Decode(const uint8_t* pa, const uint8_t* pb) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + 2));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 2));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// One step over blocks (b, b+1), or over the last block alone when !kPair (its second
// half reuses block b against zero activations, so it adds nothing).
template <GgmlType kType, int NR, int NT, bool kPair>
__attribute__((always_inline)) inline void StepQ32(const TileArgs& p, int64_t b, __m512 (&acc)[NR][NT]) {
  using T = Q32Traits<kType>;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(T::kOffset));
  const int64_t bb = kPair ? b + 1 : b;
  __m512i av[NT], bias[NT];
  __m512 da[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    const uint8_t* a = p.a + t * p.a_stride;
    av[t] = kPair ? _mm512_loadu_si512(a + 32 * b) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, a + 32 * b);
    bias[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, av[t]));
    const float* ad = reinterpret_cast<const float*>(a + p.cols);
    da[t] = kPair ? PairScalesF32(ad + b) : _mm512_set1_ps(ad[b]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r) {
    const uint8_t* w = p.w + r * p.w_stride + T::kBlockBytes * b;
    const __m512i wv = T::Decode(w, w + T::kBlockBytes * (bb - b));
    __m512 dw;
    if constexpr (kPair) {
      dw = PairScalesF16(w, T::kBlockBytes);
    } else {
      uint16_t dh;
      std::memcpy(&dh, w, 2);
      dw = _mm512_set1_ps(_cvtsh_ss(dh));
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512i isum = _mm512_dpbusd_epi32(bias[t], wv, av[t]);
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, da[t]), acc[r][t]);
    }
  }
}

template <GgmlType kType, int NR, int NT>
void TileQ32(const TileArgs& p) {
  const int64_t nb = p.cols / 32;
  __m512 acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t b = 0;
  // Software prefetch, a few cache lines ahead on every row of the tile: with more than
  // one row in flight the hardware prefetchers fall behind (Zen 4, DRAM-resident Q4_0,
  // 3-row tiles: 3.8 GB/s without, see kGemvMaxTokens).
  constexpr int64_t kAhead = 512;
  for (; b + 2 <= nb; b += 2) {
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(p.w + r * p.w_stride + Q32Traits<kType>::kBlockBytes * b + kAhead), _MM_HINT_T0);
    }
    StepQ32<kType, NR, NT, true>(p, b, acc);
  }
  if (b < nb) StepQ32<kType, NR, NT, false>(p, b, acc);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) p.y[t * p.y_stride + r] = Hsum(acc[r][t]);
}

// ---- Q4_K / Q6_K ----------------------------------------------------------------------

// Index vector for vpermw: int16 lane i takes scale (base + i / per).
inline __m512i ScaleIndex(int base, int per) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(base + i / per);
  return _mm512_load_si512(idx);
}

template <int NT>
void TileQ4_K(const TileArgs& p) {
  const int64_t nb = p.cols / kQkK;
  const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(p.w);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i nib_shift = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);
  __m512i sidx[4];
#pragma GCC unroll 8
  for (int c = 0; c < 4; ++c) sidx[c] = ScaleIndex(2 * c, 16);
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = wb[b];
    // Unpack the 12 scale bytes into 8 scales (bytes 0..7) and 8 mins (bytes 8..15).
    uint32_t u[4];
    std::memcpy(u, x.scales, 12);
    const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
    u[3] = ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4);
    const uint32_t mins_lo = u[1] & k6;
    u[1] = (u[2] & k4) | (((u[0] >> 6) & k2) << 4);
    u[2] = mins_lo;
    u[0] &= k6;
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));  // lanes 0..7 scales
    const __m128i mins = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m256i mins2 = _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
    const float d = _cvtsh_ss(x.d), dmin = _cvtsh_ss(x.dmin);

    __m512i iacc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) iacc[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i q = _mm512_and_si512(
          _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * c))),
                            nib_shift),
          m4);
      const __m512i s = _mm512_permutexvar_epi16(sidx[c], sc);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512i a = _mm512_loadu_si512(p.a + t * p.a_stride + kQkK * b + 64 * c);
        iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(q, a), s);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = p.a + t * p.a_stride;
      const float da = reinterpret_cast<const float*>(a + p.cols)[b];
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + p.cols + 4 * nb + 32 * b));
      const __m512i msum = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, mins2));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t]), _mm512_set1_ps(d * da), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_set1_ps(-dmin * da), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) p.y[t * p.y_stride] = Hsum(acc[t]);
}

template <int NT>
void TileQ6_K(const TileArgs& p) {
  const int64_t nb = p.cols / kQkK;
  const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(p.w);
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  const __m512i shl_lo = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);  // qh bits 0-1 | 2-3 -> 4-5
  const __m512i shr_hi = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);  // qh bits 4-5 | 6-7 -> 4-5
  __m512i sidx[4];
#pragma GCC unroll 8
  for (int k = 0; k < 4; ++k) sidx[k] = ScaleIndex(4 * k, 8);
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& x = wb[b];
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m256i neg32sc = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5));
    const float d = _cvtsh_ss(x.d);

    __m512i iacc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m256i bs =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.a + t * p.a_stride + p.cols + 4 * nb + 32 * b));
      iacc[t] = _mm512_zextsi256_si512(_mm256_madd_epi16(bs, neg32sc));  // -32 * sum_g sc_g * bsum_g
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_loadu_si512(x.ql + 64 * h);
      const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh + 32 * h)));
      const __m512i q0 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi64(hb, shl_lo), m30));
      const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi64(l, 4), m4),
                                         _mm512_and_si512(_mm512_srlv_epi64(hb, shr_hi), m30));
      const __m512i s0 = _mm512_permutexvar_epi16(sidx[2 * h], sc);
      const __m512i s1 = _mm512_permutexvar_epi16(sidx[2 * h + 1], sc);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = p.a + t * p.a_stride + kQkK * b + 128 * h;
        iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(q0, _mm512_loadu_si512(a)), s0);
        iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(q1, _mm512_loadu_si512(a + 64)), s1);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const float da = reinterpret_cast<const float*>(p.a + t * p.a_stride + p.cols)[b];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t]), _mm512_set1_ps(d * da), acc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) p.y[t * p.y_stride] = Hsum(acc[t]);
}

// ---- F32 / F16 / BF16 -----------------------------------------------------------------

struct F32Traits {
  static __m512 LoadW(const uint8_t* w, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(w) + c);
  }
};
struct F16Traits {
  static __m512 LoadW(const uint8_t* w, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(w) + c));
  }
};

// Float weights (f32 or f16) against f32 activations, 16 columns per step; the column
// tail is one masked step.
template <typename T, int NR, int NT>
void TileFloat(const TileArgs& p) {
  __m512 acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  auto step = [&](int64_t c, __mmask16 m) __attribute__((always_inline)) {
    __m512 x[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) x[t] = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(p.a + t * p.a_stride) + c);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512 w = T::LoadW(p.w + r * p.w_stride, c, m);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(w, x[t], acc[r][t]);
    }
  };
  int64_t c = 0;
  for (; c + 16 <= p.cols; c += 16) step(c, 0xFFFF);
  if (c < p.cols) step(c, static_cast<__mmask16>((1u << (p.cols - c)) - 1));
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) p.y[t * p.y_stride + r] = Hsum(acc[r][t]);
}

template <int NR, int NT>
void TileBF16(const TileArgs& p) {
  __m512 acc[NR][NT];
#pragma GCC unroll 8
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  auto step = [&](int64_t c, __mmask32 m) __attribute__((always_inline)) {
    __m512bh x[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      x[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(p.a + t * p.a_stride) + c);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const __m512bh w = (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(p.w + r * p.w_stride) + c);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w, x[t]);
    }
  };
  int64_t c = 0;
  for (; c + 32 <= p.cols; c += 32) step(c, 0xFFFFFFFFu);
  if (c < p.cols) step(c, static_cast<__mmask32>((1ull << (p.cols - c)) - 1));
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) p.y[t * p.y_stride + r] = Hsum(acc[r][t]);
}

// ---- dispatch on the tile's actual size -------------------------------------------------

template <template <int, int> class K>
struct Dispatch4x4 {
  static void Run(const TileArgs& p) {
    static constexpr TileFn kTable[4][4] = {
        {K<1, 1>::Fn, K<1, 2>::Fn, K<1, 3>::Fn, K<1, 4>::Fn},
        {K<2, 1>::Fn, K<2, 2>::Fn, K<2, 3>::Fn, K<2, 4>::Fn},
        {K<3, 1>::Fn, K<3, 2>::Fn, K<3, 3>::Fn, K<3, 4>::Fn},
        {K<4, 1>::Fn, K<4, 2>::Fn, K<4, 3>::Fn, K<4, 4>::Fn},
    };
    kTable[p.nr - 1][p.nt - 1](p);
  }
};

template <template <int> class K>
struct Dispatch1x8 {
  static void Run(const TileArgs& p) {
    static constexpr TileFn kTable[8] = {K<1>::Fn, K<2>::Fn, K<3>::Fn, K<4>::Fn,
                                         K<5>::Fn, K<6>::Fn, K<7>::Fn, K<8>::Fn};
    kTable[p.nt - 1](p);
  }
};

template <int NR, int NT> struct KQ4_0 { static constexpr TileFn Fn = TileQ32<GgmlType::kQ4_0, NR, NT>; };
template <int NR, int NT> struct KQ8_0 { static constexpr TileFn Fn = TileQ32<GgmlType::kQ8_0, NR, NT>; };
template <int NR, int NT> struct KF32 { static constexpr TileFn Fn = TileFloat<F32Traits, NR, NT>; };
template <int NR, int NT> struct KF16 { static constexpr TileFn Fn = TileFloat<F16Traits, NR, NT>; };
template <int NR, int NT> struct KBF16 { static constexpr TileFn Fn = TileBF16<NR, NT>; };
template <int NT> struct KQ4_K { static constexpr TileFn Fn = TileQ4_K<NT>; };
template <int NT> struct KQ6_K { static constexpr TileFn Fn = TileQ6_K<NT>; };

}  // namespace

TileKernel GetTileKernelAvx512(GgmlType type, int64_t n_tokens) {
  // Small batches (decode) stream weights: one-row tiles (see kGemvMaxTokens).
  const int q32_rows = n_tokens <= kGemvMaxTokens ? 1 : 3;
  switch (type) {
    case GgmlType::kQ4_0: return {Dispatch4x4<KQ4_0>::Run, q32_rows, 4};
    case GgmlType::kQ8_0: return {Dispatch4x4<KQ8_0>::Run, q32_rows, 4};
    case GgmlType::kQ4_K: return {Dispatch1x8<KQ4_K>::Run, 1, 8};
    case GgmlType::kQ6_K: return {Dispatch1x8<KQ6_K>::Run, 1, 8};
    case GgmlType::kF32: return {Dispatch4x4<KF32>::Run, 4, 4};
    case GgmlType::kF16: return {Dispatch4x4<KF16>::Run, 4, 4};
    case GgmlType::kBF16: return {Dispatch4x4<KBF16>::Run, 4, 4};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

// AVX2 kernels over the x16 packed layouts (packed.h: Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, F16, BF16), for CPUs without AVX-512 VNNI (most laptops). Included by packed_avx2.cc (plain AVX2: a 4-byte dot is
// vpmaddubsw into int16 pairs, finished once per block by vpmaddwd; nibble products are
// at most 15 * 127 * 2 = 3810 per pair, so a 32-element block sums in int16 without
// saturating, <= 30480) and by packed_avxvnni.cc (AVX-VNNI, e.g. Intel Alder Lake and
// later: vpdpbusd on ymm, one instruction per 4-byte dot), which defines
// TRELLIS_PACKED_AVXVNNI 1. A ymm holds one half of a group (8 rows); a tile is one half x
// up to 4 tokens (16 ymm registers: 4 sums, 4 f32 accumulators, weights).
//
// Every loop over a tile's tokens, halves or groups is TRELLIS_UNROLL (kernels/unroll.h):
// rolled, they kept the accumulator arrays in memory and the F16 6-token tile stored its 12
// accumulators on every pass of the inner loop (12 stores per 24 FMAs). Line loops unroll by 2: at 4 or 8, GCC hoisted all the lines'
// products ahead of their adds and spilled them.
//
// Thread safety: pure functions.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/matmul_internal.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "kernels/unroll.h"

#ifndef TRELLIS_PACKED_AVXVNNI
#define TRELLIS_PACKED_AVXVNNI 0
#endif

namespace trellis::matmul_internal {
namespace {

constexpr int kAvx2PackedTokens = 4;

// How far ahead of the current weight line the tiles prefetch into L1 (PrefetchWeights).
// Decode tiles (1-2 tokens) 4 KiB: against 1 KiB, bench_kernels' dram/ rows at one token
// ran 1.06-1.56x faster for every type on plain AVX2 (1.17-1.63x with AVX-VNNI; Zen 5,
// 4 alternating rounds; 8 KiB no better), decode tg64 IQ4_NL 44.5 -> 51.2 tok/s and
// Q4_K_M 49.5 -> 59.5 (6 rounds). Batch tiles keep 1 KiB (their lines take longer each).
template <int NT>
constexpr int64_t kPrefetchBytes = NT <= 2 ? 4096 : 1024;

// One 32-element block of 4-bit x16 weights, the half of the group at wb (4 lines of 64
// bytes, this half's 32 bytes in each), against NT tokens' activation bytes at
// arow[t] + offset, into sum[t]: with AVX-VNNI int32 dots per row (vpdpbusd ymm) of
// map(e) (the identity, or IQ4_NL's grid + 128), else int16 pair sums of e (vpmaddubsw;
// ToInt32 finishes them).
struct Nibbles {
  __m256i operator()(__m256i e) const { return e; }
};
template <int NT, typename Map = Nibbles>
__attribute__((always_inline)) inline void SumNibbleBlock(const uint8_t* wb, const uint8_t* const (&arow)[NT],
                                                          int64_t offset, __m256i (&sum)[NT], Map map = {}) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) sum[t] = _mm256_setzero_si256();
  auto line = [&](int i) __attribute__((always_inline)) {
    PrefetchWeights<NT, kPrefetchBytes<NT>>(wb + 64 * i);
    const __m256i packed = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * i));
    const __m256i lo = map(_mm256_and_si256(packed, m4));
    const __m256i hi = map(_mm256_and_si256(_mm256_srli_epi16(packed, 4), m4));
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = arow[t] + offset + 8 * i;
#if TRELLIS_PACKED_AVXVNNI
      sum[t] = _mm256_dpbusd_avx_epi32(sum[t], lo, _mm256_set1_epi32(Load32(a)));
      sum[t] = _mm256_dpbusd_avx_epi32(sum[t], hi, _mm256_set1_epi32(Load32(a + 4)));
#else
      sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(Load32(a))));
      sum[t] = _mm256_add_epi16(sum[t], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(Load32(a + 4))));
#endif
    }
  };
  // Decode tiles (1-2 tokens) take all 4 lines at once (more loads in flight; measured
  // ~3 % faster Q4_K_M decode than 2); batch tiles 2 at a time, or GCC spills the sums.
  if constexpr (NT <= 2) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) line(i);
  } else {
#pragma GCC unroll 2
    for (int i = 0; i < 4; ++i) line(i);
  }
}

// The int32 row dots of a SumNibbleBlock result.
inline __m256i ToInt32(__m256i sum) {
#if TRELLIS_PACKED_AVXVNNI
  return sum;
#else
  return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
#endif
}

// Bit `src` of every byte moved to bit 4 (other bits of the result are garbage).
template <int kSrc>
__attribute__((always_inline)) inline __m256i BitTo4(__m256i v) {
  if constexpr (kSrc < 4) return _mm256_slli_epi16(v, 4 - kSrc);
  else if constexpr (kSrc == 4) return v;
  else return _mm256_srli_epi16(v, kSrc - 4);
}

// A Q5_K sub-block's half (4 nibble lines + the 5th-bit line at wb + 256, packed.h; this
// half's 32 bytes of each) against NT tokens: isum[t] = int32 row dots of e * a, e in
// 0..31. Without AVX-VNNI the int16 pair sums are finished every 4 vpmaddubsw (products
// up to 31 * 127 * 2 = 7874 per pair) by vpmaddwd with `pair_mul` (the int16 pair
// (m, m) in each row's lane: the dots times m, e.g. a K-quant's sub-block scale; 1 by
// default). With AVX-VNNI pair_mul is not applied.
template <int NT>
__attribute__((always_inline)) inline void DotQ5Half(const uint8_t* wb, const uint8_t* const (&arow)[NT],
                                                     int64_t offset, __m256i (&isum)[NT],
                                                     [[maybe_unused]] __m256i pair_mul = _mm256_set1_epi16(1)) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m10 = _mm256_set1_epi8(0x10);
  const __m256i high = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 256));
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
#if !TRELLIS_PACKED_AVXVNNI
  __m256i pairs[NT];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) pairs[t] = _mm256_setzero_si256();
#endif
  auto line = [&](auto i_const) {
    constexpr int i = decltype(i_const)::value;
    PrefetchWeights<NT, kPrefetchBytes<NT>>(wb + 64 * i);
    const __m256i packed = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * i));
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(packed, m4), _mm256_and_si256(BitTo4<2 * i>(high), m10));
    const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(packed, 4), m4),
                                       _mm256_and_si256(BitTo4<2 * i + 1>(high), m10));
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = arow[t] + offset + 8 * i;
#if TRELLIS_PACKED_AVXVNNI
      isum[t] = _mm256_dpbusd_avx_epi32(isum[t], lo, _mm256_set1_epi32(Load32(a)));
      isum[t] = _mm256_dpbusd_avx_epi32(isum[t], hi, _mm256_set1_epi32(Load32(a + 4)));
#else
      pairs[t] = _mm256_add_epi16(pairs[t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(Load32(a))),
                                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(Load32(a + 4)))));
      if constexpr (i % 2 == 1) {
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(pairs[t], pair_mul));
        pairs[t] = _mm256_setzero_si256();
      }
#endif
    }
  };
  line(std::integral_constant<int, 0>{});
  line(std::integral_constant<int, 1>{});
  line(std::integral_constant<int, 2>{});
  line(std::integral_constant<int, 3>{});
}

// Stores acc[t] (the 8 rows of half h) to y, rows past p.nr left untouched.
template <int NT>
__attribute__((always_inline)) inline void StoreHalf(const PackedArgs& p, int h, const __m256 (&acc)[NT]) {
  alignas(32) static constexpr int32_t kLane[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(p.nr - 8 * h),
                                          _mm256_load_si256(reinterpret_cast<const __m256i*>(kLane)));
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) _mm256_maskstore_ps(p.y + t * p.y_stride + 8 * h, mask, acc[t]);
}

// Q8_0: weights stored as q + 128. With AVX-VNNI, 8 vpdpbusd per block from
// -128 * sum(a). Plain AVX2 cannot use q + 128 against int8 activations (vpmaddubsw's
// pair of 255 * 127 products saturates int16), so it takes the signed weight (q + 128
// xor 0x80), its absolute value as the unsigned operand and the activation with the
// weight's sign (vpsignb); pairs of up to 128 * 127 fit int16, vpmaddwd widens each dot.
// The weight's xor and abs are paid once per line for every token of the tile. Then one
// convert + FMA per block.
template <int NT, int NH>
void HalfQ8_0(const PackedArgs& p, int h0) {
  const uint8_t* arow[NT];
  const float* da[NT];
  const int32_t* asum[NT];
  RowFields(p.a, p.a_stride, 0, arow);
  RowFields(p.a, p.a_stride, p.cols, da);
  RowFields(p.a, p.a_stride, Q8_0SumOffset(p.cols), asum);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(p.g + p.nb * 512);
  __m256 acc[NH][NT];
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_setzero_ps();
  constexpr int64_t kScaleLead = std::max<int64_t>(2, kPrefetchBytes<NT> / 512);  // blocks
  PrefetchScalesStart<kScaleLead>(scales);
  for (int64_t b = 0; b < p.nb; ++b) {
    PrefetchScales<kScaleLead>(scales, b);
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      const uint8_t* wb = p.g + b * 512 + 32 * h;
      __m256i isum[NT];
#if TRELLIS_PACKED_AVXVNNI
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_set1_epi32(-128 * asum[t][b]);
#else
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
#endif
#pragma GCC unroll 2
      for (int j = 0; j < 8; ++j) {
        PrefetchWeights<NT, kPrefetchBytes<NT>>(wb + 64 * j);
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * j));
#if TRELLIS_PACKED_AVXVNNI
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          isum[t] = _mm256_dpbusd_avx_epi32(isum[t], w, _mm256_set1_epi32(Load32(arow[t] + 32 * b + 4 * j)));
        }
#else
        const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
        const __m256i wa = _mm256_abs_epi8(ws);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const __m256i as = _mm256_sign_epi8(_mm256_set1_epi32(Load32(arow[t] + 32 * b + 4 * j)), ws);
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, as), _mm256_set1_epi16(1)));
        }
#endif
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + 16 * b + 8 * h)));
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(da[t][b])), acc[hh][t]);
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// Q4_K (layout in packed.h), llama.cpp's Q8_K activations: per 32-element sub-block the
// same int16 sums as Q4_0. Plain AVX2: the vpmaddwd that widens them multiplies by the
// sub-block's 6-bit scale as well ((sc, sc) int16 pairs), so a super-block sums in int32
// (|sum| < 2^27), as llama.cpp does, and once per super-block acc += f(isum) * (d *
// da[t])[rows] - sum over j of (dmin * m_j)[rows] * (da * sum_j)[t]: per token and
// sub-block an add instead of a convert, a multiply and an FMA. With AVX-VNNI (int32
// dots, whose scaling would take a vpmulld, 10 cycles on Intel) each sub-block applies
// acc += f(isum) * (d * sc_j)[rows] * da[t] - (dmin * m_j)[rows] * (da * sum)[t] in f32.
template <bool kQ5, int NT, int NH>
void HalfQ4_K(const PackedArgs& p, int h0) {
  constexpr bool kIntScale = !TRELLIS_PACKED_AVXVNNI;
  const int64_t nsb = p.cols / 256;
  const uint8_t* arow[NT];
  const float* da[NT];
  const float* dsum[NT];
  RowFields(p.a, p.a_stride, 0, arow);
  RowFields(p.a, p.a_stride, p.cols, da);
  RowFields(p.a, p.a_stride, Q8KDsum32Offset(p.cols), dsum);
  __m256 acc[NH][NT];
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    constexpr int64_t kSub = kQ5 ? 320 : 256;  // bytes per sub-block
    const uint8_t* sb = p.g + s * (kQ5 ? kPackedQ5KSuperBytes : kPackedQ4KSuperBytes);
    const uint8_t* sc = sb + 8 * kSub + 64;
    const uint8_t* mins = sc + 128;
    auto d_of = [&](int h) { return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sb + 8 * kSub + 16 * h))); };
    auto m_of = [&](int j, int h) {  // dmin * m_j, the rows of half h
      const __m256 dmin = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sb + 8 * kSub + 32 + 16 * h)));
      return _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                     _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins + 16 * j + 8 * h)))));
    };
    [[maybe_unused]] __m256i isum[NH][NT];
    if constexpr (kIntScale) {
      TRELLIS_UNROLL
      for (int hh = 0; hh < NH; ++hh)
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) isum[hh][t] = _mm256_setzero_si256();
    }
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * s + j;
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; ++hh) {
        const int h = h0 + hh;
        const __m256i sc32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * j + 8 * h)));
        __m256i sum[NT];
        if constexpr (kIntScale) {
          const __m256i sc_pair = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
          if constexpr (kQ5) {
            DotQ5Half<NT>(sb + kSub * j + 32 * h, arow, 32 * b, sum, sc_pair);
          } else {
            SumNibbleBlock<NT>(sb + kSub * j + 32 * h, arow, 32 * b, sum);
          }
#pragma GCC unroll 4
          for (int t = 0; t < NT; ++t) {
            isum[hh][t] = _mm256_add_epi32(isum[hh][t], kQ5 ? sum[t] : _mm256_madd_epi16(sum[t], sc_pair));
          }
          continue;
        }
        const __m256 scale = _mm256_mul_ps(d_of(h), _mm256_cvtepi32_ps(sc32));
        const __m256 min = m_of(j, h);
        if constexpr (kQ5) {
          DotQ5Half<NT>(sb + kSub * j + 32 * h, arow, 32 * b, sum);
        } else {
          SumNibbleBlock<NT>(sb + kSub * j + 32 * h, arow, 32 * b, sum);
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const __m256i isum_j = kQ5 ? sum[t] : ToInt32(sum[t]);
          acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum_j), _mm256_mul_ps(scale, _mm256_set1_ps(da[t][s])), acc[hh][t]);
          acc[hh][t] = _mm256_fnmadd_ps(min, _mm256_set1_ps(dsum[t][b]), acc[hh][t]);
        }
      }
    }
    if constexpr (kIntScale) {
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; ++hh) {
        const int h = h0 + hh;
        const __m256 d = d_of(h);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[hh][t]), _mm256_mul_ps(d, _mm256_set1_ps(da[t][s])), acc[hh][t]);
        }
        for (int j = 0; j < 8; ++j) {
          const __m256 min = m_of(j, h);
#pragma GCC unroll 4
          for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_fnmadd_ps(min, _mm256_set1_ps(dsum[t][8 * s + j]), acc[hh][t]);
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// IQ4_NL's grid (signed) in both 128-bit lanes, for a byte shuffle by nibble.
inline __m256i Iq4GridSigned() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
}

// IQ4_NL's grid + 128 (1..241, unsigned) by nibble: vpdpbusd's unsigned operand.
struct Iq4GridUnsigned {
  __m256i grid = _mm256_add_epi8(Iq4GridSigned(), _mm256_set1_epi8(static_cast<char>(0x80)));
  __m256i operator()(__m256i e) const { return _mm256_shuffle_epi8(grid, e); }
};

// An IQ4_NL block's half (4 index lines at wb, this half's 32 bytes of each) against NT
// tokens: isum[t] = int32 row dots of grid value * a. With AVX-VNNI, vpdpbusd of grid +
// 128 and the correction -128 * sum(a); plain AVX2 as its Q8_0 kernel: vpmaddubsw(|w|,
// sign(a, w)), each pair widened by vpmaddwd (grid values reach 127 in magnitude).
// corr(t) is -128 * the sum of token t's 32 activation bytes of the block.
template <int NT, typename Corr>
__attribute__((always_inline)) inline void DotIq4Half(const uint8_t* wb, const uint8_t* const (&arow)[NT], int64_t b,
                                                      [[maybe_unused]] Corr corr, __m256i (&isum)[NT]) {
#if TRELLIS_PACKED_AVXVNNI
  SumNibbleBlock<NT>(wb, arow, 32 * b, isum, Iq4GridUnsigned{});
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_set1_epi32(corr(t)));
#else
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i grid = Iq4GridSigned();
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int i = 0; i < 4; ++i) {
    PrefetchWeights<NT, kPrefetchBytes<NT>>(wb + 64 * i);
    const __m256i packed = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * i));
    const __m256i ws[2] = {_mm256_shuffle_epi8(grid, _mm256_and_si256(packed, m4)),
                           _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(packed, 4), m4))};
    const __m256i wa[2] = {_mm256_abs_epi8(ws[0]), _mm256_abs_epi8(ws[1])};
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = arow[t] + 32 * b + 8 * i;
#pragma GCC unroll 2
      for (int x = 0; x < 2; ++x) {
        const __m256i as = _mm256_sign_epi8(_mm256_set1_epi32(Load32(a + 4 * x)), ws[x]);
        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wa[x], as), _mm256_set1_epi16(1)));
      }
    }
  }
#endif
}

// Rows [8 h, 8 h + 8) of the group x NT tokens for the 32-element block types but Q8_0
// (layouts in packed.h), Q8_0 row activations: per block the row dots (SumNibbleBlock, e in
// 0..15; DotQ5Half, e in 0..31; DotIq4Half, the grid's values), then one convert + FMA
// applies d[rows] * da[t]; Q4_0 and Q5_0 add -8 (-16) * sum(a) for their bias, Q5_1 adds
// m[rows] * (da * sum)[t].
template <GgmlType kType, int NT, int NH>
void HalfQ32(const PackedArgs& p, int h0) {
  constexpr int kLines = PackedLines(kType);
  constexpr int32_t kOffset = kType == GgmlType::kQ4_0 ? 8 : kType == GgmlType::kQ5_0 ? 16 : 0;  // unsigned bias
  const uint8_t* arow[NT];
  const float* da[NT];
  const int32_t* asum[NT];
  const float* dsum[NT];
  RowFields(p.a, p.a_stride, 0, arow);
  RowFields(p.a, p.a_stride, p.cols, da);
  RowFields(p.a, p.a_stride, Q8_0SumOffset(p.cols), asum);
  RowFields(p.a, p.a_stride, Q8_0SumOffset(p.cols) + 4 * (p.cols / 32), dsum);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(p.g + p.nb * 64 * kLines);
  [[maybe_unused]] const uint16_t* mins = scales + 16 * p.nb;
  __m256 acc[NH][NT];
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_setzero_ps();
  constexpr int64_t kScaleLead = std::max<int64_t>(2, kPrefetchBytes<NT> / (64 * kLines));  // blocks
  PrefetchScalesStart<kScaleLead>(scales);
  if constexpr (kType == GgmlType::kQ5_1) PrefetchScalesStart<kScaleLead>(mins);
  for (int64_t b = 0; b < p.nb; ++b) {
    PrefetchScales<kScaleLead>(scales, b);
    if constexpr (kType == GgmlType::kQ5_1) PrefetchScales<kScaleLead>(mins, b);
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      const uint8_t* wb = p.g + b * 64 * kLines + 32 * h;
      __m256i isum[NT];
      if constexpr (kType == GgmlType::kQ4_0) {
        SumNibbleBlock<NT>(wb, arow, 32 * b, isum);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) isum[t] = ToInt32(isum[t]);
      } else if constexpr (kType == GgmlType::kIQ4_NL) {
        DotIq4Half<NT>(wb, arow, b, [&asum, b](int t) { return -128 * asum[t][b]; }, isum);
      } else {
        DotQ5Half<NT>(wb, arow, 32 * b, isum);
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scales + 16 * b + 8 * h)));
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        if constexpr (kOffset != 0) isum[t] = _mm256_add_epi32(isum[t], _mm256_set1_epi32(-kOffset * asum[t][b]));
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(da[t][b])), acc[hh][t]);
      }
      if constexpr (kType == GgmlType::kQ5_1) {
        const __m256 mw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mins + 16 * b + 8 * h)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(dsum[t][b]), acc[hh][t]);
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// Q6_K (layout in packed.h), Q8_K activations: per 16-element group, 4 dots of the 6-bit
// weights (nibble | high pair << 4) from -32 * bsum, times the group's int8 scale in
// int32; one convert + FMA per super-block. Without AVX-VNNI the int16 pair sums are
// finished every two vpmaddubsw (two pairs of 63 * 127 * 2 fit int16, four do not).
template <int NT>
void HalfQ6_K(const PackedArgs& p, int h) {
  const int64_t nsb = p.cols / 256;
  const Q8KTokens<NT> tok(p);
  const auto& arow = tok.q;
  const auto& da = tok.d;
  const auto& bias16 = tok.bias16;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m30 = _mm256_set1_epi8(0x30);
  __m256 acc[NT];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedQ6KSuperBytes;
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 8 * 384);
    const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sb + 8 * 384 + 256 + 16 * h)));
    __m256i isum[NT];
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* bl = sb + 384 * j;
      TRELLIS_UNROLL
      for (int line = 0; line < 6; ++line) PrefetchWeights<NT, kPrefetchBytes<NT>>(bl + 64 * line);
#pragma GCC unroll 2
      for (int x = 0; x < 2; ++x) {
        const __m256i l0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bl + 128 * x + 32 * h));
        const __m256i l1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(bl + 128 * x + 64 + 32 * h));
        const __m256i hb = _mm256_load_si256(reinterpret_cast<const __m256i*>(bl + 256 + 64 * x + 32 * h));
        const __m256i w0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
        const __m256i w1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
        const __m256i w2 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(hb, m30));
        const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
        const int grp = 2 * j + x;
        const __m256i scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * grp + 8 * h)));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const uint8_t* a = arow[t] + 256 * s + 16 * grp;
          __m256i g = _mm256_set1_epi32(bias16[t][16 * s + grp]);
#if TRELLIS_PACKED_AVXVNNI
          g = _mm256_dpbusd_avx_epi32(g, w0, _mm256_set1_epi32(Load32(a)));
          g = _mm256_dpbusd_avx_epi32(g, w1, _mm256_set1_epi32(Load32(a + 4)));
          g = _mm256_dpbusd_avx_epi32(g, w2, _mm256_set1_epi32(Load32(a + 8)));
          g = _mm256_dpbusd_avx_epi32(g, w3, _mm256_set1_epi32(Load32(a + 12)));
#else
          const __m256i ones = _mm256_set1_epi16(1);
          const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(Load32(a))),
                                               _mm256_maddubs_epi16(w1, _mm256_set1_epi32(Load32(a + 4))));
          const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w2, _mm256_set1_epi32(Load32(a + 8))),
                                               _mm256_maddubs_epi16(w3, _mm256_set1_epi32(Load32(a + 12))));
          g = _mm256_add_epi32(g, _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)));
#endif
          isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(g, scale));
        }
      }
    }
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(da[t][s])), acc[t]);
    }
  }
  StoreHalf(p, h, acc);
}

// Decode-sized tiles (1-2 tokens) of Q4_0, Q8_0 and Q4_K run both halves in one pass over the
// blocks, so the group streams through once, whole lines at a time: one half per pass
// read each 64-byte line twice, 32 bytes each time, and held decode to ~28 GB/s where
// the F16 tiles, which take whole lines, read 56 GB/s.
template <template <int> class Half, int NT>
void TileHalves(const PackedArgs& p) {
  if constexpr (NT <= 2 && Half<NT>::kBothHalves) {
    if (p.nr > 8) {
      Half<NT>::Both(p);
      return;
    }
  }
  Half<NT>::Run(p, 0);
  if (p.nr > 8) Half<NT>::Run(p, 1);
}

template <int NT>
struct Q4_KHalf {
  static constexpr bool kBothHalves = true;
  static void Run(const PackedArgs& p, int h) { HalfQ4_K<false, NT, 1>(p, h); }
  static void Both(const PackedArgs& p) { HalfQ4_K<false, NT, 2>(p, 0); }
};
template <int NT>
struct Q5_KHalf {
  // Both halves at once measured no faster for Q5_K (32.7 and 34.1 against 35.1 tok/s;
  // its 5th-bit unpacking already fills the registers).
  static constexpr bool kBothHalves = false;
  static void Run(const PackedArgs& p, int h) { HalfQ4_K<true, NT, 1>(p, h); }
  static void Both(const PackedArgs& p) { HalfQ4_K<true, NT, 2>(p, 0); }
};
template <int NT>
struct Q8_0Half {
  static constexpr bool kBothHalves = true;
  static void Run(const PackedArgs& p, int h) { HalfQ8_0<NT, 1>(p, h); }
  static void Both(const PackedArgs& p) { HalfQ8_0<NT, 2>(p, 0); }
};
template <int NT>
struct Q6_KHalf {
  static constexpr bool kBothHalves = false;
  static void Both(const PackedArgs&) {}
  static void Run(const PackedArgs& p, int h) { HalfQ6_K<NT>(p, h); }
};

// IQ4_XS (layout in packed.h), Q8_K activations: per sub-block the IQ4_NL dots
// (DotIq4Half; the correction from the row's -32 * bsum pair), times the sub-block's int8
// scale in int32; one convert + FMA per super-block, as Q6_K.
template <int NT, int NH>
void HalfIQ4_XS(const PackedArgs& p, int h0) {
  const int64_t nsb = p.cols / 256;
  const Q8KTokens<NT> tok(p);
  const auto& arow = tok.q;
  const auto& da = tok.d;
  const auto& bias16 = tok.bias16;
  __m256 acc[NH][NT];
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedIQ4XSSuperBytes;
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 2048 + 32);
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sb + 2048 + 16 * h)));
      __m256i isum[NT];
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const int64_t b = 8 * s + j;
        __m256i dot[NT];
        DotIq4Half<NT>(sb + 256 * j + 32 * h, arow, b,
                       [&bias16, b](int t) { return 4 * (bias16[t][2 * b] + bias16[t][2 * b + 1]); }, dot);
        const __m256i scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * j + 8 * h)));
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot[t], scale));
      }
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(d, _mm256_set1_ps(da[t][s])), acc[hh][t]);
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// Bit `src` of every byte moved to bit `dst` (other bits of the result are garbage).
template <int kSrc, int kDst>
__attribute__((always_inline)) inline __m256i MoveBit(__m256i v) {
  if constexpr (kSrc < kDst) return _mm256_slli_epi16(v, kDst - kSrc);
  else if constexpr (kSrc == kDst) return v;
  else return _mm256_srli_epi16(v, kSrc - kDst);
}

// Q2_K and Q3_K (layouts in packed.h), Q8_K activations, as the AVX-512 kernel: per group
// 4 dots of the 2-bit (Q3_K: 3-bit) weights from 0 (Q3_K: bias16 / 8 = -4 * bsum), times
// the group's scale in int32; Q2_K's mins as m x bias16. Without AVX-VNNI the 4 products
// of a group sum in int16 (at most 4 x 2 x 7 x 128 = 7168) and one vpmaddwd widens them.
template <bool kQ3, int NT, int NH>
void HalfLowK(const PackedArgs& p, int h0) {
  constexpr int64_t kBlock = kQ3 ? 192 : 128, kSuper = kQ3 ? kPackedQ3KSuperBytes : kPackedQ2KSuperBytes;
  const int64_t nsb = p.cols / 256;
  const Q8KTokens<NT> tok(p);
  const auto& arow = tok.q;
  const auto& da = tok.d;
  const auto& bias16 = tok.bias16;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i m4 = _mm256_set1_epi8(4);
  __m256 acc[NH][NT];
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t] = _mm256_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kSuper;
    const uint8_t* sc = sb + 8 * kBlock;
    __m256i isum[NH][NT], msum[NH][NT];
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh)
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[hh][t] = msum[hh][t] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      TRELLIS_UNROLL
      for (int hh = 0; hh < NH; ++hh) {
        const int h = h0 + hh;
        const uint8_t* bl = sb + kBlock * j + 32 * h;
        if (hh == 0) {  // both halves of a line share its cache line
          PrefetchWeights<NT, kPrefetchBytes<NT>>(bl);
          PrefetchWeights<NT, kPrefetchBytes<NT>>(bl + 64);
          if constexpr (kQ3) PrefetchWeights<NT, kPrefetchBytes<NT>>(bl + 128);
        }
        [[maybe_unused]] __m256i hb;
        if constexpr (kQ3) hb = _mm256_load_si256(reinterpret_cast<const __m256i*>(bl + 128));
        auto group = [&](auto m_const) __attribute__((always_inline)) {
          constexpr int m = decltype(m_const)::value;
          const __m256i line = _mm256_load_si256(reinterpret_cast<const __m256i*>(bl + 64 * m));
          __m256i w[4] = {_mm256_and_si256(line, m3), _mm256_and_si256(_mm256_srli_epi16(line, 2), m3),
                          _mm256_and_si256(_mm256_srli_epi16(line, 4), m3), _mm256_and_si256(_mm256_srli_epi16(line, 6), m3)};
          if constexpr (kQ3) {
            w[0] = _mm256_or_si256(w[0], _mm256_and_si256(MoveBit<4 * m, 2>(hb), m4));
            w[1] = _mm256_or_si256(w[1], _mm256_and_si256(MoveBit<4 * m + 1, 2>(hb), m4));
            w[2] = _mm256_or_si256(w[2], _mm256_and_si256(MoveBit<4 * m + 2, 2>(hb), m4));
            w[3] = _mm256_or_si256(w[3], _mm256_and_si256(MoveBit<4 * m + 3, 2>(hb), m4));
          }
          const int grp = 2 * j + m;
          __m256i scale, mins;
          if constexpr (kQ3) {
            scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * grp + 8 * h)));
          } else {
            const __m256i scm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * grp + 8 * h)));
            scale = _mm256_and_si256(scm, _mm256_set1_epi32(15));
            mins = _mm256_srli_epi32(scm, 4);
          }
#pragma GCC unroll 4
          for (int t = 0; t < NT; ++t) {
            const uint8_t* a = arow[t] + 256 * s + 16 * grp;
            const int32_t bias = bias16[t][16 * s + grp];
            __m256i g = kQ3 ? _mm256_set1_epi32(bias / 8) : _mm256_setzero_si256();
#if TRELLIS_PACKED_AVXVNNI
            g = _mm256_dpbusd_avx_epi32(g, w[0], _mm256_set1_epi32(Load32(a)));
            g = _mm256_dpbusd_avx_epi32(g, w[1], _mm256_set1_epi32(Load32(a + 4)));
            g = _mm256_dpbusd_avx_epi32(g, w[2], _mm256_set1_epi32(Load32(a + 8)));
            g = _mm256_dpbusd_avx_epi32(g, w[3], _mm256_set1_epi32(Load32(a + 12)));
#else
            const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], _mm256_set1_epi32(Load32(a))),
                                                 _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(Load32(a + 4))));
            const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], _mm256_set1_epi32(Load32(a + 8))),
                                                 _mm256_maddubs_epi16(w[3], _mm256_set1_epi32(Load32(a + 12))));
            g = _mm256_add_epi32(g, _mm256_madd_epi16(_mm256_add_epi16(p01, p23), _mm256_set1_epi16(1)));
#endif
            isum[hh][t] = _mm256_add_epi32(isum[hh][t], _mm256_mullo_epi32(g, scale));
            if constexpr (!kQ3) msum[hh][t] = _mm256_add_epi32(msum[hh][t], _mm256_mullo_epi32(mins, _mm256_set1_epi32(bias)));
          }
        };
        group(std::integral_constant<int, 0>{});
        group(std::integral_constant<int, 1>{});
      }
    }
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 256 + 16 * h)));
      [[maybe_unused]] __m256 dmin;
      if constexpr (!kQ3) {
        dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 256 + 32 + 16 * h))),
                             _mm256_set1_ps(1.0f / 32));
      }
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        const __m256 dat = _mm256_set1_ps(da[t][s]);
        acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[hh][t]), _mm256_mul_ps(d, dat), acc[hh][t]);
        if constexpr (!kQ3) acc[hh][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[hh][t]), _mm256_mul_ps(dmin, dat), acc[hh][t]);
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

template <bool kQ3>
struct LowKHalf {
  template <int NT>
  struct Of {
    static constexpr bool kBothHalves = true;
    static void Both(const PackedArgs& p) { HalfLowK<kQ3, NT, 2>(p, 0); }
    static void Run(const PackedArgs& p, int h) { HalfLowK<kQ3, NT, 1>(p, h); }
  };
};

template <int NT>
struct IQ4_XSHalf {
  static constexpr bool kBothHalves = true;
  static void Both(const PackedArgs& p) { HalfIQ4_XS<NT, 2>(p, 0); }
  static void Run(const PackedArgs& p, int h) { HalfIQ4_XS<NT, 1>(p, h); }
};

template <GgmlType kType>
struct Q32Half {
  template <int NT>
  struct Of {
    static constexpr bool kBothHalves = true;
    static void Run(const PackedArgs& p, int h) { HalfQ32<kType, NT, 1>(p, h); }
    static void Both(const PackedArgs& p) { HalfQ32<kType, NT, 2>(p, 0); }
  };
};

// The driver hands tiles of up to kPackedMaxTokens tokens: run them 4 at a time.
template <template <int> class Half>
void DispatchHalves(const PackedArgs& p) {
  static constexpr PackedFn kTable[kAvx2PackedTokens] = {TileHalves<Half, 1>, TileHalves<Half, 2>,
                                                         TileHalves<Half, 3>, TileHalves<Half, 4>};
  PackedArgs q = p;
  for (int t0 = 0; t0 < p.nt; t0 += kAvx2PackedTokens) {
    q.a = p.a + t0 * p.a_stride;
    q.y = p.y + t0 * p.y_stride;
    q.nt = std::min(kAvx2PackedTokens, p.nt - t0);
    kTable[q.nt - 1](q);
  }
}

// F16 and BF16 (packed.h): outer products. Per column, a group's 16 weights widen to f32
// in two ymm (8 rows each) and meet every token's activation broadcast: 2 x G x NT FMAs
// per 2 x G conversions. F16: vcvtph2ps of 16 bytes; the activations are the f16-rounded
// f32 scratch. BF16: a 32-byte load holds 8 rows x columns (k, k+1) as u16 pairs, whose
// f32 values are the pair shifted left by 16 (column k) and masked to its high half
// (column k+1); the activations are bf16 pairs, widened the same way. Tiles keep every
// accumulator in the 16 ymm registers: a decode token runs 3 groups (F16; 2 for BF16) for
// 6 (4) independent FMA chains; batches run one group x up to 6 (F16) or 4 (BF16)
// tokens, so each weight conversion serves 12 (8) FMAs.
constexpr int kFloatGroups = 3;
constexpr int64_t kFloatPrefetchCols = 64;  // 2 KiB ahead per group stream

// Stores acc (rows [row0, row0 + 8) of the tile's first group) for NT tokens; rows at or
// past p.nr are left untouched.
template <int NT>
__attribute__((always_inline)) inline void StoreRows8(const PackedArgs& p, int row0, const __m256 (&acc)[NT]) {
  alignas(32) static constexpr int32_t kLane[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(p.nr - row0),
                                          _mm256_load_si256(reinterpret_cast<const __m256i*>(kLane)));
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) _mm256_maskstore_ps(p.y + t * p.y_stride + row0, mask, acc[t]);
}

// Groups [g0, g0 + G) of the tile x NT tokens.
template <bool kBf16, int G, int NT>
void TileFloat(const PackedArgs& p, int g0) {
  const uint16_t* w[G];
  TRELLIS_UNROLL
  for (int g = 0; g < G; ++g) w[g] = reinterpret_cast<const uint16_t*>(p.g + (g0 + g) * p.group_bytes);
  const uint8_t* x[NT];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) x[t] = p.a + t * p.a_stride;
  __m256 acc[G][2][NT];
  TRELLIS_UNROLL
  for (int g = 0; g < G; ++g)
    TRELLIS_UNROLL
    for (int hh = 0; hh < 2; ++hh)
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) acc[g][hh][t] = _mm256_setzero_ps();
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t k = 0; k < p.cols; k += 2) {
#pragma GCC unroll 3
    for (int g = 0; g < G; ++g) _mm_prefetch(reinterpret_cast<const char*>(w[g] + 16 * (k + kFloatPrefetchCols)), _MM_HINT_T0);
    if constexpr (kBf16) {
      __m256 w0[G][2], w1[G][2];
#pragma GCC unroll 3
      for (int g = 0; g < G; ++g) {
        TRELLIS_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
          const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[g] + 16 * k + 16 * hh));
          w0[g][hh] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
          w1[g][hh] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        }
      }
#pragma GCC unroll 6
      for (int t = 0; t < NT; ++t) {
        const __m256i pair = _mm256_set1_epi32(Load32(x[t] + 2 * k));
        const __m256 x0 = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
        const __m256 x1 = _mm256_castsi256_ps(_mm256_and_si256(pair, high));
#pragma GCC unroll 3
        for (int g = 0; g < G; ++g) {
          TRELLIS_UNROLL
          for (int hh = 0; hh < 2; ++hh) {
            acc[g][hh][t] = _mm256_fmadd_ps(w0[g][hh], x0, acc[g][hh][t]);
            acc[g][hh][t] = _mm256_fmadd_ps(w1[g][hh], x1, acc[g][hh][t]);
          }
        }
      }
    } else {
#pragma GCC unroll 2
      for (int kk = 0; kk < 2; ++kk) {
        __m256 wv[G][2];
#pragma GCC unroll 3
        for (int g = 0; g < G; ++g) {
          TRELLIS_UNROLL
          for (int hh = 0; hh < 2; ++hh) {
            wv[g][hh] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(w[g] + 16 * (k + kk) + 8 * hh)));
          }
        }
#pragma GCC unroll 6
        for (int t = 0; t < NT; ++t) {
          const __m256 xv = _mm256_broadcast_ss(reinterpret_cast<const float*>(x[t]) + k + kk);
#pragma GCC unroll 3
          for (int g = 0; g < G; ++g) {
            TRELLIS_UNROLL
            for (int hh = 0; hh < 2; ++hh) acc[g][hh][t] = _mm256_fmadd_ps(wv[g][hh], xv, acc[g][hh][t]);
          }
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int g = 0; g < G; ++g) {
    TRELLIS_UNROLL
    for (int hh = 0; hh < 2; ++hh) StoreRows8(p, kPackRows * (g0 + g) + 8 * hh, acc[g][hh]);
  }
}

// Groups per tile for a chunk of nt tokens (the register budget above), and the largest chunk.
constexpr int FloatMaxGroups(bool bf16, int nt) { return nt == 1 ? (bf16 ? 2 : 3) : (nt == 2 && !bf16 ? 2 : 1); }
constexpr int FloatMaxTokens(bool bf16) { return bf16 ? 4 : 6; }

template <bool kBf16, int G, int NT>
constexpr void (*FloatTileOrNull())(const PackedArgs&, int) {
  if constexpr (NT <= FloatMaxTokens(kBf16) && G <= FloatMaxGroups(kBf16, NT)) {
    return TileFloat<kBf16, G, NT>;
  } else {
    return nullptr;
  }
}

template <bool kBf16>
struct FloatTiles {
  using Fn = void (*)(const PackedArgs&, int);
  static constexpr int kMaxTokens = FloatMaxTokens(kBf16);
  static constexpr Fn kFns[3][6] = {
      {FloatTileOrNull<kBf16, 1, 1>(), FloatTileOrNull<kBf16, 1, 2>(), FloatTileOrNull<kBf16, 1, 3>(),
       FloatTileOrNull<kBf16, 1, 4>(), FloatTileOrNull<kBf16, 1, 5>(), FloatTileOrNull<kBf16, 1, 6>()},
      {FloatTileOrNull<kBf16, 2, 1>(), FloatTileOrNull<kBf16, 2, 2>(), nullptr, nullptr, nullptr, nullptr},
      {FloatTileOrNull<kBf16, 3, 1>(), nullptr, nullptr, nullptr, nullptr, nullptr}};
};

// The driver hands up to kFloatGroups groups x kPackedMaxTokens tokens: chunks of tokens
// (the largest first: F16 8 as 6 + 2 ran prefill 4 % faster than 4 + 4, its 12 FMA chains
// per tile hiding more latency), each over the groups in tiles the chunk's size allows.
template <bool kBf16>
void DispatchFloat(const PackedArgs& p) {
  using T = FloatTiles<kBf16>;
  PackedArgs q = p;
  for (int t0 = 0; t0 < p.nt;) {
    int nt = p.nt - t0;
    if (nt > T::kMaxTokens) nt = T::kMaxTokens;
    q.a = p.a + t0 * p.a_stride;
    q.y = p.y + t0 * p.y_stride;
    const int gmax = FloatMaxGroups(kBf16, nt);
    for (int g0 = 0; g0 < p.ng;) {
      const int ng = std::min(gmax, p.ng - g0);
      T::kFns[ng - 1][nt - 1](q, g0);
      g0 += ng;
    }
    t0 += nt;
  }
}

}  // namespace

// The packed kernel for `type` built by the including file ({} if none).
inline PackedKernel PackedKernelAvx2Family(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {DispatchHalves<Q32Half<GgmlType::kQ4_0>::Of>, 1};
    case GgmlType::kQ4_K: return {DispatchHalves<Q4_KHalf>, 1};
    case GgmlType::kQ5_K: return {DispatchHalves<Q5_KHalf>, 1};
    case GgmlType::kQ6_K: return {DispatchHalves<Q6_KHalf>, 1};
    case GgmlType::kQ8_0: return {DispatchHalves<Q8_0Half>, 1};
    case GgmlType::kQ5_0: return {DispatchHalves<Q32Half<GgmlType::kQ5_0>::Of>, 1};
    case GgmlType::kQ5_1: return {DispatchHalves<Q32Half<GgmlType::kQ5_1>::Of>, 1};
    case GgmlType::kIQ4_NL: return {DispatchHalves<Q32Half<GgmlType::kIQ4_NL>::Of>, 1};
    case GgmlType::kIQ4_XS: return {DispatchHalves<IQ4_XSHalf>, 1};
    case GgmlType::kQ2_K: return {DispatchHalves<LowKHalf<false>::Of>, 1};
    case GgmlType::kQ3_K: return {DispatchHalves<LowKHalf<true>::Of>, 1};
    case GgmlType::kF16: return {DispatchFloat<false>, kFloatGroups};
    case GgmlType::kBF16: return {DispatchFloat<true>, kFloatGroups};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

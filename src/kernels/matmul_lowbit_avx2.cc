// AVX2 tile kernels for the low-bit types Trellis reads but does not write: Q5_0, Q5_1,
// IQ4_NL (32-element blocks, Q8_0 activations) and Q2_K, Q3_K, IQ4_XS (256-element
// blocks, Q8_K activations). Layouts and the tile contract: matmul_internal.h; the values
// are those of the element accessors in quant.h, which the scalar kernels use.
//
// Each block is unpacked to int8 lanes in registers, then multiplied as llama.cpp's kinds
// of kernel do: maddubs of the unsigned weights (Q5_1, Q2_K) with the signed activations,
// or maddubs(|w|, sign(a, w)) for signed weights (Q5_0, IQ4_NL, Q3_K, IQ4_XS), vpmaddwd
// with the group scales, int32 accumulation per block, one f32 FMA per block and token.
//   Q5_0 / Q5_1: the 5th bits (32 bits of qh) are spread to bytes with a byte shuffle of
//     qh and a per-lane bit mask; IQ4_NL / IQ4_XS: the nibbles index the 16-entry grid
//     with pshufb.
//   Q2_K / Q3_K: 32 bytes of qs hold 4 x 32 elements at shifts 0, 2, 4, 6; Q3_K's third
//     bit comes from hmask the same way (bit k / 32 of hmask[k % 32]).
// Tiles: NR rows x NT tokens for the 32-element types (as Q4_0's), 1 row x NT tokens for
// the 256-element ones (as Q4_K's).
//
// Thread safety: pure functions.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/matmul_avx2_inl.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "kernels/unroll.h"

namespace trellis::matmul_internal {
namespace {

using avx2::Hsum;
using avx2::Load128;
using avx2::Load256;

inline float F16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 bytes, byte k = 0xFF where bit k of the 32 bits at p is set.
inline __m256i BitsToBytes(const void* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                             _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                               0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// 32 nibbles of 16 bytes: low nibbles to lanes 0..15, high to 16..31 (the order of Q4_0,
// Q5_x and IQ4 blocks).
inline __m256i Nibbles(const void* p) {
  const __m128i q = Load128(p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

inline __m256i Iq4Grid() {
  const __m128i t = Load128(kIq4NlValues);
  return _mm256_set_m128i(t, t);
}

// Sum of the 16 int16 pairs-products of signed w and signed a, as 8 int32.
inline __m256i DotSigned(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

// ---- 32-element blocks (Q8_0 activations) -----------------------------------------------

template <GgmlType kType, int NR, int NT>
void TileBlock32(const TileArgs& p) {
  constexpr int64_t kBytes = kType == GgmlType::kQ5_0 ? 22 : kType == GgmlType::kQ5_1 ? 24 : 18;
  const int64_t nb = p.cols / 32;
  const __m256i grid = Iq4Grid();
  const __m256i x10 = _mm256_set1_epi8(0x10);
  __m256 acc[NR][NT];
  TRELLIS_UNROLL
  for (int r = 0; r < NR; ++r) {
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const int64_t sum_off = Q8_0SumOffset(p.cols);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i av[NT];
    float da[NT], dsum[NT];
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = p.a + t * p.a_stride;
      av[t] = Load256(a + 32 * b);
      da[t] = reinterpret_cast<const float*>(a + p.cols)[b];
      dsum[t] = da[t] * static_cast<float>(reinterpret_cast<const int32_t*>(a + sum_off)[b]);
    }
    TRELLIS_UNROLL
    for (int r = 0; r < NR; ++r) {
      const uint8_t* w = p.w + r * p.w_stride + kBytes * b;
      const float dw = F16(w);
      __m256i wv;
      if constexpr (kType == GgmlType::kIQ4_NL) {
        wv = _mm256_shuffle_epi8(grid, Nibbles(w + 2));
      } else {
        constexpr int kQh = kType == GgmlType::kQ5_0 ? 2 : 4;
        wv = _mm256_or_si256(Nibbles(w + kQh + 4), _mm256_and_si256(BitsToBytes(w + kQh), x10));
      }
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        if constexpr (kType == GgmlType::kQ5_1) {
          // Unsigned 0..31: dw da sum q a + m da sum a.
          const __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av[t]), _mm256_set1_epi16(1));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * da[t]), acc[r][t]);
          acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_setr_ps(F16(w + 2) * dsum[t], 0, 0, 0, 0, 0, 0, 0));
        } else {
          __m256i wsigned = wv;
          if constexpr (kType == GgmlType::kQ5_0) wsigned = _mm256_sub_epi8(wv, x10);
          const __m256i isum = DotSigned(wsigned, av[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * da[t]), acc[r][t]);
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    TRELLIS_UNROLL
    for (int r = 0; r < NR; ++r) p.y[t * p.y_stride + r] = Hsum(acc[r][t]);
  }
}

// ---- 256-element blocks (Q8_K activations) -----------------------------------------------

// Scales of two 16-element groups as the 16 int16 lanes of a vpmaddwd operand: lanes 0..7
// (elements 0..15 of a 32-lane maddubs result) take s0, lanes 8..15 take s1.
inline __m256i PairScales(int s0, int s1) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
}

template <GgmlType kType, int NT>
void TileBlock256(const TileArgs& p) {
  const int64_t nb = p.cols / kQkK;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i grid = Iq4Grid();
  __m256 acc[NT];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

  for (int64_t b = 0; b < nb; ++b) {
    __m256i iacc[NT];
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) iacc[t] = _mm256_setzero_si256();
    float dw = 0;
    [[maybe_unused]] float dmin = 0;
    if constexpr (kType == GgmlType::kQ2_K || kType == GgmlType::kQ3_K) {
      const auto* x = reinterpret_cast<const std::conditional_t<kType == GgmlType::kQ2_K, BlockQ2_K, BlockQ3_K>*>(
          p.w + b * static_cast<int64_t>(sizeof(std::conditional_t<kType == GgmlType::kQ2_K, BlockQ2_K, BlockQ3_K>)));
      dw = F16(&x->d);
      int sc[16];
      if constexpr (kType == GgmlType::kQ2_K) {
        dmin = F16(&x->dmin);
        for (int g = 0; g < 16; ++g) sc[g] = x->scales[g] & 0xF;
      } else {
        for (int g = 0; g < 16; ++g) sc[g] = Q3KScale(*x, g);
      }
      [[maybe_unused]] __m256i hm = _mm256_setzero_si256();
      if constexpr (kType == GgmlType::kQ3_K) hm = Load256(x->hmask);
      TRELLIS_UNROLL
      for (int n = 0; n < 2; ++n) {
        const __m256i q = Load256(x->qs + 32 * n);
        TRELLIS_UNROLL
        for (int j = 0; j < 4; ++j) {
          // Elements 128 n + 32 j + l, l = 0..31: groups 8 n + 2 j and 8 n + 2 j + 1.
          __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
          const __m256i s = PairScales(sc[8 * n + 2 * j], sc[8 * n + 2 * j + 1]);
          if constexpr (kType == GgmlType::kQ3_K) {
            const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * n + j)));
            const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
            v = _mm256_sub_epi8(v, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
          }
          TRELLIS_UNROLL
          for (int t = 0; t < NT; ++t) {
            const __m256i a = Load256(p.a + t * p.a_stride + kQkK * b + 128 * n + 32 * j);
            __m256i p16;
            if constexpr (kType == GgmlType::kQ2_K) {
              p16 = _mm256_maddubs_epi16(v, a);
            } else {
              p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
            }
            iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p16, s));
          }
        }
      }
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        const uint8_t* a = p.a + t * p.a_stride;
        const float da = reinterpret_cast<const float*>(a + p.cols)[b];
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(dw * da), acc[t]);
        if constexpr (kType == GgmlType::kQ2_K) {
          // - dmin da sum_g m_g bsum_g
          const int16_t* bs = reinterpret_cast<const int16_t*>(a + Q8KBsumsOffset(p.cols)) + 16 * b;
          alignas(32) int16_t mins[16];
          for (int g = 0; g < 16; ++g) mins[g] = static_cast<int16_t>(x->scales[g] >> 4);
          const __m256i msum = _mm256_madd_epi16(Load256(bs), _mm256_load_si256(reinterpret_cast<const __m256i*>(mins)));
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(-dmin * da), acc[t]);
        }
      }
    } else {  // IQ4_XS: 8 sub-blocks of 32
      const BlockIQ4_XS& x = reinterpret_cast<const BlockIQ4_XS*>(p.w)[b];
      dw = F16(&x.d);
      TRELLIS_UNROLL
      for (int j = 0; j < 8; ++j) {
        const __m256i v = _mm256_shuffle_epi8(grid, Nibbles(x.qs + 16 * j));
        const __m256i s = _mm256_set1_epi16(static_cast<int16_t>(IQ4XsScale(x, j)));
        const __m256i wabs = _mm256_sign_epi8(v, v);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) {
          const __m256i a = Load256(p.a + t * p.a_stride + kQkK * b + 32 * j);
          iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, v)), s));
        }
      }
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        const float da = reinterpret_cast<const float*>(p.a + t * p.a_stride + p.cols)[b];
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(dw * da), acc[t]);
      }
    }
  }
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) p.y[t * p.y_stride] = Hsum(acc[t]);
}

template <GgmlType kType>
void Dispatch32(const TileArgs& p) {
  static constexpr TileFn kTable[4][2] = {{TileBlock32<kType, 1, 1>, TileBlock32<kType, 1, 2>},
                                          {TileBlock32<kType, 2, 1>, TileBlock32<kType, 2, 2>},
                                          {TileBlock32<kType, 3, 1>, TileBlock32<kType, 3, 2>},
                                          {TileBlock32<kType, 4, 1>, TileBlock32<kType, 4, 2>}};
  kTable[p.nr - 1][p.nt - 1](p);
}

template <GgmlType kType>
void Dispatch256(const TileArgs& p) {
  static constexpr TileFn kTable[4] = {TileBlock256<kType, 1>, TileBlock256<kType, 2>, TileBlock256<kType, 3>,
                                       TileBlock256<kType, 4>};
  kTable[p.nt - 1](p);
}

}  // namespace

TileKernel GetTileKernelLowbitAvx2(GgmlType type, int64_t n_tokens) {
  const int rows = n_tokens <= kGemvMaxTokens ? 1 : 4;
  switch (type) {
    case GgmlType::kQ5_0: return {Dispatch32<GgmlType::kQ5_0>, rows, 2};
    case GgmlType::kQ5_1: return {Dispatch32<GgmlType::kQ5_1>, rows, 2};
    case GgmlType::kIQ4_NL: return {Dispatch32<GgmlType::kIQ4_NL>, rows, 2};
    case GgmlType::kQ2_K: return {Dispatch256<GgmlType::kQ2_K>, 1, 4};
    case GgmlType::kQ3_K: return {Dispatch256<GgmlType::kQ3_K>, 1, 4};
    case GgmlType::kIQ4_XS: return {Dispatch256<GgmlType::kIQ4_XS>, 1, 4};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

// AVX-512 kernels over the x16 packed layouts (packed.h): VNNI for Q4_0 / Q5_0 / Q5_1 /
// Q8_0 / IQ4_NL / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS, FMA for F16, AVX512-BF16 for
// BF16.
//
// Per 32-element block and token: 8 vpdpbusd, each taking one packed zmm (4 unsigned
// weight bytes of 16 rows) and 4 activation bytes broadcast to all lanes, into an int32
// accumulator that starts at the weight offset's correction -offset * sum(a_block)
// (weights are stored unsigned: Q4_0 as e = q + 8, Q8_0 as q + 128). Then one convert and
// one FMA apply dw[16 rows] * da[token]. Q4_0 nibbles are split with one shift and two ands
// per 64 bytes, shared by all tokens of the tile. A tile is 16 rows x up to 8 tokens:
// 8 int32 + 8 f32 accumulators stay in registers; over weights an earlier tile has just
// read (prefill), the 32-element block types take 32 rows x 4 tokens at a time instead,
// each activation dword loaded once for two groups (TilePackedGroups). Those types read
// tiled activations (matmul_internal.h): one pointer per block reaches every token's
// bytes, scale and sum.
//
// Measured on Zen 4 (one thread, 5632 x 2048 Q4_0, 512 tokens): ~550 GOP/s, against
// ~250 for the row-major 3x4 tiles; from DRAM, one token streams at the bandwidth.
//
// Thread safety: pure functions.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/packed.h"
#include "kernels/quant.h"

namespace trellis::matmul_internal {
namespace {

// Stores acc[t] (16 rows of group g of the tile) to y, rows past p.nr left untouched.
template <int NT>
__attribute__((always_inline)) inline void StoreRows(const PackedArgs& p, int g, const __m512 (&acc)[NT]) {
  const int rows = std::clamp(p.nr - 16 * g, 0, 16);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(p.y + t * p.y_stride + 16 * g, mask, acc[t]);
}

// How far ahead of the current line to prefetch. 1 KiB was best on Zen 4 with the row
// activation layout; with tiled activations the Q4_0 / Q8_0 tiles run faster and 2 KiB
// is better on Zen 5 (`bench speed -t 2 -p 0 -n 32 -r 2 -s 8`, TinyLlama shape, medians
// of 4 alternating rounds: Q4_0 tg 58.9 -> 63.4, 8 sessions 272 -> 290 tok/s; Q8_0 30.1 ->
// 32.5 and 174 -> 188; Q4_K_M 54.1 -> 64.4 and 177 -> 203; pp512 422 vs 415, noise; 4 KiB
// no better than 2).
constexpr int64_t kPrefetchBytes = 2048;

// Tiles of several tokens (batched decode) also prefetch 8 KiB ahead into L2
// (PrefetchWeights, matmul_internal.h). `bench speed -t 2 -p 0 -n 32 -r 1 -s 8`, TinyLlama
// shape, 6-8 alternating rounds, medians: 8 sessions Q4_0 350 -> 373 tok/s, Q4_K_M 249 ->
// 313, Q8_0 205 -> 222; pp512 (also 8-token tiles, weights from L2) 502 -> 508, noise;
// 4 KiB as good as 8, 16 KiB less. One-token tiles keep the L1 prefetch only: for them
// it did not help (Q4_0 1.01x) or cost (Q8_0 0.96x).

// iacc += w (unsigned bytes) . the 4 signed activation bytes at a, broadcast to all 16
// lanes. GCC 12 does not fold the broadcast into vpdpbusd's memory operand ({1to16}) and
// emits a vpbroadcastd before every vpdpbusd, one extra instruction per dot; clang folds it.
// kFold: fold it by hand (inline asm). Faster for the tiles over tiled activations, Q6_K
// and Q2_K / Q3_K; slower for IQ4_XS (and Q4_K / Q5_K when they read row activations: with
// eight row pointers, 0.91-0.95x at 512 tokens, bench_kernels, 6 alternating rounds),
// which keeps the intrinsic.
template <bool kFold = true>
__attribute__((always_inline)) inline __m512i DpbusdBroadcast(__m512i iacc, __m512i w, const uint8_t* a) {
#if defined(__GNUC__) && !defined(__clang__)
  if constexpr (!kFold) return _mm512_dpbusd_epi32(iacc, w, _mm512_set1_epi32(Load32(a)));
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(iacc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(a)));
  return iacc;
#else
  return _mm512_dpbusd_epi32(iacc, w, _mm512_set1_epi32(Load32(a)));
#endif
}

// One 64-byte line of packed weights, loaded once. GCC 12 folds a plain load into every
// instruction that reads it (a 4-bit line into both the low- and the high-nibble and; a
// high-bit line into up to four shifts), so the tiles read each line two to four times;
// those extra zmm loads are the dear kind here (`bench roofline`'s broadcast rows). Behind
// an asm the value is loaded once: the one-group Q4_0 tile ran 1.07-1.10x (in-process A/B,
// one thread, weights in L2 or streaming); bench_kernels at 8 and 512 tokens, one thread,
// 4 alternating rounds: q5_K 1.11x, q6_K 1.08-1.11x, q4_K / iq4_xs / q3_K 1.04-1.05x,
// q5_0 1.03-1.14x, iq4_nl 1.06-1.09x, q4_0 1.00-1.05x. Tiles of one or two tokens keep
// the plain load: single-token decode of TinyLlama Q4_K_M (Q4_K and Q6_K tiles, weights
// from DRAM) ran 0.92-0.93x with the asm (`bench/ab.py`, 4 and 6 rounds); so do the
// 32-element block types' tiles over weights on their way from memory (TilePackedGroups
// with prefetches: 8 sessions decoding Q4_0 read 0.95x in 6 rounds with the asm), where
// the K-quants' 8-token tiles gained (Q4_K_M 8 sessions 1.10x).
template <int NT>
__attribute__((always_inline)) inline __m512i LoadLine(const uint8_t* p) {
  if constexpr (NT <= 2) return _mm512_load_si512(p);
  __m512i v;
  __asm__("vmovdqa64 %1, %0" : "=v"(v) : "m"(*reinterpret_cast<const __m512i*>(p)));
  return v;
}

// One 32-element block of 4-bit x16 weights (4 lines at wb, packed.h) against NT tokens'
// activation bytes: iacc[t] (16 rows) += sum of map(e) * a, token t's bytes 8i..8i+7 of
// the block at act(t, i). The nibbles are split (and mapped) once per line and shared by
// all tokens; map is the identity for Q4_0 / Q4_K, the grid lookup for IQ4_NL.
struct Nibbles {
  __m512i operator()(__m512i e) const { return e; }
};
template <int NT, bool kFold = true, typename Act, typename Map = Nibbles>
__attribute__((always_inline)) inline void DotNibbleBlock(const uint8_t* wb, Act act, __m512i (&iacc)[NT],
                                                          Map map = {}) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    PrefetchWeights<NT, kPrefetchBytes>(wb + 64 * i);
    const __m512i packed = LoadLine<NT>(wb + 64 * i);
    const __m512i lo = map(_mm512_and_si512(packed, m4));
    const __m512i hi = map(_mm512_and_si512(_mm512_srli_epi16(packed, 4), m4));
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = act(t, i);
      iacc[t] = DpbusdBroadcast<kFold>(iacc[t], lo, a);
      iacc[t] = DpbusdBroadcast<kFold>(iacc[t], hi, a + 4);
    }
  }
}

// IQ4_NL's grid plus 128 (1..241, unsigned), indexed by a nibble in every byte: the
// weights as vpdpbusd's unsigned operand, corrected by -128 * sum(a).
struct Iq4Grid {
  __m512i grid;
  Iq4Grid() {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = static_cast<uint8_t>(kIq4NlValues[i] + 128);
    grid = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  __m512i operator()(__m512i e) const { return _mm512_shuffle_epi8(grid, e); }
};

// Bit `src` of every byte moved to bit 4 (other bits of the result are garbage).
template <int kSrc>
__attribute__((always_inline)) inline __m512i BitTo4(__m512i v) {
  if constexpr (kSrc < 4) return _mm512_slli_epi16(v, 4 - kSrc);
  else if constexpr (kSrc == 4) return v;
  else return _mm512_srli_epi16(v, kSrc - 4);
}

// A 5-bit block (4 nibble lines + the 5th-bit line at wb + 256, packed.h: Q5_0, Q5_1 and
// Q5_K's sub-blocks) against NT tokens: iacc[t] += sum of e * a, e in 0..31, token t's
// bytes 8i..8i+7 of the block at act(t, i).
template <int NT, bool kFold = true, typename Act>
__attribute__((always_inline)) inline void DotQ5Block(const uint8_t* wb, Act act, __m512i (&iacc)[NT]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m10 = _mm512_set1_epi8(0x10);
  PrefetchWeights<NT, kPrefetchBytes>(wb + 256);
  const __m512i high = LoadLine<NT>(wb + 256);
  auto line = [&](auto i_const) {
    constexpr int i = decltype(i_const)::value;
    PrefetchWeights<NT, kPrefetchBytes>(wb + 64 * i);
    const __m512i packed = LoadLine<NT>(wb + 64 * i);
    const __m512i lo = _mm512_or_si512(_mm512_and_si512(packed, m4), _mm512_and_si512(BitTo4<2 * i>(high), m10));
    const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed, 4), m4),
                                       _mm512_and_si512(BitTo4<2 * i + 1>(high), m10));
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = act(t, i);
      iacc[t] = DpbusdBroadcast<kFold>(iacc[t], lo, a);
      iacc[t] = DpbusdBroadcast<kFold>(iacc[t], hi, a + 4);
    }
  };
  line(std::integral_constant<int, 0>{});
  line(std::integral_constant<int, 1>{});
  line(std::integral_constant<int, 2>{});
  line(std::integral_constant<int, 3>{});
}

// Line i's two 16-row x 4-value vectors of a 4- or 5-bit block at wb (its 5th-bit line
// `high` loaded by the caller for Q5_0 / Q5_1): the low and the high nibbles, mapped
// through IQ4_NL's grid or given their 5th bits.
template <GgmlType kType, int kI, int kTokens>
__attribute__((always_inline)) inline void UnpackLine(const uint8_t* wb, __m512i high, const Iq4Grid& grid,
                                                      __m512i& lo, __m512i& hi) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i packed = LoadLine<kTokens>(wb + 64 * kI);
  lo = _mm512_and_si512(packed, m4);
  hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), m4);
  if constexpr (kType == GgmlType::kIQ4_NL) {
    lo = grid(lo);
    hi = grid(hi);
  } else if constexpr (kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1) {
    const __m512i m10 = _mm512_set1_epi8(0x10);
    lo = _mm512_or_si512(lo, _mm512_and_si512(BitTo4<2 * kI>(high), m10));
    hi = _mm512_or_si512(hi, _mm512_and_si512(BitTo4<2 * kI + 1>(high), m10));
  }
}

// iacc[g][t] += w[g] . token t's 4 activation bytes at a + 32 t, for G groups. One group
// folds the broadcast into vpdpbusd's memory operand; more load it once into a register
// that meets every group's weights.
template <int G, int NT>
__attribute__((always_inline)) inline void DotGroups(__m512i (&iacc)[G][NT], const __m512i (&w)[G], const uint8_t* a,
                                                     int t) {
  if constexpr (G == 1) {
    iacc[0][t] = DpbusdBroadcast(iacc[0][t], w[0], a);
  } else {
    const __m512i x = _mm512_set1_epi32(Load32(a));
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) iacc[g][t] = _mm512_dpbusd_epi32(iacc[g][t], w[g], x);
  }
}

// The 32-element block types against tiled activations (matmul_internal.h): per block,
// every operand a token needs is at a fixed offset from the block's pointer ab: its 32
// bytes at 32 t, its scale at 256 + 4 t, its accumulator start at 288 + 4 t (-offset *
// sum, TiledActOffset: the weights' unsigned bias; for Q5_1, whose weights have none, the
// sum itself, which its offset m multiplies).
//
// G groups (16 G rows) x NT tokens from slot t0 of the tile. With one group every
// vpdpbusd takes its activation dword as a broadcast memory operand, 64 loads a block
// beside 64 vpdpbusd, and they cost the dot products time: the one-group 8-token tile
// with them taken out (results wrong) ran 1.2-1.37x, and `bench roofline`'s loop of 16
// vpdpbusd whose dwords are broadcast from 4 lines, 2 zmm loads beside, runs 0.78-0.87x
// the loop with 8 register broadcasts used twice (Zen 5). Two groups x 4 tokens
// broadcast each dword into a register once for both groups: half those loads for the
// same dots (in-process A/B, 8 units x 9 tiles of 2048 columns, one thread: Q4_0
// 1.14-1.15x, Q8_0 1.28-1.43x).
// kPf = false: no software prefetch, for tiles whose weights the tile before them has
// just read (PackedArgs::cached).
template <GgmlType kType, int G, int NT, bool kPf = true>
__attribute__((always_inline)) inline void TilePackedGroups(const PackedArgs& p, int t0) {
  constexpr int kLines = PackedLines(kType);
  constexpr bool kMin = kType == GgmlType::kQ5_1;
  constexpr bool kQ5 = kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1;
  constexpr int64_t kD = 32 * kPackedMaxTokens, kCorr = 36 * kPackedMaxTokens;
  const uint8_t* qs[G];
  const uint16_t* scales[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    qs[g] = p.g + g * p.group_bytes;
    scales[g] = reinterpret_cast<const uint16_t*>(qs[g] + p.nb * 64 * kLines);
  }
  [[maybe_unused]] const Iq4Grid grid;
  __m512 acc[G][NT];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[g][t] = _mm512_setzero_ps();
  constexpr int64_t kScaleLead = kPrefetchBytes / (64 * kLines);  // blocks
  if constexpr (kPf) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      PrefetchScalesStart<kScaleLead>(scales[g]);
      if constexpr (kMin) PrefetchScalesStart<kScaleLead>(scales[g] + 16 * p.nb);
    }
  }
  for (int64_t b = 0; b < p.nb; ++b) {
    const uint8_t* wb[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) wb[g] = qs[g] + b * 64 * kLines;
    const uint8_t* ab = p.a + b * kTiledBlockBytes + 32 * t0;  // token t0's bytes
    const uint8_t* tail = p.a + b * kTiledBlockBytes + 4 * t0;  // + kD, kCorr: token t0's scale, start
    if constexpr (kPf) {
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) {
        PrefetchScales<kScaleLead>(scales[g], b);
        if constexpr (kMin) PrefetchScales<kScaleLead>(scales[g] + 16 * p.nb, b);
      }
    }
    __m512i iacc[G][NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512i start = kMin ? _mm512_setzero_si512() : _mm512_set1_epi32(Load32(tail + kCorr + 4 * t));
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) iacc[g][t] = start;
    }
    if constexpr (kType == GgmlType::kQ8_0) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512i w[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          PrefetchWeights<NT * G, kPrefetchBytes, kPf>(wb[g] + 64 * j);
          w[g] = _mm512_load_si512(wb[g] + 64 * j);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) DotGroups<G, NT>(iacc, w, ab + 32 * t + 4 * j, t);
      }
    } else {
      [[maybe_unused]] __m512i high[G];
      if constexpr (kQ5) {
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          PrefetchWeights<NT * G, kPrefetchBytes, kPf>(wb[g] + 256);
          high[g] = LoadLine<kPf ? 1 : G * NT>(wb[g] + 256);
        }
      }
      auto line = [&](auto i_const) {
        constexpr int i = decltype(i_const)::value;
        __m512i lo[G], hi[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          PrefetchWeights<NT * G, kPrefetchBytes, kPf>(wb[g] + 64 * i);
          UnpackLine<kType, i, kPf ? 1 : G * NT>(wb[g], kQ5 ? high[g] : _mm512_setzero_si512(), grid, lo[g], hi[g]);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          DotGroups<G, NT>(iacc, lo, ab + 32 * t + 8 * i, t);
          DotGroups<G, NT>(iacc, hi, ab + 32 * t + 8 * i + 4, t);
        }
      };
      line(std::integral_constant<int, 0>{});
      line(std::integral_constant<int, 1>{});
      line(std::integral_constant<int, 2>{});
      line(std::integral_constant<int, 3>{});
    }
    const float* da = reinterpret_cast<const float*>(tail + kD);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales[g] + 16 * b)));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[g][t]), _mm512_mul_ps(dw, _mm512_set1_ps(da[t])), acc[g][t]);
      }
      if constexpr (kMin) {  // + m[rows] * (da * sum)[t]
        const __m512 mw =
            _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales[g] + 16 * p.nb + 16 * b)));
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const float dsum = da[t] * static_cast<float>(Load32(tail + kCorr + 4 * t));
          acc[g][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(dsum), acc[g][t]);
        }
      }
    }
  }
  PackedArgs q = p;
  q.y = p.y + t0 * p.y_stride;
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) StoreRows(q, g, acc[g]);
}

// One group, the tile's NT tokens.
template <GgmlType kType, int NT, bool kPf = true>
void TilePacked(const PackedArgs& p) {
  TilePackedGroups<kType, 1, NT, kPf>(p, 0);
}

// Two groups x a full tile of 8 tokens over cached weights (PackedArgs::cached), in two
// passes of 4.
template <GgmlType kType>
void TilePacked2x8(const PackedArgs& p) {
  static_assert(kPackedMaxTokens == 8);
  TilePackedGroups<kType, 2, 4, false>(p, 0);
  TilePackedGroups<kType, 2, 4, false>(p, 4);
}

// Tiled Q8_K activations (matmul_internal.h): a block's per-token scale and its int16
// pair of 16-value sums, at these offsets from the block.
constexpr int64_t kTiledD = 32 * kPackedMaxTokens, kTiledPair = 36 * kPackedMaxTokens;

// The int16 pair (low half of lo, low half of hi) in every lane: vpdpwssd's operand.
__attribute__((always_inline)) inline __m512i Int16Pairs(__m512i lo, __m512i hi) {
  return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(hi, 16));
}

// Per row, the sum over a super-block's 8 blocks of pairs[j] (int16 pairs per row) . the
// pair of token t's two 16-value sums of block j; `as` is the super-block's first tiled
// block. The K-quant tiles' offsets and mins, once per super-block.
__attribute__((always_inline)) inline __m512i BlockSumsDot(const __m512i (&pairs)[8], const uint8_t* as, int t) {
  __m512i r = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    r = _mm512_dpwssd_epi32(r, pairs[j], _mm512_set1_epi32(Load32(as + j * kTiledBlockBytes + kTiledPair + 4 * t)));
  }
  return r;
}

// Per token, the int16 pairs (S_2i, S_2i+1) of a super-block's full 32-value block sums,
// i = 0..3, from the tiled blocks' (lo16, hi16) pairs at `as` (tokens past nt read as 0):
// against the rows' (x_2i, x_2i+1) pairs one vpdpwssd covers two blocks, where the
// per-16 pairs take one each. Free of the vector multiply pipes (adds, shifts, blends).
template <int NT>
__attribute__((always_inline)) inline void FullBlockSumPairs(const uint8_t* as, uint32_t (&out)[4][8]) {
  constexpr __mmask8 kLive = static_cast<__mmask8>((1u << NT) - 1);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m256i p0 = _mm256_maskz_loadu_epi32(kLive, as + 2 * i * kTiledBlockBytes + kTiledPair);
    const __m256i p1 = _mm256_maskz_loadu_epi32(kLive, as + (2 * i + 1) * kTiledBlockBytes + kTiledPair);
    const __m256i s0 = _mm256_add_epi16(p0, _mm256_srli_epi32(p0, 16));  // low half: lo + hi (|.| <= 4064)
    const __m256i s1 = _mm256_add_epi16(p1, _mm256_srli_epi32(p1, 16));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out[i]), _mm256_blend_epi16(s0, _mm256_slli_epi32(s1, 16), 0xAA));
  }
}

// r += pairs (int16 pairs of 16 rows) . the int16 pair at a, broadcast; folded by hand as
// DpbusdBroadcast.
__attribute__((always_inline)) inline __m512i DpwssdBroadcast(__m512i r, __m512i pairs, const uint32_t* a) {
#if defined(__GNUC__) && !defined(__clang__)
  __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(r) : "v"(pairs), "m"(*a));
  return r;
#else
  return _mm512_dpwssd_epi32(r, pairs, _mm512_set1_epi32(static_cast<int32_t>(*a)));
#endif
}

// Per row, the sum over a super-block's 8 blocks of x_j (16 rows, x2[i] = (x_2i, x_2i+1)
// int16 pairs) times token t's full block sums (FullBlockSumPairs): 4 vpdpwssd.
__attribute__((always_inline)) inline __m512i FullBlockSumsDot(const __m512i (&x2)[4], const uint32_t (&sums)[4][8], int t) {
  __m512i r = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) r = DpwssdBroadcast(r, x2[i], &sums[i][t]);
  return r;
}

// The row pointers of a K-quant tile's Q8_K activations (Q8KTokens), or nothing for a
// tile over tiled activations, whose one pointer is p.a.
struct NoRowTokens {
  explicit NoRowTokens(const PackedArgs&) {}
};
template <bool kTiled, int NT>
using RowTokens = std::conditional_t<kTiled, NoRowTokens, Q8KTokens<NT>>;

// acc + f(isum) * d[rows] * da.
__attribute__((always_inline)) inline __m512 AddScaled(__m512 acc, __m512i isum, __m512 d, float da) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(da)), acc);
}

// The end of a super-block over tiled activations whose weights are stored with an
// unsigned offset: acc[t] += f(isum[t] - (BlockSumsDot(pairs) << kShift)) * d * da[t].
template <int kShift, int NT>
__attribute__((always_inline)) inline void AddOffsetSuperBlock(__m512 (&acc)[NT], const __m512i (&isum)[NT],
                                                               const __m512i (&pairs)[8], __m512 d, const uint8_t* as) {
  const float* da = reinterpret_cast<const float*>(as + kTiledD);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    acc[t] = AddScaled(acc[t], _mm512_sub_epi32(isum[t], _mm512_slli_epi32(BlockSumsDot(pairs, as, t), kShift)), d, da[t]);
  }
}

// Q4_K: per 32-element sub-block the same 8 dots as Q4_0 (weights 0..15, no offset) into
// iacc, then the sub-block's 6-bit scales multiply it in int32 into the super-block's sum
// (|sum| < 2^26 for Q4_K, 2^27 for Q5_K), and once per super-block
// acc += da[t] * (f(isum) * d - f(msum) * dmin), where msum = sum of the 6-bit mins m_j
// times the blocks' activation sums, one vpdpwssd of (m_2i, m_2i+1) int16 pairs against
// two blocks' full sums (FullBlockSumPairs). That is llama.cpp's own order (integers within a
// super-block, one scale per super-block), and per token and sub-block one vpmulld + add
// instead of a convert, a multiply and two FMAs: the scale step shares the vector ports
// with vpdpbusd (docs/ROOFLINE.md). Activations are tiled Q8_K (matmul_internal.h), so one
// pointer reaches every token's bytes, scale and bsum pair and the broadcasts fold into
// vpdpbusd.
template <bool kQ5, int NT>
void TilePackedQ4_K(const PackedArgs& p) {
  const int64_t nsb = p.cols / 256;
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    constexpr int64_t kSub = kQ5 ? 320 : 256;  // bytes per sub-block
    const uint8_t* sb = p.g + s * (kQ5 ? kPackedQ5KSuperBytes : kPackedQ4KSuperBytes);
    const uint8_t* sc = sb + 8 * kSub + 64;
    const uint8_t* mins = sc + 128;
    const uint8_t* as = p.a + 8 * s * kTiledBlockBytes;  // the super-block's first activation block
    alignas(32) uint32_t sums[4][8];
    FullBlockSumPairs<NT>(as, sums);
    __m512i isum[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* wb = sb + kSub * j;
      const uint8_t* ab = as + j * kTiledBlockBytes;
      __m512i iacc[NT];
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) iacc[t] = _mm512_setzero_si512();
      if constexpr (kQ5) {
        DotQ5Block<NT>(wb, [ab](int t, int i) { return ab + 32 * t + 8 * i; }, iacc);
      } else {
        DotNibbleBlock<NT>(wb, [ab](int t, int i) { return ab + 32 * t + 8 * i; }, iacc);
      }
      const __m512i scale = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * j)));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(iacc[t], scale));
    }
    __m512i m2[4];  // rows' (m_2i, m_2i+1) as int16 pairs, against the blocks' full sums
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      m2[i] = Int16Pairs(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(mins + 32 * i))),
                         _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(mins + 32 * i + 16))));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb + 8 * kSub)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb + 8 * kSub + 32)));
    const float* da = reinterpret_cast<const float*>(as + kTiledD);
    // acc += da * (f(isum) * d - f(msum) * dmin): three multiply-pipe ops a token, not four.
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512i msum = FullBlockSumsDot(m2, sums, t);
      const __m512 rows = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), dmin, _mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), d));
      acc[t] = _mm512_fmadd_ps(rows, _mm512_set1_ps(da[t]), acc[t]);
    }
  }
  StoreRows(p, 0, acc);
}

// Q6_K: per group of 16 elements, 4 vpdpbusd of the 6-bit weights (nibble | high pair
// << 4, stored unsigned as q + 32, unpacked once per tile); the group's int8 scale
// multiplies in int32 (|sum| < 2^29 over a super-block), and one convert + FMA per
// super-block applies d[rows] * da[t].
// kTiled (tiled Q8_K activations, matmul_internal.h): one pointer reaches every token's
// bytes, so the broadcasts fold into vpdpbusd, and the weights' offset comes off once per
// super-block as 32 x the scales times the groups' activation sums: 8 vpdpwssd of
// (sc_2j, sc_2j+1) int16 pairs against each block's pair of 16-value sums. With row
// activations the tile carried 8 row and 8 bias pointers, more than the general
// registers: 0.8x at 8-512 tokens. Rows (PackedKernel::row_fn, one or two tokens): each
// group starts at -32 x its sum (the row's bias16), with no pairs to build per tile; from
// DRAM one token ran 0.9x tiled (bench_kernels dram/q6_K/tokens:1, one thread).
template <int NT, bool kTiled>
void TilePackedQ6_K(const PackedArgs& p) {
  const RowTokens<kTiled, NT> tok(p);
  const int64_t nsb = p.cols / 256;
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedQ6KSuperBytes;
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 8 * 384);
    const uint8_t* as = p.a + 8 * s * kTiledBlockBytes;  // tiled: the super-block's first block
    __m512i isum[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* bl = sb + 384 * j;
      const uint8_t* ab = as + j * kTiledBlockBytes;
#pragma GCC unroll 6
      for (int line = 0; line < 6; ++line) {
        PrefetchWeights<NT, kPrefetchBytes>(bl + 64 * line);
      }
#pragma GCC unroll 2
      for (int x = 0; x < 2; ++x) {
        const __m512i l0 = LoadLine<NT>(bl + 128 * x);
        const __m512i l1 = LoadLine<NT>(bl + 128 * x + 64);
        const __m512i h = LoadLine<NT>(bl + 256 + 64 * x);
        const __m512i w0 = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
        const __m512i w1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
                                           _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
        const __m512i w2 = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
        const __m512i w3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
        const int grp = 2 * j + x;  // group in the super-block: bytes 16 x of block j
        const __m512i scale = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * grp)));
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const uint8_t* a;
          __m512i g;
          if constexpr (kTiled) {
            a = ab + 32 * t + 16 * x;
            g = _mm512_setzero_si512();
          } else {
            a = tok.q[t] + 256 * s + 16 * grp;
            g = _mm512_set1_epi32(tok.bias16[t][16 * s + grp]);
          }
          g = DpbusdBroadcast(g, w0, a);
          g = DpbusdBroadcast(g, w1, a + 4);
          g = DpbusdBroadcast(g, w2, a + 8);
          g = DpbusdBroadcast(g, w3, a + 12);
          isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(g, scale));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb + 8 * 384 + 256)));
    if constexpr (kTiled) {
      __m512i spair[8];  // rows' (sc_2j, sc_2j+1) as int16 pairs, against block j's two 16-value sums
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        spair[j] = Int16Pairs(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 32 * j))),
                              _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 32 * j + 16))));
      }
      AddOffsetSuperBlock<5>(acc, isum, spair, d, as);
    } else {
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[t] = AddScaled(acc[t], isum[t], d, tok.d[t][s]);
    }
  }
  StoreRows(p, 0, acc);
}

// IQ4_XS: per 32-element sub-block the IQ4_NL dots (grid + 128, vpshufb once per line),
// times the sub-block's int8 scale in int32 (|sum| < 2^28 over a super-block); one
// convert + FMA per super-block applies d[rows] * da[t], as Q6_K. The grid's +128 comes
// off as 128 x the sum of the activations, as Q6_K's offset: kTiled (tiled Q8_K
// activations, the broadcasts folded) once per super-block, 4 vpdpwssd of (sc_2i, sc_2i+1)
// pairs against two blocks' full sums (FullBlockSumPairs); with row activations (one or two tokens,
// PackedKernel::row_fn) each sub-block starts at -128 x its sum.
template <int NT, bool kTiled>
void TilePackedIQ4_XS(const PackedArgs& p) {
  const RowTokens<kTiled, NT> tok(p);
  const int64_t nsb = p.cols / 256;
  const Iq4Grid grid;
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedIQ4XSSuperBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sb + 2048)));
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 2048 + 32);
    const uint8_t* as = p.a + 8 * s * kTiledBlockBytes;  // tiled: the super-block's first block
    [[maybe_unused]] alignas(32) uint32_t sums[4][8];
    if constexpr (kTiled) FullBlockSumPairs<NT>(as, sums);
    __m512i isum[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * s + j;  // 32-element block of the row
      __m512i iacc[NT];
      if constexpr (kTiled) {
        const uint8_t* ab = as + j * kTiledBlockBytes;
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) iacc[t] = _mm512_setzero_si512();
        DotNibbleBlock<NT>(sb + 256 * j, [ab](int t, int i) { return ab + 32 * t + 8 * i; }, iacc, grid);
      } else {
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) iacc[t] = _mm512_set1_epi32(4 * (tok.bias16[t][2 * b] + tok.bias16[t][2 * b + 1]));
        DotNibbleBlock<NT, false>(sb + 256 * j, [&tok, b](int t, int i) { return tok.q[t] + 32 * b + 8 * i; }, iacc, grid);
      }
      const __m512i scale = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * j)));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(iacc[t], scale));
    }
    if constexpr (kTiled) {
      __m512i s2[4];  // rows' (sc_2i, sc_2i+1) as int16 pairs, against the blocks' full sums
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        s2[i] = Int16Pairs(_mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 32 * i))),
                           _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 32 * i + 16))));
      }
      const float* da = reinterpret_cast<const float*>(as + kTiledD);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        acc[t] = AddScaled(acc[t], _mm512_sub_epi32(isum[t], _mm512_slli_epi32(FullBlockSumsDot(s2, sums, t), 7)), d, da[t]);
      }
    } else {
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) acc[t] = AddScaled(acc[t], isum[t], d, tok.d[t][s]);
    }
  }
  StoreRows(p, 0, acc);
}

// Bit `src` of every byte moved to bit `dst` (other bits of the result are garbage).
template <int kSrc, int kDst, typename V>
__attribute__((always_inline)) inline V MoveBit(V v) {
  if constexpr (kSrc < kDst) return _mm512_slli_epi16(v, kDst - kSrc);
  else if constexpr (kSrc == kDst) return v;
  else return _mm512_srli_epi16(v, kSrc - kDst);
}

// Q2_K and Q3_K (layouts in packed.h), Q8_K activations: per 16-element group (one crumb
// line) 4 vpdpbusd of the 2-bit (Q3_K: | 3rd bit << 2) weights, times the group's scale
// in int32. Q3_K's offset (-4 x the group's sum) and Q2_K's mins (-32 m x the sum) come
// from the activations' group sums: kTiled (tiled Q8_K, the broadcasts folded) once per
// super-block, 8 vpdpwssd of (x_2j, x_2j+1) int16 pairs of scales or mins against each
// block's two 16-value sums; with row activations (one or two tokens,
// PackedKernel::row_fn) per group, Q3_K starting at an eighth of the row's bias16 and
// Q2_K's mins as m x bias16. One convert + FMA per super-block applies d x da (and dmin x
// da / 32).
template <bool kQ3, int NT, bool kTiled>
void TilePackedLowK(const PackedArgs& p) {
  constexpr int64_t kBlock = kQ3 ? 192 : 128, kSuper = kQ3 ? kPackedQ3KSuperBytes : kPackedQ2KSuperBytes;
  const RowTokens<kTiled, NT> tok(p);
  const int64_t nsb = p.cols / 256;
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i m4 = _mm512_set1_epi8(4);
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kSuper;
    const uint8_t* sc = sb + 8 * kBlock;
    const uint8_t* as = p.a + 8 * s * kTiledBlockBytes;  // tiled: the super-block's first block
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + 256)));
    __m512i isum[NT], msum[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) isum[t] = msum[t] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const uint8_t* bl = sb + kBlock * j;
      const uint8_t* ab = as + j * kTiledBlockBytes;
      PrefetchWeights<NT, kPrefetchBytes>(bl);
      PrefetchWeights<NT, kPrefetchBytes>(bl + 64);
      [[maybe_unused]] __m512i hb;
      if constexpr (kQ3) {
        PrefetchWeights<NT, kPrefetchBytes>(bl + 128);
        hb = LoadLine<NT>(bl + 128);
      }
      auto group = [&](auto m_const) {
        constexpr int m = decltype(m_const)::value;
        const __m512i line = LoadLine<NT>(bl + 64 * m);
        __m512i w[4] = {_mm512_and_si512(line, m3), _mm512_and_si512(_mm512_srli_epi16(line, 2), m3),
                        _mm512_and_si512(_mm512_srli_epi16(line, 4), m3), _mm512_and_si512(_mm512_srli_epi16(line, 6), m3)};
        if constexpr (kQ3) {
          w[0] = _mm512_or_si512(w[0], _mm512_and_si512(MoveBit<4 * m, 2>(hb), m4));
          w[1] = _mm512_or_si512(w[1], _mm512_and_si512(MoveBit<4 * m + 1, 2>(hb), m4));
          w[2] = _mm512_or_si512(w[2], _mm512_and_si512(MoveBit<4 * m + 2, 2>(hb), m4));
          w[3] = _mm512_or_si512(w[3], _mm512_and_si512(MoveBit<4 * m + 3, 2>(hb), m4));
        }
        const int grp = 2 * j + m;
        __m512i scale;
        [[maybe_unused]] __m512i mins;
        if constexpr (kQ3) {
          scale = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * grp)));
        } else {
          const __m512i scm = _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + 16 * grp)));
          scale = _mm512_and_si512(scm, _mm512_set1_epi32(15));
          mins = _mm512_srli_epi32(scm, 4);
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const uint8_t* a;
          __m512i g = _mm512_setzero_si512();
          [[maybe_unused]] int32_t bias;
          if constexpr (kTiled) {
            a = ab + 32 * t + 16 * m;
          } else {
            a = tok.q[t] + 256 * s + 16 * grp;
            bias = tok.bias16[t][16 * s + grp];
            if constexpr (kQ3) g = _mm512_set1_epi32(bias / 8);
          }
          g = DpbusdBroadcast(g, w[0], a);
          g = DpbusdBroadcast(g, w[1], a + 4);
          g = DpbusdBroadcast(g, w[2], a + 8);
          g = DpbusdBroadcast(g, w[3], a + 12);
          isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(g, scale));
          if constexpr (!kQ3 && !kTiled) msum[t] = _mm512_add_epi32(msum[t], _mm512_mullo_epi32(mins, _mm512_set1_epi32(bias)));
        }
      };
      group(std::integral_constant<int, 0>{});
      group(std::integral_constant<int, 1>{});
    }
    if constexpr (kTiled) {  // Q3_K: isum -= 4 x sum of sc_g bsum_g; Q2_K: msum = -32 x sum of m_g bsum_g
      __m512i pair[8];  // rows' (x_2j, x_2j+1) as int16 pairs: Q3_K's scales, Q2_K's mins
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m128i* x = reinterpret_cast<const __m128i*>(sc + 32 * j);
        if constexpr (kQ3) {
          pair[j] = Int16Pairs(_mm512_cvtepi8_epi32(_mm_load_si128(x)), _mm512_cvtepi8_epi32(_mm_load_si128(x + 1)));
        } else {
          pair[j] = Int16Pairs(_mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_load_si128(x)), 4),
                               _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_load_si128(x + 1)), 4));
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512i ps = BlockSumsDot(pair, as, t);
        if constexpr (kQ3) {
          isum[t] = _mm512_sub_epi32(isum[t], _mm512_slli_epi32(ps, 2));
        } else {
          msum[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ps, 5));
        }
      }
    }
    [[maybe_unused]] __m512 dmin;
    if constexpr (!kQ3) {
      dmin = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + 256 + 32))),
                           _mm512_set1_ps(1.0f / 32));
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      float da;
      if constexpr (kTiled) {
        da = reinterpret_cast<const float*>(as + kTiledD)[t];
      } else {
        da = tok.d[t][s];
      }
      acc[t] = AddScaled(acc[t], isum[t], d, da);
      if constexpr (!kQ3) acc[t] = AddScaled(acc[t], msum[t], dmin, da);
    }
  }
  StoreRows(p, 0, acc);
}

template <bool kQ3>
void DispatchPackedLowK(const PackedArgs& p) {
  static constexpr PackedFn kTable[kPackedMaxTokens] = {
      TilePackedLowK<kQ3, 1, true>, TilePackedLowK<kQ3, 2, true>, TilePackedLowK<kQ3, 3, true>,
      TilePackedLowK<kQ3, 4, true>, TilePackedLowK<kQ3, 5, true>, TilePackedLowK<kQ3, 6, true>,
      TilePackedLowK<kQ3, 7, true>, TilePackedLowK<kQ3, 8, true>};
  kTable[p.nt - 1](p);
}
template <bool kQ3>
void DispatchPackedLowKRows(const PackedArgs& p) {
  static_assert(kRowFnMaxTokens == 2);
  (p.nt == 1 ? TilePackedLowK<kQ3, 1, false> : TilePackedLowK<kQ3, 2, false>)(p);
}

void DispatchPackedIQ4_XS(const PackedArgs& p) {
  static constexpr PackedFn kTable[kPackedMaxTokens] = {
      TilePackedIQ4_XS<1, true>, TilePackedIQ4_XS<2, true>, TilePackedIQ4_XS<3, true>, TilePackedIQ4_XS<4, true>,
      TilePackedIQ4_XS<5, true>, TilePackedIQ4_XS<6, true>, TilePackedIQ4_XS<7, true>, TilePackedIQ4_XS<8, true>};
  kTable[p.nt - 1](p);
}
void DispatchPackedIQ4_XSRows(const PackedArgs& p) {
  static_assert(kRowFnMaxTokens == 2);
  (p.nt == 1 ? TilePackedIQ4_XS<1, false> : TilePackedIQ4_XS<2, false>)(p);
}

void DispatchPackedQ6_K(const PackedArgs& p) {
  static constexpr PackedFn kTable[kPackedMaxTokens] = {
      TilePackedQ6_K<1, true>, TilePackedQ6_K<2, true>, TilePackedQ6_K<3, true>, TilePackedQ6_K<4, true>,
      TilePackedQ6_K<5, true>, TilePackedQ6_K<6, true>, TilePackedQ6_K<7, true>, TilePackedQ6_K<8, true>};
  kTable[p.nt - 1](p);
}
void DispatchPackedQ6_KRows(const PackedArgs& p) {
  static_assert(kRowFnMaxTokens == 2);
  (p.nt == 1 ? TilePackedQ6_K<1, false> : TilePackedQ6_K<2, false>)(p);
}

template <bool kQ5>
void DispatchPackedQ4_K(const PackedArgs& p) {
  static constexpr PackedFn kTable[kPackedMaxTokens] = {
      TilePackedQ4_K<kQ5, 1>, TilePackedQ4_K<kQ5, 2>, TilePackedQ4_K<kQ5, 3>, TilePackedQ4_K<kQ5, 4>,
      TilePackedQ4_K<kQ5, 5>, TilePackedQ4_K<kQ5, 6>, TilePackedQ4_K<kQ5, 7>, TilePackedQ4_K<kQ5, 8>};
  kTable[p.nt - 1](p);
}

// F16 and BF16: outer products. F16: per column k, each group's 16 weights (32 bytes)
// widen to f32 and meet every token's x[k] broadcast: G x NT FMAs per G conversions.
// BF16: per column pair, each group's 16 x 2 weights (64 bytes) meet every token's bf16
// pair (x[k], x[k+1]) broadcast in one vdpbf16ps, no conversion. 3 groups x 8 tokens keep
// 24 accumulators in registers (Zen 5, one thread, F16: ~230 GFLOP/s, vs ~140 for one
// group x 12 tokens). Columns are taken in pairs, one prefetch per 64-byte line.
constexpr int kFloatGroups = 3;
constexpr int64_t kFloatPrefetchCols = 64;  // 2 KiB ahead per group stream

template <bool kBf16, int G, int NT>
void TilePackedFloat(const PackedArgs& p) {
  const uint16_t* w[G];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) w[g] = reinterpret_cast<const uint16_t*>(p.g + g * p.group_bytes);
  const uint8_t* x[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) x[t] = p.a + t * p.a_stride;
  __m512 acc[G][NT];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[g][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < p.cols; k += 2) {
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm_prefetch(reinterpret_cast<const char*>(w[g] + 16 * (k + kFloatPrefetchCols)), _MM_HINT_T0);
    if constexpr (kBf16) {
      __m512bh wv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) wv[g] = reinterpret_cast<__m512bh>(_mm512_load_si512(w[g] + 16 * k));
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(Load32(x[t] + 2 * k)));
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) acc[g][t] = _mm512_dpbf16_ps(acc[g][t], wv[g], xv);
      }
    } else {
#pragma GCC unroll 2
      for (int kk = 0; kk < 2; ++kk) {
        __m512 wv[G];
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          wv[g] = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(w[g] + 16 * (k + kk))));
        }
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          const __m512 xv = _mm512_set1_ps(reinterpret_cast<const float*>(x[t])[k + kk]);
#pragma GCC unroll 4
          for (int g = 0; g < G; ++g) acc[g][t] = _mm512_fmadd_ps(wv[g], xv, acc[g][t]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) StoreRows(p, g, acc[g]);
}

template <bool kBf16, int G>
struct FloatTable {
  static constexpr PackedFn kFns[kPackedMaxTokens] = {
      TilePackedFloat<kBf16, G, 1>, TilePackedFloat<kBf16, G, 2>, TilePackedFloat<kBf16, G, 3>,
      TilePackedFloat<kBf16, G, 4>, TilePackedFloat<kBf16, G, 5>, TilePackedFloat<kBf16, G, 6>,
      TilePackedFloat<kBf16, G, 7>, TilePackedFloat<kBf16, G, 8>};
};

template <bool kBf16>
void DispatchPackedFloat(const PackedArgs& p) {
  static_assert(kFloatGroups == 3);
  switch (p.ng) {
    case 1: FloatTable<kBf16, 1>::kFns[p.nt - 1](p); break;
    case 2: FloatTable<kBf16, 2>::kFns[p.nt - 1](p); break;
    default: FloatTable<kBf16, 3>::kFns[p.nt - 1](p); break;
  }
}

// A full tile over cached weights (the second and later tiles of a prefill chunk) goes
// without prefetches. The K-quant tiles keep theirs: they were 1.00-1.01x without them.
template <GgmlType kType>
void DispatchPacked(const PackedArgs& p) {
  static constexpr PackedFn kTable[kPackedMaxTokens] = {
      TilePacked<kType, 1>, TilePacked<kType, 2>, TilePacked<kType, 3>, TilePacked<kType, 4>,
      TilePacked<kType, 5>, TilePacked<kType, 6>, TilePacked<kType, 7>, TilePacked<kType, 8>};
  if (p.nt == kPackedMaxTokens && p.cached) {
    if (p.ng == 2) return TilePacked2x8<kType>(p);
    return TilePacked<kType, kPackedMaxTokens, false>(p);
  }
  // Weights on their way from memory (decode, and a prefill chunk's first tile of a
  // unit), or fewer tokens: one group at a time, as many tokens as there are. Two groups
  // x 4 tokens there streamed each line for half the work: 8 sessions decoding, TinyLlama
  // Q4_0 0.91x, Q8_0 0.85x.
  PackedArgs q = p;
  for (int g = 0; g < p.ng; ++g) {
    q.g = p.g + g * p.group_bytes;
    q.nr = p.nr - 16 * g;
    q.y = p.y + 16 * g;
    kTable[p.nt - 1](q);
  }
}

}  // namespace

PackedKernel GetPackedKernelAvx512(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {DispatchPacked<GgmlType::kQ4_0>, 2, /*tiled=*/true};
    case GgmlType::kQ5_0: return {DispatchPacked<GgmlType::kQ5_0>, 2, /*tiled=*/true};
    case GgmlType::kQ5_1: return {DispatchPacked<GgmlType::kQ5_1>, 2, /*tiled=*/true};
    case GgmlType::kQ8_0: return {DispatchPacked<GgmlType::kQ8_0>, 2, /*tiled=*/true};
    case GgmlType::kIQ4_NL: return {DispatchPacked<GgmlType::kIQ4_NL>, 2, /*tiled=*/true};
    case GgmlType::kQ4_K: return {DispatchPackedQ4_K<false>, 1, /*tiled=*/true};
    case GgmlType::kQ5_K: return {DispatchPackedQ4_K<true>, 1, /*tiled=*/true};
    case GgmlType::kQ6_K: return {DispatchPackedQ6_K, 1, /*tiled=*/true, DispatchPackedQ6_KRows};
    case GgmlType::kIQ4_XS: return {DispatchPackedIQ4_XS, 1, /*tiled=*/true, DispatchPackedIQ4_XSRows};
    case GgmlType::kQ2_K: return {DispatchPackedLowK<false>, 1, /*tiled=*/true, DispatchPackedLowKRows<false>};
    case GgmlType::kQ3_K: return {DispatchPackedLowK<true>, 1, /*tiled=*/true, DispatchPackedLowKRows<true>};
    case GgmlType::kF16: return {DispatchPackedFloat<false>, kFloatGroups};
    case GgmlType::kBF16: return {DispatchPackedFloat<true>, kFloatGroups};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

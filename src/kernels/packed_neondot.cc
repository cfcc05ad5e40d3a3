// aarch64 NEON kernels over the x16 packed layouts (packed.h) of every integer type: the
// 32-element block types (Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL), the K-quants (Q2_K .. Q6_K) and
// IQ4_XS; F16 and BF16 keep the row-major NEON tiles. For CPUs with the dotprod extension
// (ARMv8.2: Apple M1 and later, Graviton 2 and later, Cortex-A76 / Raspberry Pi 5 and
// later); compiled with -march=armv8.2-a+dotprod and called only when NeonDotprodEnabled(). Without dotprod the
// row-major NEON tiles run (matmul_neon_inl.h): a 4-byte dot against a broadcast has no
// single instruction there.
//
// A q register holds 4 rows x 4 consecutive elements of a 64-byte line (bytes 16 j .. 16 j
// + 15 are rows 4 j .. 4 j + 3), so `sdot` by element (vdotq_laneq_s32) against the 4
// activation bytes in one lane accumulates 4 rows' dots at once, and a block's scales are
// applied once per 16 dots to 4 rows at a time. The row-major NEON tiles spend a convert, a
// multiply and an FMA per 2 dots of one row; here a block of 8 rows x 1 token is 16 dots
// and 6 such instructions. The nibble unpacking (and, shift; IQ4_NL a table lookup; Q8_0
// an xor for its +128 bias) is paid once per line for all of a tile's tokens.
//
// A tile is one half of a group (8 rows, two q registers per line) x up to 4 tokens: per
// token 2 int32 block sums and 2 f32 accumulators, 16 of the 32 registers at 4 tokens.
// Tiles of 1-2 tokens take both halves in one pass, so the group's lines stream once.
// Activations are the scratch rows of matmul_internal.h, as the row-major tiles': Q8_0
// (int8 qs, then d, sum and d * sum per block), or Q8_K for the K-quants. sdot is signed,
// so the unsigned-biased weights (Q4_0 e in 0..15 for e - 8, Q5_0 e - 16) start each
// block's sum at -bias * sum(a); the K-quants' e in 0..31 take their mins as the x86
// kernels do.
//
// Speed: not measured on ARM hardware; only qemu-user was at hand when these were written,
// which checks values and counts instructions (docs/ROOFLINE.md, "NEON packed tiles"), not
// time. So there is no software prefetch either (the x86 distances were measured there and
// do not carry over). TRELLIS_REPACK=0 turns packing off and the row-major tiles run.
//
// Thread safety: pure functions.
#include <arm_neon.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/matmul_internal.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "kernels/unroll.h"

namespace trellis::matmul_internal {
namespace {

constexpr int kNeonPackedTokens = 4;

template <int N>
using Int = std::integral_constant<int, N>;

// The 8 f32 values of the f16 x8 at p (rows 8 h .. 8 h + 7 of a block's scales).
inline void LoadF16x8(const uint16_t* p, float32x4_t (&out)[2]) {
  const uint16x8_t v = vld1q_u16(p);
  out[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(v)));
  out[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(v)));
}

// Bit kSrc of every byte moved to bit 4, other bits cleared.
template <int kSrc>
inline uint8x16_t BitTo4(uint8x16_t v) {
  const uint8x16_t bit4 = vdupq_n_u8(0x10);
  if constexpr (kSrc < 4) return vandq_u8(vshlq_n_u8(v, 4 - kSrc), bit4);
  else if constexpr (kSrc == 4) return vandq_u8(v, bit4);
  else return vandq_u8(vshrq_n_u8(v, kSrc - 4), bit4);
}

// isum[t][k] += the dots of rows 4 k .. 4 k + 3 of weights w[k] (4 elements per row) with
// lane kLane of token t's activation register a[t].
template <int kLane, int NT>
__attribute__((always_inline)) inline void DotLane(const int8x16_t (&w)[2], const int8x16_t (&a)[NT],
                                                   int32x4_t (&isum)[NT][2]) {
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    isum[t][0] = vdotq_laneq_s32(isum[t][0], w[0], a[t], kLane);
    isum[t][1] = vdotq_laneq_s32(isum[t][1], w[1], a[t], kLane);
  }
}

// A 32-element block of 4-bit x16 weights (packed.h), this half's 32 bytes of each of its 4
// nibble lines at wb (kFifth: and of the 5th-bit line at wb + 256, e in 0..31), against
// NT tokens' activation bytes arow[t] + offset: isum[t][k] += the int32 dots of rows
// 4 k .. 4 k + 3 of the half with e (kIq4: IQ4_NL's grid value of e). Line i: low nibbles
// are elements 8 i .. 8 i + 3 (activation lane 2 i), high nibbles 8 i + 4 .. 8 i + 7 (lane
// 2 i + 1), both in activation bytes 16 (i / 2) ..
template <bool kFifth, bool kIq4, int NT>
__attribute__((always_inline)) inline void DotNibbleHalf(const uint8_t* wb, const int8_t* const (&arow)[NT],
                                                         int64_t offset, int32x4_t (&isum)[NT][2]) {
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  [[maybe_unused]] const int8x16_t grid = vld1q_s8(kIq4NlValues);
  [[maybe_unused]] uint8x16_t high[2];
  if constexpr (kFifth) high[0] = vld1q_u8(wb + 256), high[1] = vld1q_u8(wb + 256 + 16);
  auto line = [&](auto i_const) __attribute__((always_inline)) {
    constexpr int i = decltype(i_const)::value;
    int8x16_t a[NT];
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) a[t] = vld1q_s8(arow[t] + offset + 16 * (i / 2));
    const uint8x16_t packed[2] = {vld1q_u8(wb + 64 * i), vld1q_u8(wb + 64 * i + 16)};
    int8x16_t lo[2], hi[2];
    TRELLIS_UNROLL
    for (int k = 0; k < 2; ++k) {
      uint8x16_t l = vandq_u8(packed[k], m4), u = vshrq_n_u8(packed[k], 4);
      if constexpr (kFifth) {
        l = vorrq_u8(l, BitTo4<2 * i>(high[k]));
        u = vorrq_u8(u, BitTo4<2 * i + 1>(high[k]));
      }
      if constexpr (kIq4) {
        lo[k] = vqtbl1q_s8(grid, l);
        hi[k] = vqtbl1q_s8(grid, u);
      } else {
        lo[k] = vreinterpretq_s8_u8(l);
        hi[k] = vreinterpretq_s8_u8(u);
      }
    }
    DotLane<(2 * i) % 4>(lo, a, isum);
    DotLane<(2 * i + 1) % 4>(hi, a, isum);
  };
  line(Int<0>{}), line(Int<1>{}), line(Int<2>{}), line(Int<3>{});
}

// Every accumulator of a tile (NH halves x NT tokens x 2 registers of 4 rows) to 0.
template <int NH, int NT>
__attribute__((always_inline)) inline void Zero(float32x4_t (&acc)[NH][NT][2]) {
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh)
    TRELLIS_UNROLL
    for (int t = 0; t < NT; ++t) acc[hh][t][0] = acc[hh][t][1] = vdupq_n_f32(0.f);
}

// Stores acc[t] (rows 8 h .. 8 h + 7 of the group) for NT tokens; rows at or past p.nr are
// left untouched.
template <int NT>
__attribute__((always_inline)) inline void StoreHalf(const PackedArgs& p, int h, const float32x4_t (&acc)[NT][2]) {
  const int rows = p.nr - 8 * h;
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    float* y = p.y + t * p.y_stride + 8 * h;
    if (rows >= 8) {
      vst1q_f32(y, acc[t][0]);
      vst1q_f32(y + 4, acc[t][1]);
    } else {
      float v[8];
      vst1q_f32(v, acc[t][0]);
      vst1q_f32(v + 4, acc[t][1]);
      std::memcpy(y, v, static_cast<size_t>(rows) * sizeof(float));
    }
  }
}

// Rows [8 h, 8 h + 8) of the group for h in [h0, h0 + NH) x NT tokens, for a 32-element
// block type (layouts in packed.h). Per block and half: the int32 row dots (weights
// unpacked to signed or biased int8 per line, sdot by element against each token's
// activation lane), then one convert + FMA applies d[rows] * da[t]; Q5_1 adds m[rows] *
// (da * sum)[t].
template <GgmlType kType, int NT, int NH>
void HalfQ32(const PackedArgs& p, int h0) {
  constexpr int kLines = PackedLines(kType);
  constexpr int32_t kOffset = kType == GgmlType::kQ4_0 ? 8 : kType == GgmlType::kQ5_0 ? 16 : 0;  // unsigned bias
  const int8_t* arow[NT];
  const float* da[NT];
  const int32_t* asum[NT];
  const float* dsum[NT];
  RowFields(p.a, p.a_stride, 0, arow);
  RowFields(p.a, p.a_stride, p.cols, da);
  RowFields(p.a, p.a_stride, Q8_0SumOffset(p.cols), asum);
  RowFields(p.a, p.a_stride, Q8_0SumOffset(p.cols) + 4 * (p.cols / 32), dsum);
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(p.g + p.nb * 64 * kLines);
  [[maybe_unused]] const uint16_t* mins = scales + 16 * p.nb;
  float32x4_t acc[NH][NT][2];
  Zero(acc);
  for (int64_t b = 0; b < p.nb; ++b) {
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      const uint8_t* wb = p.g + b * 64 * kLines + 32 * h;  // this half's 32 bytes of each line
      int32x4_t isum[NT][2];
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = vdupq_n_s32(-kOffset * asum[t][b]);
      if constexpr (kType == GgmlType::kQ8_0) {
        // Line j: elements 4 j .. 4 j + 3 of each row, stored + 128: lane j % 4 of the
        // activation bytes 16 (j / 4) ...
        auto line = [&](auto j_const) __attribute__((always_inline)) {
          constexpr int j = decltype(j_const)::value;
          int8x16_t a[NT];
          TRELLIS_UNROLL
          for (int t = 0; t < NT; ++t) a[t] = vld1q_s8(arow[t] + 32 * b + 16 * (j / 4));
          const uint8x16_t bias = vdupq_n_u8(0x80);
          const int8x16_t w[2] = {vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + 64 * j), bias)),
                                  vreinterpretq_s8_u8(veorq_u8(vld1q_u8(wb + 64 * j + 16), bias))};
          DotLane<j % 4>(w, a, isum);
        };
        line(Int<0>{}), line(Int<1>{}), line(Int<2>{}), line(Int<3>{});
        line(Int<4>{}), line(Int<5>{}), line(Int<6>{}), line(Int<7>{});
      } else {
        DotNibbleHalf<kLines == 5, kType == GgmlType::kIQ4_NL>(wb, arow, 32 * b, isum);
      }
      float32x4_t dw[2];
      LoadF16x8(scales + 16 * b + 8 * h, dw);
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) {
        TRELLIS_UNROLL
        for (int k = 0; k < 2; ++k) {
          acc[hh][t][k] = vfmaq_f32(acc[hh][t][k], vcvtq_f32_s32(isum[t][k]), vmulq_n_f32(dw[k], da[t][b]));
        }
      }
      if constexpr (kType == GgmlType::kQ5_1) {
        float32x4_t mw[2];
        LoadF16x8(mins + 16 * b + 8 * h, mw);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) {
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) acc[hh][t][k] = vfmaq_n_f32(acc[hh][t][k], mw[k], dsum[t][b]);
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// The 8 f32 values of the u8 x8 at p (rows 8 h .. 8 h + 7 of a sub-block's scales or mins).
inline void LoadU8x8(const uint8_t* p, float32x4_t (&out)[2]) {
  const uint16x8_t v = vmovl_u8(vld1_u8(p));
  out[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(v)));
  out[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(v)));
}

// Q4_K (kQ5 false) and Q5_K (layouts in packed.h), llama.cpp's Q8_K activations: per
// 32-element sub-block j the nibble dots as Q4_0's (Q5_K: with the 5th bit), then acc +=
// f(isum) * (d * sc_j)[rows] * da[t] - (dmin * m_j)[rows] * (da * sum)[t], as the x86
// kernels. The sub-block's scale and min vectors are made once for all the tile's tokens.
template <bool kQ5, int NT, int NH>
void HalfK(const PackedArgs& p, int h0) {
  constexpr int64_t kSub = kQ5 ? 320 : 256;  // bytes per sub-block
  constexpr int64_t kSuper = kQ5 ? kPackedQ5KSuperBytes : kPackedQ4KSuperBytes;
  const int64_t nsb = p.cols / kQkK;
  const int8_t* arow[NT];
  const float* da[NT];
  const float* dsum[NT];
  RowFields(p.a, p.a_stride, 0, arow);
  RowFields(p.a, p.a_stride, p.cols, da);
  RowFields(p.a, p.a_stride, Q8KDsum32Offset(p.cols), dsum);
  float32x4_t acc[NH][NT][2];
  Zero(acc);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kSuper;
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(sb + 8 * kSub);
    const uint8_t* sc = sb + 8 * kSub + 64;
    const uint8_t* mins = sc + 128;
    for (int j = 0; j < 8; ++j) {
      const int64_t b = 8 * s + j;
      TRELLIS_UNROLL
      for (int hh = 0; hh < NH; ++hh) {
        const int h = h0 + hh;
        float32x4_t d[2], dmin[2], scale[2], min[2];
        LoadF16x8(d16 + 8 * h, d);
        LoadF16x8(d16 + 16 + 8 * h, dmin);
        LoadU8x8(sc + 16 * j + 8 * h, scale);
        LoadU8x8(mins + 16 * j + 8 * h, min);
        TRELLIS_UNROLL
        for (int k = 0; k < 2; ++k) scale[k] = vmulq_f32(d[k], scale[k]), min[k] = vmulq_f32(dmin[k], min[k]);
        int32x4_t isum[NT][2];
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = vdupq_n_s32(0);
        DotNibbleHalf<kQ5, false>(sb + kSub * j + 32 * h, arow, 32 * b, isum);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) {
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) {
            acc[hh][t][k] = vfmaq_f32(acc[hh][t][k], vcvtq_f32_s32(isum[t][k]), vmulq_n_f32(scale[k], da[t][s]));
            acc[hh][t][k] = vfmsq_f32(acc[hh][t][k], min[k], vdupq_n_f32(dsum[t][b]));
          }
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// The 8 int32 values of the int8 x8 at p (rows 8 h .. 8 h + 7 of a group's scales).
inline void LoadS8x8(const int8_t* p, int32x4_t (&out)[2]) {
  const int16x8_t v = vmovl_s8(vld1_s8(p));
  out[0] = vmovl_s16(vget_low_s16(v));
  out[1] = vmovl_s16(vget_high_s16(v));
}

// One 16-element group of the K-quants' 2-bit .. 6-bit layouts (Q2_K, Q3_K, Q6_K) against
// NT tokens: w[x] are the group's 4-element runs x = 0..3 (activation lanes 0..3 of its 16
// bytes at byte `offset` of each Q8_K row), dots from start(t), then total[t] += dot x
// scale (int32, the group's scale of each row).
template <int NT, typename Start>
__attribute__((always_inline)) inline void GroupDot(const int8x16_t (&w)[4][2], const Q8KTokens<NT>& tok, int64_t offset,
                                                    Start start, const int32x4_t (&scale)[2], int32x4_t (&total)[NT][2]) {
  int8x16_t a[NT];
  int32x4_t g[NT][2];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    a[t] = vld1q_s8(reinterpret_cast<const int8_t*>(tok.q[t]) + offset);
    g[t][0] = g[t][1] = vdupq_n_s32(start(t));
  }
  DotLane<0>(w[0], a, g);
  DotLane<1>(w[1], a, g);
  DotLane<2>(w[2], a, g);
  DotLane<3>(w[3], a, g);
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    TRELLIS_UNROLL
    for (int k = 0; k < 2; ++k) total[t][k] = vmlaq_s32(total[t][k], g[t][k], scale[k]);
  }
}

// acc[t] += f(sums[t]) * d[rows] * da[t] for super-block s: d the f16 x8 at d16 (this half's
// rows), da the tokens' Q8_K scales.
template <int NT>
__attribute__((always_inline)) inline void AddSuperBlock(const uint16_t* d16, const Q8KTokens<NT>& tok, int64_t s,
                                                         const int32x4_t (&sums)[NT][2], float32x4_t (&acc)[NT][2]) {
  float32x4_t d[2];
  LoadF16x8(d16, d);
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) {
    TRELLIS_UNROLL
    for (int k = 0; k < 2; ++k) acc[t][k] = vfmaq_f32(acc[t][k], vcvtq_f32_s32(sums[t][k]), vmulq_n_f32(d[k], tok.d[t][s]));
  }
}

// Q6_K (layout in packed.h), Q8_K activations: per 16-element group (nibble lines 2 x and
// 2 x + 1 of a block with high-bit line x), 4 dots of the 6-bit weights (nibble | high pair
// << 4) from -32 * bsum (bias16), times the group's int8 scale in int32; one convert + FMA
// per super-block, as the x86 kernels. The halves of a super-block run one after the other
// (its 3392 bytes stay in L1 for the second).
template <int NT, int NH>
void HalfQ6K(const PackedArgs& p, int h0) {
  const int64_t nsb = p.cols / kQkK;
  const Q8KTokens<NT> tok(p);
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m30 = vdupq_n_u8(0x30);
  float32x4_t acc[NH][NT][2];
  Zero(acc);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedQ6KSuperBytes;
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 8 * 384);
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(sb + 8 * 384 + 256);
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      int32x4_t total[NT][2];
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) total[t][0] = total[t][1] = vdupq_n_s32(0);
      for (int j = 0; j < 8; ++j) {
        const uint8_t* bl = sb + 384 * j + 32 * h;
        TRELLIS_UNROLL
        for (int x = 0; x < 2; ++x) {
          const int grp = 2 * j + x;
          int8x16_t w[4][2];
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) {
            const uint8x16_t l0 = vld1q_u8(bl + 128 * x + 16 * k), l1 = vld1q_u8(bl + 128 * x + 64 + 16 * k);
            const uint8x16_t hb = vld1q_u8(bl + 256 + 64 * x + 16 * k);
            w[0][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(hb, 4), m30)));
            w[1][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(vshlq_n_u8(hb, 2), m30)));
            w[2][k] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(l1, m4), vandq_u8(hb, m30)));
            w[3][k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(hb, 2), m30)));
          }
          int32x4_t scale[2];
          LoadS8x8(sc + 16 * grp + 8 * h, scale);
          GroupDot(w, tok, kQkK * s + 16 * grp, [&](int t) { return tok.bias16[t][16 * s + grp]; }, scale, total);
        }
      }
      AddSuperBlock(d16 + 8 * h, tok, s, total, acc[hh]);
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

// IQ4_XS (layout in packed.h), Q8_K activations: per 32-element sub-block IQ4_NL's dots of
// grid values, times the sub-block's int8 scale in int32; one convert + FMA per
// super-block, as the x86 kernels.
template <int NT, int NH>
void HalfIQ4XS(const PackedArgs& p, int h0) {
  const int64_t nsb = p.cols / kQkK;
  const Q8KTokens<NT> tok(p);
  const int8_t* arow[NT];
  TRELLIS_UNROLL
  for (int t = 0; t < NT; ++t) arow[t] = reinterpret_cast<const int8_t*>(tok.q[t]);
  float32x4_t acc[NH][NT][2];
  Zero(acc);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kPackedIQ4XSSuperBytes;
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(sb + 2048);
    const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 2048 + 32);
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      int32x4_t total[NT][2];
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) total[t][0] = total[t][1] = vdupq_n_s32(0);
      for (int j = 0; j < 8; ++j) {
        int32x4_t dot[NT][2];
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) dot[t][0] = dot[t][1] = vdupq_n_s32(0);
        DotNibbleHalf<false, true>(sb + 256 * j + 32 * h, arow, 32 * (8 * s + j), dot);
        int32x4_t scale[2];
        LoadS8x8(sc + 16 * j + 8 * h, scale);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) {
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) total[t][k] = vmlaq_s32(total[t][k], dot[t][k], scale[k]);
        }
      }
      AddSuperBlock(d16 + 8 * h, tok, s, total, acc[hh]);
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

struct IQ4XSKernel {
  template <int NT, int NH>
  static void Run(const PackedArgs& p, int h0) { HalfIQ4XS<NT, NH>(p, h0); }
};

// Q2_K and Q3_K (layouts in packed.h), Q8_K activations, as the x86 kernels: per 16-element
// group (line m of block j is group 2 j + m: its bytes hold 4 elements' 2-bit values at
// bits 0, 2, 4, 6, activation lanes 0-3 of the group's 16 bytes), 4 dots of the 2-bit
// (Q3_K: plus the 3rd bit from the block's high line, value e - 4) weights from 0 (Q3_K:
// bias16 / 8 = -4 * bsum), times the group's scale in int32; Q2_K's mins as m x bias16, in
// a pass of their own after the dots (so their sums are not live beside the dots').
template <bool kQ3, int NT, int NH>
void HalfLowK(const PackedArgs& p, int h0) {
  constexpr int64_t kBlock = kQ3 ? 192 : 128, kSuper = kQ3 ? kPackedQ3KSuperBytes : kPackedQ2KSuperBytes;
  const int64_t nsb = p.cols / kQkK;
  const Q8KTokens<NT> tok(p);
  const uint8x16_t m3 = vdupq_n_u8(3);
  float32x4_t acc[NH][NT][2];
  Zero(acc);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* sb = p.g + s * kSuper;
    const uint8_t* sc = sb + 8 * kBlock;
    const uint16_t* d16 = reinterpret_cast<const uint16_t*>(sc + 256);
    TRELLIS_UNROLL
    for (int hh = 0; hh < NH; ++hh) {
      const int h = h0 + hh;
      int32x4_t isum[NT][2];
      TRELLIS_UNROLL
      for (int t = 0; t < NT; ++t) isum[t][0] = isum[t][1] = vdupq_n_s32(0);
      for (int j = 0; j < 8; ++j) {
        const uint8_t* bl = sb + kBlock * j + 32 * h;
        TRELLIS_UNROLL
        for (int m = 0; m < 2; ++m) {
          const int grp = 2 * j + m;
          int8x16_t w[4][2];
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) {
            const uint8x16_t line = vld1q_u8(bl + 64 * m + 16 * k);
            uint8x16_t e[4] = {vandq_u8(line, m3), vandq_u8(vshrq_n_u8(line, 2), m3), vandq_u8(vshrq_n_u8(line, 4), m3),
                               vshrq_n_u8(line, 6)};
            if constexpr (kQ3) {
              // Bit 4 m + x of the high line is element x's 3rd bit: to bit 2.
              const uint8x16_t hb = vld1q_u8(bl + 128 + 16 * k);
              const uint8x16_t b2 = vdupq_n_u8(4);
              const uint8x16_t moved = m == 0 ? vshlq_n_u8(hb, 2) : vshrq_n_u8(hb, 2);  // bit 4 m -> 2
              e[0] = vorrq_u8(e[0], vandq_u8(moved, b2));
              e[1] = vorrq_u8(e[1], vandq_u8(vshrq_n_u8(moved, 1), b2));
              e[2] = vorrq_u8(e[2], vandq_u8(vshrq_n_u8(moved, 2), b2));
              e[3] = vorrq_u8(e[3], vandq_u8(vshrq_n_u8(moved, 3), b2));
            }
            TRELLIS_UNROLL
            for (int x = 0; x < 4; ++x) w[x][k] = vreinterpretq_s8_u8(e[x]);
          }
          int32x4_t scale[2];
          if constexpr (kQ3) {
            LoadS8x8(reinterpret_cast<const int8_t*>(sc) + 16 * grp + 8 * h, scale);
          } else {
            const uint16x8_t sc16 = vmovl_u8(vand_u8(vld1_u8(sc + 16 * grp + 8 * h), vdup_n_u8(15)));
            scale[0] = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc16)));
            scale[1] = vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(sc16)));
          }
          GroupDot(w, tok, kQkK * s + 16 * grp, [&](int t) { return kQ3 ? tok.bias16[t][16 * s + grp] / 8 : 0; },
                   scale, isum);
        }
      }
      AddSuperBlock(d16 + 8 * h, tok, s, isum, acc[hh]);
      if constexpr (!kQ3) {
        int32x4_t msum[NT][2];
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) msum[t][0] = msum[t][1] = vdupq_n_s32(0);
        for (int grp = 0; grp < 16; ++grp) {
          const uint16x8_t m16 = vmovl_u8(vshr_n_u8(vld1_u8(sc + 16 * grp + 8 * h), 4));
          const int32x4_t mins[2] = {vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(m16))),
                                     vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(m16)))};
          TRELLIS_UNROLL
          for (int t = 0; t < NT; ++t) {
            TRELLIS_UNROLL
            for (int k = 0; k < 2; ++k) msum[t][k] = vmlaq_n_s32(msum[t][k], mins[k], tok.bias16[t][16 * s + grp]);
          }
        }
        float32x4_t dmin[2];
        LoadF16x8(d16 + 16 + 8 * h, dmin);
        TRELLIS_UNROLL
        for (int t = 0; t < NT; ++t) {
          TRELLIS_UNROLL
          for (int k = 0; k < 2; ++k) {
            acc[hh][t][k] = vfmaq_f32(acc[hh][t][k], vcvtq_f32_s32(msum[t][k]),
                                      vmulq_n_f32(vmulq_n_f32(dmin[k], 1.0f / 32), tok.d[t][s]));
          }
        }
      }
    }
  }
  TRELLIS_UNROLL
  for (int hh = 0; hh < NH; ++hh) StoreHalf(p, h0 + hh, acc[hh]);
}

template <bool kQ3>
struct LowKKernel {
  template <int NT, int NH>
  static void Run(const PackedArgs& p, int h0) { HalfLowK<kQ3, NT, NH>(p, h0); }
};

struct Q6KKernel {
  template <int NT, int NH>
  static void Run(const PackedArgs& p, int h0) { HalfQ6K<NT, NH>(p, h0); }
};

template <GgmlType kType>
struct Q32Kernel {
  template <int NT, int NH>
  static void Run(const PackedArgs& p, int h0) { HalfQ32<kType, NT, NH>(p, h0); }
};
template <bool kQ5>
struct KKernel {
  template <int NT, int NH>
  static void Run(const PackedArgs& p, int h0) { HalfK<kQ5, NT, NH>(p, h0); }
};

// One group x NT tokens: tiles of 1-2 tokens run both halves in one pass over the blocks.
template <typename Kernel, int NT>
void TileHalves(const PackedArgs& p) {
  if constexpr (NT <= 2) {
    if (p.nr > 8) {
      Kernel::template Run<NT, 2>(p, 0);
      return;
    }
  }
  Kernel::template Run<NT, 1>(p, 0);
  if (p.nr > 8) Kernel::template Run<NT, 1>(p, 1);
}

// The driver hands tiles of up to kPackedMaxTokens tokens: run them 4 at a time.
template <typename Kernel>
void DispatchHalves(const PackedArgs& p) {
  static constexpr PackedFn kTable[kNeonPackedTokens] = {TileHalves<Kernel, 1>, TileHalves<Kernel, 2>,
                                                         TileHalves<Kernel, 3>, TileHalves<Kernel, 4>};
  PackedArgs q = p;
  for (int t0 = 0; t0 < p.nt; t0 += kNeonPackedTokens) {
    q.a = p.a + t0 * p.a_stride;
    q.y = p.y + t0 * p.y_stride;
    q.nt = std::min(kNeonPackedTokens, p.nt - t0);
    kTable[q.nt - 1](q);
  }
}

}  // namespace

PackedKernel GetPackedKernelNeonDot(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {DispatchHalves<Q32Kernel<GgmlType::kQ4_0>>, 1};
    case GgmlType::kQ5_0: return {DispatchHalves<Q32Kernel<GgmlType::kQ5_0>>, 1};
    case GgmlType::kQ5_1: return {DispatchHalves<Q32Kernel<GgmlType::kQ5_1>>, 1};
    case GgmlType::kQ8_0: return {DispatchHalves<Q32Kernel<GgmlType::kQ8_0>>, 1};
    case GgmlType::kIQ4_NL: return {DispatchHalves<Q32Kernel<GgmlType::kIQ4_NL>>, 1};
    case GgmlType::kQ4_K: return {DispatchHalves<KKernel<false>>, 1};
    case GgmlType::kQ5_K: return {DispatchHalves<KKernel<true>>, 1};
    case GgmlType::kQ6_K: return {DispatchHalves<Q6KKernel>, 1};
    case GgmlType::kIQ4_XS: return {DispatchHalves<IQ4XSKernel>, 1};
    case GgmlType::kQ2_K: return {DispatchHalves<LowKKernel<false>>, 1};
    case GgmlType::kQ3_K: return {DispatchHalves<LowKKernel<true>>, 1};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

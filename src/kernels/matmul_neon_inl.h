// aarch64 NEON tile kernels for MatMul over the GGUF (row-major) layouts, for Q4_0, Q8_0,
// Q4_K, Q5_K, Q6_K, F16, BF16 and F32 weights, and the read-only Q5_0, Q5_1, IQ4_NL, Q2_K,
// Q3_K and IQ4_XS. Included by
// matmul_neon.cc (ARMv8-A: an int8 dot of 16 lanes is vmull_s8 + vmlal_s8 into int16
// pairs, at most 2 x 128 x 127 = 32512, then vpadalq_s16 into int32) and by
// matmul_neondot.cc (ARMv8.2 dotprod: one sdot per 16 lanes), which defines
// TRELLIS_NEON_DOTPROD 1. Activations are the scratch rows of matmul_internal.h.
//
// A tile is up to 4 weight rows x 4 tokens; each row's blocks are loaded once for all the
// tile's tokens (NT dots per weight load). Per 32-element block the int32 dot is scaled
// by (weight scale x activation scale) into an f32x4 accumulator, summed across lanes at
// the end, as the scalar reference does block by block.
//
// Thread safety: pure functions.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/fp16.h"

#ifndef TRELLIS_NEON_DOTPROD
#define TRELLIS_NEON_DOTPROD 0
#endif

namespace trellis::matmul_internal {
namespace {

// acc += the four int32 partial dots of 16 int8 lanes of w and a.
inline int32x4_t Dot16(int32x4_t acc, int8x16_t w, int8x16_t a) {
#if TRELLIS_NEON_DOTPROD
  return vdotq_s32(acc, w, a);
#else
  int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(a));
  p = vmlal_s8(p, vget_high_s8(w), vget_high_s8(a));
  return vpadalq_s16(acc, p);
#endif
}

// One weight row of 32-element blocks (Q4_0 or Q8_0) against NT activation rows.
template <bool kQ4, int NT>
void DotRowQ(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  float32x4_t acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = vdupq_n_f32(0.f);
  const int64_t nb = cols / 32;
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t w0, w1;
    float dw;
    if constexpr (kQ4) {
      const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(w)[b];
      const uint8x16_t q = vld1q_u8(blk.qs);
      const int8x16_t eight = vdupq_n_s8(8);
      w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))), eight);
      w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
      dw = Fp16ToFp32(blk.d);
    } else {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
      w0 = vld1q_s8(blk.qs);
      w1 = vld1q_s8(blk.qs + 16);
      dw = Fp16ToFp32(blk.d);
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* q8 = reinterpret_cast<const int8_t*>(a[t]) + 32 * b;
      int32x4_t isum = Dot16(vdupq_n_s32(0), w0, vld1q_s8(q8));
      isum = Dot16(isum, w1, vld1q_s8(q8 + 16));
      const float da = reinterpret_cast<const float*>(a[t] + cols)[b];
      acc[t] = vmlaq_n_f32(acc[t], vcvtq_f32_s32(isum), dw * da);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = vaddvq_f32(acc[t]);
}

// The K-quants against Q8_K activations (matmul_internal.h): per super-block the int32
// sums are exact (each sub-block's dot in int32 lanes, times its integer scale, lanes
// added at the end), then folded into the f32 result with the scalar reference's
// expression, so a row's result does not depend on the tile it ran in.
struct Q8KRow {
  const int8_t* qs;
  const float* d;
  const int16_t* bsums;
};

template <int NT>
inline void Q8KRows(const uint8_t* const (&a)[NT], int64_t cols, Q8KRow (&out)[NT]) {
  for (int t = 0; t < NT; ++t) {
    out[t].qs = reinterpret_cast<const int8_t*>(a[t]);
    out[t].d = reinterpret_cast<const float*>(a[t] + cols);
    out[t].bsums = reinterpret_cast<const int16_t*>(a[t] + Q8KBsumsOffset(cols));
  }
}

// Q4_K (kQ5 false) and Q5_K rows: sub-block j's weights are nibbles of qs[32 (j / 2) ..]
// (low for even j), plus for Q5_K bit j of qh[l] as bit 4.
template <bool kQ5, int NT>
void DotRowQ45K(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  Q8KRow act[NT];
  Q8KRows(a, cols, act);
  float sum[NT] = {};
  const int64_t nb = cols / kQkK;
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    uint16_t d16, dmin16;
    if constexpr (kQ5) {
      const BlockQ5_K& blk = reinterpret_cast<const BlockQ5_K*>(w)[b];
      scales = blk.scales, qs = blk.qs, qh = blk.qh, d16 = blk.d, dmin16 = blk.dmin;
    } else {
      const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(w)[b];
      scales = blk.scales, qs = blk.qs, d16 = blk.d, dmin16 = blk.dmin;
    }
    int32_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      GetScaleMinK4(j, scales, &s, &m);
      sc[j] = s, mn[j] = m;
    }
    int32x4_t isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = vdupq_n_s32(0);
    uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
    if constexpr (kQ5) h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
    for (int c = 0; c < 4; ++c) {
      const uint8x16_t q0 = vld1q_u8(qs + 32 * c), q1 = vld1q_u8(qs + 32 * c + 16);
      uint8x16_t lo0 = vandq_u8(q0, m4), lo1 = vandq_u8(q1, m4);
      uint8x16_t hi0 = vshrq_n_u8(q0, 4), hi1 = vshrq_n_u8(q1, 4);
      if constexpr (kQ5) {
        const uint8x16_t b4 = vdupq_n_u8(0x10);
        const uint8x16_t bl = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * c)));
        const uint8x16_t bh = vdupq_n_u8(static_cast<uint8_t>(2u << (2 * c)));
        lo0 = vorrq_u8(lo0, vandq_u8(vtstq_u8(h0, bl), b4));
        lo1 = vorrq_u8(lo1, vandq_u8(vtstq_u8(h1, bl), b4));
        hi0 = vorrq_u8(hi0, vandq_u8(vtstq_u8(h0, bh), b4));
        hi1 = vorrq_u8(hi1, vandq_u8(vtstq_u8(h1, bh), b4));
      }
      for (int t = 0; t < NT; ++t) {
        const int8_t* q8 = act[t].qs + kQkK * b + 64 * c;
        int32x4_t dlo = Dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(lo0), vld1q_s8(q8));
        dlo = Dot16(dlo, vreinterpretq_s8_u8(lo1), vld1q_s8(q8 + 16));
        int32x4_t dhi = Dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(hi0), vld1q_s8(q8 + 32));
        dhi = Dot16(dhi, vreinterpretq_s8_u8(hi1), vld1q_s8(q8 + 48));
        isum[t] = vmlaq_n_s32(isum[t], dlo, sc[2 * c]);
        isum[t] = vmlaq_n_s32(isum[t], dhi, sc[2 * c + 1]);
      }
    }
    const float d = Fp16ToFp32(d16), dmin = Fp16ToFp32(dmin16);
    for (int t = 0; t < NT; ++t) {
      const int16_t* bs = act[t].bsums + 16 * b;
      int32_t msum = 0;
      for (int j = 0; j < 8; ++j) msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
      const float da = act[t].d[b];
      sum[t] += d * da * static_cast<float>(vaddvq_s32(isum[t])) - dmin * da * static_cast<float>(msum);
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
}

// Q6_K rows: per half h of a super-block, ql[64 h ..] and qh[32 h ..] give four runs of
// 32 elements (low/high nibbles of ql[l] and ql[l + 32], qh bits 0-1, 2-3, 4-5, 6-7), minus
// 32; each run is two 16-element groups with their own int8 scale.
template <int NT>
void DotRowQ6K(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  Q8KRow act[NT];
  Q8KRows(a, cols, act);
  float sum[NT] = {};
  const int64_t nb = cols / kQkK;
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(0x03);
  const int8x16_t m32 = vdupq_n_s8(32);
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w)[b];
    int32x4_t isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      for (int half = 0; half < 2; ++half) {  // l in [16 half, 16 half + 16)
        const uint8x16_t la = vld1q_u8(ql + 16 * half), lb = vld1q_u8(ql + 32 + 16 * half);
        const uint8x16_t hb = vld1q_u8(qh + 16 * half);
        int8x16_t q[4];
        q[0] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(la, m4), vshlq_n_u8(vandq_u8(hb, m3), 4))), m32);
        q[1] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(lb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4))), m32);
        q[2] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4))), m32);
        q[3] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4))), m32);
        for (int r = 0; r < 4; ++r) {
          const int e = 128 * h + 32 * r + 16 * half;  // first element of this group
          const int32_t scale = blk.scales[e / 16];
          for (int t = 0; t < NT; ++t) {
            const int32x4_t dot = Dot16(vdupq_n_s32(0), q[r], vld1q_s8(act[t].qs + kQkK * b + e));
            isum[t] = vmlaq_n_s32(isum[t], dot, scale);
          }
        }
      }
    }
    const float d = Fp16ToFp32(blk.d);
    for (int t = 0; t < NT; ++t) sum[t] += d * act[t].d[b] * static_cast<float>(vaddvq_s32(isum[t]));
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
}

// Float weights: 8 columns a step into two f32x4 accumulators per token. F16 weights meet
// the f16-rounded f32 activations; BF16 weights bf16 activations (both widened by a
// 16-bit shift); F32 weights f32 activations.
enum class FloatKind { kF16, kBf16, kF32 };

// 8 values of kind kKind from p + c (elements) widened to f32.
template <FloatKind kKind>
inline void LoadW8(const uint8_t* w, int64_t c, float32x4_t& lo, float32x4_t& hi) {
  if constexpr (kKind == FloatKind::kF16) {
    const float16x8_t h = vld1q_f16(reinterpret_cast<const float16_t*>(w) + c);
    lo = vcvt_f32_f16(vget_low_f16(h));
    hi = vcvt_high_f32_f16(h);
  } else if constexpr (kKind == FloatKind::kBf16) {
    const uint16x8_t h = vld1q_u16(reinterpret_cast<const uint16_t*>(w) + c);
    lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
    hi = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16));
  } else {
    lo = vld1q_f32(reinterpret_cast<const float*>(w) + c);
    hi = vld1q_f32(reinterpret_cast<const float*>(w) + c + 4);
  }
}

template <FloatKind kKind>
inline float ScalarW(const uint8_t* w, int64_t c) {
  if constexpr (kKind == FloatKind::kF16) return Fp16ToFp32(reinterpret_cast<const uint16_t*>(w)[c]);
  else if constexpr (kKind == FloatKind::kBf16) return Bf16ToFp32(reinterpret_cast<const uint16_t*>(w)[c]);
  else return reinterpret_cast<const float*>(w)[c];
}

// The activations' kind for kKind weights: bf16 for BF16, f32 (f16-rounded for F16) else.
template <FloatKind kKind>
inline constexpr FloatKind kActKind = kKind == FloatKind::kBf16 ? FloatKind::kBf16 : FloatKind::kF32;

template <FloatKind kKind, int NT>
void DotRowFloat(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  float32x4_t acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = vdupq_n_f32(0.f);
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    float32x4_t wl, wh;
    LoadW8<kKind>(w, c, wl, wh);
    for (int t = 0; t < NT; ++t) {
      float32x4_t al, ah;
      LoadW8<kActKind<kKind>>(a[t], c, al, ah);
      acc0[t] = vfmaq_f32(acc0[t], wl, al);
      acc1[t] = vfmaq_f32(acc1[t], wh, ah);
    }
  }
  for (int t = 0; t < NT; ++t) {
    float s = vaddvq_f32(vaddq_f32(acc0[t], acc1[t]));
    for (int64_t k = c; k < cols; ++k) s += ScalarW<kKind>(w, k) * ScalarW<kActKind<kKind>>(a[t], k);
    out[t] = s;
  }
}

// ---- the read-only low-bit types (quant.h): each block unpacked to int8 lanes, the same
// integer sums as the scalar kernels, folded into f32 per block as they are ----

// 16 bytes, byte k = 0x10 where bit k of the 16 bits at p is set (the 5th bits of Q5_x).
inline uint8x16_t FifthBits(const uint8_t* p) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
  return vandq_u8(vtstq_u8(spread, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}

// Q5_0 (kType), Q5_1 and IQ4_NL rows against Q8_0 activations.
template <GgmlType kType, int NT>
void DotRowBlock32(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  constexpr int64_t kBytes = kType == GgmlType::kQ5_0 ? 22 : kType == GgmlType::kQ5_1 ? 24 : 18;
  const int8x16_t grid = vld1q_s8(kIq4NlValues);
  float sum[NT] = {};
  const int64_t nb = cols / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + kBytes * b;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float dw = Fp16ToFp32(dh);
    int8x16_t w0, w1;
    if constexpr (kType == GgmlType::kIQ4_NL) {
      const uint8x16_t q = vld1q_u8(blk + 2);
      w0 = vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0x0F)));
      w1 = vqtbl1q_s8(grid, vshrq_n_u8(q, 4));
    } else {
      constexpr int kQh = kType == GgmlType::kQ5_0 ? 2 : 4;
      const uint8x16_t q = vld1q_u8(blk + kQh + 4);
      const uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), FifthBits(blk + kQh));
      const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), FifthBits(blk + kQh + 2));
      w0 = vreinterpretq_s8_u8(lo);
      w1 = vreinterpretq_s8_u8(hi);
      if constexpr (kType == GgmlType::kQ5_0) {
        w0 = vsubq_s8(w0, vdupq_n_s8(16));
        w1 = vsubq_s8(w1, vdupq_n_s8(16));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* q8 = reinterpret_cast<const int8_t*>(a[t]) + 32 * b;
      const int32_t isum = vaddvq_s32(Dot16(Dot16(vdupq_n_s32(0), w0, vld1q_s8(q8)), w1, vld1q_s8(q8 + 16)));
      const float da = reinterpret_cast<const float*>(a[t] + cols)[b];
      if constexpr (kType == GgmlType::kQ5_1) {
        uint16_t mh;
        std::memcpy(&mh, blk + 2, 2);
        const int32_t asum = reinterpret_cast<const int32_t*>(a[t] + Q8_0SumOffset(cols))[b];
        sum[t] += static_cast<float>(isum) * (dw * da) + Fp16ToFp32(mh) * da * static_cast<float>(asum);
      } else {
        sum[t] += static_cast<float>(isum) * (dw * da);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
}

// Q2_K and Q3_K rows: 32 bytes of qs hold elements 128 n + 32 j + l at bits 2 j; groups of
// 16 take the scale of their group.
template <bool kQ3, int NT>
void DotRowQ23K(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  Q8KRow act[NT];
  Q8KRows(a, cols, act);
  float sum[NT] = {};
  const int64_t nb = cols / kQkK;
  const uint8x16_t m3 = vdupq_n_u8(3);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qs;
    const uint8_t* hmask = nullptr;
    int sc[16], mn[16] = {};
    float d, dmin = 0;
    if constexpr (kQ3) {
      const BlockQ3_K& blk = reinterpret_cast<const BlockQ3_K*>(w)[b];
      qs = blk.qs, hmask = blk.hmask, d = Fp16ToFp32(blk.d);
      for (int g = 0; g < 16; ++g) sc[g] = Q3KScale(blk, g);
    } else {
      const BlockQ2_K& blk = reinterpret_cast<const BlockQ2_K*>(w)[b];
      qs = blk.qs, d = Fp16ToFp32(blk.d), dmin = Fp16ToFp32(blk.dmin);
      for (int g = 0; g < 16; ++g) sc[g] = blk.scales[g] & 0xF, mn[g] = blk.scales[g] >> 4;
    }
    int32_t isum[NT] = {};
    for (int n = 0; n < 2; ++n) {
      const uint8x16_t q0 = vld1q_u8(qs + 32 * n), q1 = vld1q_u8(qs + 32 * n + 16);
      uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
      if constexpr (kQ3) h0 = vld1q_u8(hmask), h1 = vld1q_u8(hmask + 16);
      for (int j = 0; j < 4; ++j) {
        const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * j));
        int8x16_t v0 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, shift), m3));
        int8x16_t v1 = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, shift), m3));
        if constexpr (kQ3) {
          const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1 << (4 * n + j)));
          const uint8x16_t four = vdupq_n_u8(4);
          v0 = vsubq_s8(v0, vreinterpretq_s8_u8(vandq_u8(vceqq_u8(vandq_u8(h0, bit), vdupq_n_u8(0)), four)));
          v1 = vsubq_s8(v1, vreinterpretq_s8_u8(vandq_u8(vceqq_u8(vandq_u8(h1, bit), vdupq_n_u8(0)), four)));
        }
        const int g = 8 * n + 2 * j;
        for (int t = 0; t < NT; ++t) {
          const int8_t* q8 = act[t].qs + kQkK * b + 128 * n + 32 * j;
          isum[t] += sc[g] * vaddvq_s32(Dot16(vdupq_n_s32(0), v0, vld1q_s8(q8))) +
                     sc[g + 1] * vaddvq_s32(Dot16(vdupq_n_s32(0), v1, vld1q_s8(q8 + 16)));
        }
      }
    }
    for (int t = 0; t < NT; ++t) {
      if constexpr (kQ3) {
        sum[t] += act[t].d[b] * d * static_cast<float>(isum[t]);
      } else {
        int32_t msum = 0;
        for (int g = 0; g < 16; ++g) msum += mn[g] * act[t].bsums[16 * b + g];
        sum[t] += act[t].d[b] * (d * static_cast<float>(isum[t]) - dmin * static_cast<float>(msum));
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
}

template <int NT>
void DotRowIQ4XS(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
  Q8KRow act[NT];
  Q8KRows(a, cols, act);
  const int8x16_t grid = vld1q_s8(kIq4NlValues);
  float sum[NT] = {};
  for (int64_t b = 0; b < cols / kQkK; ++b) {
    const BlockIQ4_XS& blk = reinterpret_cast<const BlockIQ4_XS*>(w)[b];
    int32_t isum[NT] = {};
    for (int j = 0; j < 8; ++j) {
      const uint8x16_t q = vld1q_u8(blk.qs + 16 * j);
      const int8x16_t w0 = vqtbl1q_s8(grid, vandq_u8(q, vdupq_n_u8(0x0F)));
      const int8x16_t w1 = vqtbl1q_s8(grid, vshrq_n_u8(q, 4));
      const int s = IQ4XsScale(blk, j);
      for (int t = 0; t < NT; ++t) {
        const int8_t* q8 = act[t].qs + kQkK * b + 32 * j;
        isum[t] += s * vaddvq_s32(Dot16(Dot16(vdupq_n_s32(0), w0, vld1q_s8(q8)), w1, vld1q_s8(q8 + 16)));
      }
    }
    const float d = Fp16ToFp32(blk.d);
    for (int t = 0; t < NT; ++t) sum[t] += act[t].d[b] * d * static_cast<float>(isum[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = sum[t];
}

// Rows [0, nr) x tokens [0, nt) of the tile, each row once per chunk of up to 4 tokens.
template <template <int> class Row>
void NeonTile(const TileArgs& p) {
  for (int r = 0; r < p.nr; ++r) {
    const uint8_t* w = p.w + r * p.w_stride;
    for (int t0 = 0; t0 < p.nt; t0 += 4) {
      const int n = p.nt - t0 < 4 ? p.nt - t0 : 4;
      const uint8_t* base = p.a + t0 * p.a_stride;
      float* y = p.y + t0 * p.y_stride + r;
      auto run = [&](auto nt_const) {
        constexpr int NT = decltype(nt_const)::value;
        const uint8_t* a[NT];
        for (int t = 0; t < NT; ++t) a[t] = base + t * p.a_stride;
        float out[NT];
        Row<NT>::Run(w, a, p.cols, out);
        for (int t = 0; t < NT; ++t) y[t * p.y_stride] = out[t];
      };
      switch (n) {
        case 1: run(std::integral_constant<int, 1>{}); break;
        case 2: run(std::integral_constant<int, 2>{}); break;
        case 3: run(std::integral_constant<int, 3>{}); break;
        default: run(std::integral_constant<int, 4>{}); break;
      }
    }
  }
}

template <int NT>
struct RowQ4_0 {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowQ<true, NT>(w, a, cols, out);
  }
};
template <int NT>
struct RowQ8_0 {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowQ<false, NT>(w, a, cols, out);
  }
};
template <int NT>
struct RowQ4_K {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowQ45K<false, NT>(w, a, cols, out);
  }
};
template <int NT>
struct RowQ5_K {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowQ45K<true, NT>(w, a, cols, out);
  }
};
template <int NT>
struct RowQ6_K {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowQ6K<NT>(w, a, cols, out);
  }
};
template <GgmlType kType>
struct RowBlock32 {
  template <int NT>
  struct Of {
    static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
      DotRowBlock32<kType, NT>(w, a, cols, out);
    }
  };
};
template <bool kQ3>
struct RowQ23K {
  template <int NT>
  struct Of {
    static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
      DotRowQ23K<kQ3, NT>(w, a, cols, out);
    }
  };
};
template <int NT>
struct RowIQ4XS {
  static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
    DotRowIQ4XS<NT>(w, a, cols, out);
  }
};
template <FloatKind kKind>
struct RowFloat {
  template <int NT>
  struct Of {
    static void Run(const uint8_t* w, const uint8_t* const (&a)[NT], int64_t cols, float (&out)[NT]) {
      DotRowFloat<kKind, NT>(w, a, cols, out);
    }
  };
};

}  // namespace

// The tile for `type` built by the including file ({} if none: the scalar tile runs).
inline TileKernel TileKernelNeonFamily(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {NeonTile<RowQ4_0>, 4, 4};
    case GgmlType::kQ8_0: return {NeonTile<RowQ8_0>, 4, 4};
    case GgmlType::kQ4_K: return {NeonTile<RowQ4_K>, 4, 4};
    case GgmlType::kQ5_K: return {NeonTile<RowQ5_K>, 4, 4};
    case GgmlType::kQ6_K: return {NeonTile<RowQ6_K>, 4, 4};
    case GgmlType::kQ5_0: return {NeonTile<RowBlock32<GgmlType::kQ5_0>::Of>, 4, 4};
    case GgmlType::kQ5_1: return {NeonTile<RowBlock32<GgmlType::kQ5_1>::Of>, 4, 4};
    case GgmlType::kIQ4_NL: return {NeonTile<RowBlock32<GgmlType::kIQ4_NL>::Of>, 4, 4};
    case GgmlType::kQ2_K: return {NeonTile<RowQ23K<false>::Of>, 4, 4};
    case GgmlType::kQ3_K: return {NeonTile<RowQ23K<true>::Of>, 4, 4};
    case GgmlType::kIQ4_XS: return {NeonTile<RowIQ4XS>, 4, 4};
    case GgmlType::kF16: return {NeonTile<RowFloat<FloatKind::kF16>::Of>, 4, 4};
    case GgmlType::kBF16: return {NeonTile<RowFloat<FloatKind::kBf16>::Of>, 4, 4};
    case GgmlType::kF32: return {NeonTile<RowFloat<FloatKind::kF32>::Of>, 4, 4};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

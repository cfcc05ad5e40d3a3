// aarch64 NEON tile kernels for MatMul over the GGUF (row-major) layouts, for Q4_0, Q8_0,
// F16, BF16 and F32 weights; the K-quants run the scalar tiles on ARM for now. Included by
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
    case GgmlType::kF16: return {NeonTile<RowFloat<FloatKind::kF16>::Of>, 4, 4};
    case GgmlType::kBF16: return {NeonTile<RowFloat<FloatKind::kBf16>::Of>, 4, 4};
    case GgmlType::kF32: return {NeonTile<RowFloat<FloatKind::kF32>::Of>, 4, 4};
    default: return {};
  }
}

}  // namespace trellis::matmul_internal

// SIMD vector traits shared by the ISA-specific kernel files (ops_avx2.cc,
// ops_avx512.cc, attention_avx2.cc, attention_avx512.cc on x86-64; ops_neon.cc and
// attention_neon.cc on aarch64).
//
// INCLUDE ONLY from those files: everything here lives in an anonymous namespace so each
// translation unit gets its own copy compiled for its own ISA flags (no ODR clash between
// the AVX2 and AVX-512 builds of the same helper).
//
// V256 (AVX2 + FMA + F16C, 8 lanes) is defined on x86-64; V512 (AVX-512F, 16 lanes) only
// when compiled with -mavx512f; V128 (NEON, 4 lanes) on aarch64. They expose the same
// static interface so kernels can be written once as templates over the traits type.
//
// Thread safety: stateless.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics (the
// _mm512_undefined_* placeholders). The warning is located in <immintrin.h>, so it must be
// silenced before that header is first included; these files are only included by the
// ISA-specific translation units, so the scope is just those files.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "ops_simd_inl.h needs -mavx2 -mfma -mf16c"
#endif

#include <immintrin.h>
#define TRELLIS_SIMD_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define TRELLIS_SIMD_X86 0
#else
#error "ops_simd_inl.h: no vector traits for this architecture"
#endif

#include <cstdint>

namespace trellis {
namespace {

#if TRELLIS_SIMD_X86

// In-register transpose of an 8x8 float tile: r[i][j] <-> r[j][i].
inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]);
  const __m256 t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]);
  const __m256 t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]);
  const __m256 t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]);
  const __m256 t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

struct V256 {
  using F = __m256;
  static constexpr int kW = 8;
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  // p: [8] IEEE f16.
  static F LoadHalf(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // p: [8] int8 -> f32 (quantized K/V rows).
  static F LoadI8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Zero() { return _mm256_setzero_ps(); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }  // a * b + c
  static float HSum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float HMax(F v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F Round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // 2^n for integral-valued n in [-126, 127].
  static F Pow2(F n) {
    const __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(i, 23));
  }
  // Lanewise a <= b ? x : y.
  static F SelectLE(F a, F b, F x, F y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LE_OQ)); }
  // Lanes i >= n (0 <= n <= 8) set to `fill`.
  static F MaskTail(F v, int n, float fill) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
    return _mm256_blendv_ps(_mm256_set1_ps(fill), v, keep);
  }
  // dst[j * dst_stride + i] = f32(src[i * src_stride + j]) for i, j < 8: an 8x8 tile of
  // f16 rows, converted and transposed.
  static void KTile8x8(const uint16_t* src, int src_stride, float* dst, int dst_stride) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = LoadHalf(src + i * src_stride);
    Transpose8x8(r);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * dst_stride, r[j]);
  }
  // The same for an 8x8 tile of f32 rows (dequantized K).
  static void Transpose8x8F32(const float* src, int src_stride, float* dst, int dst_stride) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
    Transpose8x8(r);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * dst_stride, r[j]);
  }
};

#ifdef __AVX512F__
struct V512 {
  using F = __m512;
  static constexpr int kW = 16;
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F LoadHalf(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadI8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Zero() { return _mm512_setzero_ps(); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  // (Not _mm512_reduce_*: GCC 12 warns maybe-uninitialized inside them.)
  static __m256 Hi(F v) {
    return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xff, _mm512_castps_pd(v), 1));
  }
  static float HSum(F v) { return V256::HSum(_mm256_add_ps(_mm512_castps512_ps256(v), Hi(v))); }
  static float HMax(F v) { return V256::HMax(_mm256_max_ps(_mm512_castps512_ps256(v), Hi(v))); }
  static F Round(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F Pow2(F n) {
    const __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(i, 23));
  }
  static F SelectLE(F a, F b, F x, F y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LE_OQ), y, x); }
  static F MaskTail(F v, int n, float fill) {
    const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1u);
    return _mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), v);
  }
  static void KTile8x8(const uint16_t* src, int src_stride, float* dst, int dst_stride) {
    V256::KTile8x8(src, src_stride, dst, dst_stride);
  }
  static void Transpose8x8F32(const float* src, int src_stride, float* dst, int dst_stride) {
    V256::Transpose8x8F32(src, src_stride, dst, dst_stride);
  }
};
#endif

#else  // aarch64

struct V128 {
  using F = float32x4_t;
  static constexpr int kW = 4;
  static F Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, F v) { vst1q_f32(p, v); }
  // p: [4] IEEE f16.
  static F LoadHalf(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  // p: [4] int8.
  static F LoadI8(const int8_t* p) {
    int8_t b[8] = {p[0], p[1], p[2], p[3], 0, 0, 0, 0};
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(b)))));
  }
  static F Set1(float x) { return vdupq_n_f32(x); }
  static F Zero() { return vdupq_n_f32(0.0f); }
  static F Add(F a, F b) { return vaddq_f32(a, b); }
  static F Sub(F a, F b) { return vsubq_f32(a, b); }
  static F Mul(F a, F b) { return vmulq_f32(a, b); }
  static F Div(F a, F b) { return vdivq_f32(a, b); }
  static F Max(F a, F b) { return vmaxq_f32(a, b); }
  static F Min(F a, F b) { return vminq_f32(a, b); }
  static F Fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }  // a * b + c
  static float HSum(F v) { return vaddvq_f32(v); }
  static float HMax(F v) { return vmaxvq_f32(v); }
  static F Round(F x) { return vrndnq_f32(x); }  // to nearest, ties to even
  // 2^n for integral-valued n in [-126, 127].
  static F Pow2(F n) {
    const int32x4_t i = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));
    return vreinterpretq_f32_s32(vshlq_n_s32(i, 23));
  }
  static F SelectLE(F a, F b, F x, F y) { return vbslq_f32(vcleq_f32(a, b), x, y); }
  // Lanes i >= n (n <= 4) set to `fill`.
  static F MaskTail(F v, int n, float fill) {
    static constexpr int32_t kIdx[4] = {0, 1, 2, 3};
    const uint32x4_t keep = vcltq_s32(vld1q_s32(kIdx), vdupq_n_s32(n));
    return vbslq_f32(keep, v, vdupq_n_f32(fill));
  }
  // As V256::KTile8x8: four 4x4 transposes.
  static void KTile8x8(const uint16_t* src, int src_stride, float* dst, int dst_stride) {
    Tile8x8(src, src_stride, dst, dst_stride);
  }
  static void Transpose8x8F32(const float* src, int src_stride, float* dst, int dst_stride) {
    Tile8x8(src, src_stride, dst, dst_stride);
  }
  static F LoadRow(const uint16_t* p) { return LoadHalf(p); }
  static F LoadRow(const float* p) { return Load(p); }
  template <typename T>
  static void Tile8x8(const T* src, int src_stride, float* dst, int dst_stride) {
#pragma GCC unroll 2
    for (int bi = 0; bi < 2; ++bi) {
#pragma GCC unroll 2
      for (int bj = 0; bj < 2; ++bj) {
        F r[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) r[i] = LoadRow(src + (4 * bi + i) * src_stride + 4 * bj);
        const F t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
        const F t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
        float* d = dst + 4 * bj * dst_stride + 4 * bi;
        vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
        vst1q_f32(d + dst_stride, vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
        vst1q_f32(d + 2 * dst_stride, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))));
        vst1q_f32(d + 3 * dst_stride, vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))));
      }
    }
  }
};

#endif  // TRELLIS_SIMD_X86


// exp(x) lane-wise, relative error ~2e-7 for x in [-87, 88]; inputs are clamped to
// that range (so exp(-inf) gives ~1.6e-38, not 0: callers that need an exact 0 mask).
template <typename V>
inline typename V::F ExpV(typename V::F x) {
  using F = typename V::F;
  x = V::Min(V::Max(x, V::Set1(-87.0f)), V::Set1(88.0f));
  const F n = V::Round(V::Mul(x, V::Set1(1.44269504088896341f)));
  F r = V::Fma(n, V::Set1(-0.693359375f), x);
  r = V::Fma(n, V::Set1(2.12194440e-4f), r);
  F p = V::Set1(1.9875691500e-4f);
  p = V::Fma(p, r, V::Set1(1.3981999507e-3f));
  p = V::Fma(p, r, V::Set1(8.3334519073e-3f));
  p = V::Fma(p, r, V::Set1(4.1665795894e-2f));
  p = V::Fma(p, r, V::Set1(1.6666665459e-1f));
  p = V::Fma(p, r, V::Set1(5.0000001201e-1f));
  p = V::Fma(p, V::Mul(r, r), V::Add(r, V::Set1(1.0f)));
  return V::Mul(p, V::Pow2(n));
}

// Row kernels written once over the traits (the public wrappers live in ops_*.cc).

template <typename V>
void RmsNormT(const float* x, const float* weight, int64_t n, float eps, float* out) {
  constexpr int W = V::kW;
  typename V::F acc0 = V::Zero(), acc1 = V::Zero();
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const auto a = V::Load(x + i), b = V::Load(x + i + W);
    acc0 = V::Fma(a, a, acc0);
    acc1 = V::Fma(b, b, acc1);
  }
  for (; i + W <= n; i += W) {
    const auto a = V::Load(x + i);
    acc0 = V::Fma(a, a, acc0);
  }
  float sum = V::HSum(V::Add(acc0, acc1));
  for (; i < n; ++i) sum += x[i] * x[i];
  const float s = 1.0f / __builtin_sqrtf(sum / static_cast<float>(n) + eps);
  const auto vs = V::Set1(s);
  i = 0;
  for (; i + W <= n; i += W) {
    V::Store(out + i, V::Mul(V::Mul(V::Load(x + i), vs), V::Load(weight + i)));
  }
  for (; i < n; ++i) out[i] = x[i] * s * weight[i];
}

template <typename V>
void SoftmaxT(float* x, int64_t n) {
  constexpr int W = V::kW;
  float mx = x[0];
  int64_t i = 0;
  if (n >= W) {
    auto m = V::Load(x);
    for (i = W; i + W <= n; i += W) m = V::Max(m, V::Load(x + i));
    mx = V::HMax(m);
  }
  for (; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  const auto vmx = V::Set1(mx);
  auto acc = V::Zero();
  i = 0;
  for (; i + W <= n; i += W) {
    const auto e = ExpV<V>(V::Sub(V::Load(x + i), vmx));
    V::Store(x + i, e);
    acc = V::Add(acc, e);
  }
  float sum = V::HSum(acc);
  for (; i < n; ++i) {
    x[i] = __builtin_expf(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  const auto vinv = V::Set1(inv);
  i = 0;
  for (; i + W <= n; i += W) V::Store(x + i, V::Mul(V::Load(x + i), vinv));
  for (; i < n; ++i) x[i] *= inv;
}

template <typename V>
void SwiGluT(const float* gate, const float* up, float* out, int64_t n) {
  constexpr int W = V::kW;
  const auto one = V::Set1(1.0f);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const auto g = V::Load(gate + i);
    const auto e = ExpV<V>(V::Sub(V::Zero(), g));
    V::Store(out + i, V::Mul(V::Div(g, V::Add(one, e)), V::Load(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + __builtin_expf(-gate[i])) * up[i];
}

template <typename V>
void GeGluT(const float* gate, const float* up, float* out, int64_t n) {
  constexpr int W = V::kW;
  constexpr float kC2 = -2.0f * 0.7978845608f;  // -2 sqrt(2/pi)
  const auto one = V::Set1(1.0f), c2 = V::Set1(kC2), a = V::Set1(0.044715f);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const auto g = V::Load(gate + i);
    const auto inner = V::Fma(V::Mul(a, g), V::Mul(g, g), g);  // g + 0.044715 g^3
    const auto e = ExpV<V>(V::Mul(c2, inner));                 // exp(-2u), clamped: finite
    V::Store(out + i, V::Mul(V::Div(g, V::Add(one, e)), V::Load(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + __builtin_expf(kC2 * (g + 0.044715f * g * g * g))) * up[i];
  }
}

}  // namespace
}  // namespace trellis

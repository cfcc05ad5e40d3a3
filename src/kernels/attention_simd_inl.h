// The SIMD tile kernel of PagedAttention, written once over the vector traits of
// ops_simd_inl.h and instantiated by attention_avx2.cc (V256), attention_avx512.cc (V512,
// and V256 for shapes that are not multiples of 16) and attention_neon.cc (V128).
//
// INCLUDE ONLY from *_avx2.cc / *_avx512.cc / *_neon.cc (anonymous namespace; see
// ops_simd_inl.h).
//
// Per block of block_size positions the kernel:
//   1. converts the K tile f16 -> f32 *transposed* into kt[d][t] (8x8 tiles), so a
//      query's scores for W slots are W-lane FMAs of broadcast q[d] with kt[d][...] and
//      need no horizontal sums; all queries of the tile (rows x GQA heads) reuse it;
//   2. converts the V tile f16 -> f32 into vt[t][d];
//   3. per query: masks slots past its causal end, online-softmax update of (m, l) and
//      acc = acc * exp(m_old - m_new) + sum_t p_t * v_t.
// Thread safety: touches only the tile's output rows and its scratch.
#pragma once

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics (the
// _mm512_undefined_* placeholders). The warning is located in <immintrin.h>, so it must be
// silenced before that header is first included; these files are only included by the
// ISA-specific translation units, so the scope is just those files.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/attention_internal.h"
#include "kernels/ops_simd_inl.h"
#include "kernels/unroll.h"


namespace trellis {
namespace {

// s[qq][c*W..] = sum_d qs[qq][d] * kt[d][c*W..], qq < NQ, c < NC.
// qs: [NQ][hd], kt: [hd][bs], s: [NQ][bs].
template <typename V, int NQ, int NC>
inline void ScoreTile(const float* qs, int hd, const float* kt, int bs, float* s) {
  using F = typename V::F;
  constexpr int W = V::kW;
  F a[NQ][NC];
  TRELLIS_UNROLL
  for (int qq = 0; qq < NQ; ++qq) {
    TRELLIS_UNROLL
    for (int c = 0; c < NC; ++c) a[qq][c] = V::Zero();
  }
  for (int d = 0; d < hd; ++d) {
    F k[NC];
    TRELLIS_UNROLL
    for (int c = 0; c < NC; ++c) k[c] = V::Load(kt + d * bs + c * W);
    TRELLIS_UNROLL
    for (int qq = 0; qq < NQ; ++qq) {
      const F qd = V::Set1(qs[qq * hd + d]);
      TRELLIS_UNROLL
      for (int c = 0; c < NC; ++c) a[qq][c] = V::Fma(qd, k[c], a[qq][c]);
    }
  }
  TRELLIS_UNROLL
  for (int qq = 0; qq < NQ; ++qq) {
    TRELLIS_UNROLL
    for (int c = 0; c < NC; ++c) V::Store(s + qq * bs + c * W, a[qq][c]);
  }
}

// Scores of NQ queries over n_chunks chunks of W slots (any count), in groups of <= 4.
template <typename V, int NQ>
inline void ScoreQueries(const float* qs, int hd, const float* kt, int bs, int n_chunks,
                         float* s) {
  constexpr int W = V::kW;
  for (int c0 = 0; c0 < n_chunks; c0 += 4) {
    const float* k = kt + c0 * W;
    float* out = s + c0 * W;
    switch (std::min(4, n_chunks - c0)) {
      case 1: ScoreTile<V, NQ, 1>(qs, hd, k, bs, out); break;
      case 2: ScoreTile<V, NQ, 2>(qs, hd, k, bs, out); break;
      case 3: ScoreTile<V, NQ, 3>(qs, hd, k, bs, out); break;
      default: ScoreTile<V, NQ, 4>(qs, hd, k, bs, out); break;
    }
  }
}

// a[0 .. G*W) = a * corr + sum_{j < n} p[j] * vt[j][0 .. G*W), vt row stride hd.
template <typename V, int G>
inline void AccumulateV(float* a, float corr, const float* p, int n, const float* vt, int hd) {
  using F = typename V::F;
  constexpr int W = V::kW;
  F acc[G];
  const F vc = V::Set1(corr);
  TRELLIS_UNROLL
  for (int g = 0; g < G; ++g) acc[g] = V::Mul(V::Load(a + g * W), vc);
  for (int j = 0; j < n; ++j) {
    const F pj = V::Set1(p[j]);
    const float* vr = vt + j * hd;
    TRELLIS_UNROLL
    for (int g = 0; g < G; ++g) acc[g] = V::Fma(pj, V::Load(vr + g * W), acc[g]);
  }
  TRELLIS_UNROLL
  for (int g = 0; g < G; ++g) V::Store(a + g * W, acc[g]);
}

// REQUIRES: head_dim % W == 0, block_size % W == 0, head_dim % 8 == 0.
template <typename V>
void AttnTileT(const internal::AttnTile& t) {
  using F = typename V::F;
  constexpr int W = V::kW;
  constexpr int kNq = W == 16 ? 4 : 2;  // queries per score pass (register budget)
  constexpr int kMaxG = 8;              // accumulator vectors per V pass
  constexpr int kMaxQ = internal::kAttnMaxQueries;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int hd = t.head_dim, bs = t.block_size;
  const int nq = t.n_rows * t.n_heads;
  float* kt = t.scratch;       // [hd][bs]
  float* vt = kt + bs * hd;    // [bs][hd]
  float* qs = vt + bs * hd;    // [kMaxQ][hd]
  float* s = qs + kMaxQ * hd;  // [kMaxQ][bs]
  float* acc = s + kMaxQ * bs;  // [kMaxQ][hd]
  float* m = acc + kMaxQ * hd;  // [kMaxQ]
  float* l = m + kMaxQ;         // [kMaxQ]

  const F vscale = V::Set1(t.scale);
  for (int qi = 0; qi < nq; ++qi) {
    const float* src = t.q + (qi / t.n_heads) * t.q_stride + (qi % t.n_heads) * hd;
    for (int d = 0; d < hd; d += W) {
      V::Store(qs + qi * hd + d, V::Mul(V::Load(src + d), vscale));
      V::Store(acc + qi * hd + d, V::Zero());
    }
    m[qi] = kNegInf;
    l[qi] = 0.0f;
  }

  const int32_t kv_end = t.pos_first + t.n_rows;  // exclusive end for the last row
  const F vcap = V::Set1(t.softcap), vinv_cap = V::Set1(t.softcap > 0 ? 1.0f / t.softcap : 0.0f);
  const F one = V::Set1(1.0f), two = V::Set1(2.0f);
  for (int32_t p0 = internal::AttnTileFirstPos(t) / bs * bs; p0 < kv_end; p0 += bs) {
    const uint16_t* blk = reinterpret_cast<const uint16_t*>(
        t.base + static_cast<size_t>(t.block_table[p0 / bs]) * t.block_bytes);
    const int nvalid = std::min(bs, kv_end - p0);
    // K slots converted (<= bs, whole 8x8 tiles and whole vectors); extra are masked.
    constexpr int kSlots = W > 8 ? W : 8;
    const int nkt = (nvalid + kSlots - 1) / kSlots * kSlots;
    // 1. K tile -> kt[d][t], transposed 8x8 at a time.
    const uint16_t* kblk = blk + t.k_off;
    for (int t0 = 0; t0 < nkt; t0 += 8) {
      for (int d0 = 0; d0 < hd; d0 += 8) V::KTile8x8(kblk + t0 * hd + d0, hd, kt + d0 * bs + t0, bs);
    }
    // 2. V tile -> vt[t][d] (valid slots only: unwritten slots may hold NaN bits).
    const uint16_t* vblk = blk + t.v_off;
    for (int i = 0; i < nvalid * hd; i += W) V::Store(vt + i, V::LoadHalf(vblk + i));

    // 3a. Raw scores of all queries.
    const int n_chunks = nkt / W;
    int qi = 0;
    for (; qi + kNq <= nq; qi += kNq) {
      ScoreQueries<V, kNq>(qs + qi * hd, hd, kt, bs, n_chunks, s + qi * bs);
    }
    for (; qi < nq; ++qi) ScoreQueries<V, 1>(qs + qi * hd, hd, kt, bs, n_chunks, s + qi * bs);

    // 3b. Per query: soft-cap, causal and window masks, online softmax, V accumulation.
    for (qi = 0; qi < nq; ++qi) {
      const int n = std::min(bs, t.pos_first + qi / t.n_heads + 1 - p0);
      const int lo = internal::AttnRowFirstSlot(t, qi / t.n_heads, p0);
      if (n <= lo) continue;
      float* sq = s + qi * bs;
      const int nc = (n + W - 1) / W;
      if (t.softcap > 0) {
        // cap * tanh(x / cap), tanh(y) = 1 - 2 / (1 + exp(2y)) (ExpV clamps: no inf/NaN).
        for (int c = 0; c < nc; ++c) {
          const F y = V::Mul(V::Load(sq + c * W), vinv_cap);
          const F th = V::Sub(one, V::Div(two, V::Add(one, ExpV<V>(V::Add(y, y)))));
          V::Store(sq + c * W, V::Mul(vcap, th));
        }
      }
      for (int j = 0; j < lo; ++j) sq[j] = kNegInf;  // before the sliding window
      F mx = V::Set1(kNegInf);
      for (int c = 0; c < nc; ++c) {
        F v = V::Load(sq + c * W);
        if (n - c * W < W) v = V::MaskTail(v, n - c * W, kNegInf);
        mx = V::Max(mx, v);
      }
      const float m_new = std::max(m[qi], V::HMax(mx));
      // Rescale only when the running max moved (exp(-inf) = 0 on the first block).
      const float corr = m_new == m[qi] ? 1.0f : std::exp(m[qi] - m_new);
      const F vm = V::Set1(m_new);
      F sum = V::Zero();
      for (int c = 0; c < nc; ++c) {
        F p = ExpV<V>(V::Sub(V::Load(sq + c * W), vm));
        if (n - c * W < W) p = V::MaskTail(p, n - c * W, 0.0f);
        V::Store(sq + c * W, p);
        if (c * W >= lo) sum = V::Add(sum, p);
      }
      // ExpV(-inf) is ~1e-38, not 0: the slots before the window get an exact 0 and are
      // summed here (the chunks holding them were left out above).
      for (int c0 = 0; c0 < lo; c0 += W) {
        float part = 0.0f;
        for (int j = c0; j < std::min(c0 + W, n); ++j) {
          if (j < lo) sq[j] = 0.0f;
          part += sq[j];
        }
        sum = V::Add(sum, V::MaskTail(V::Set1(part), 1, 0.0f));
      }
      l[qi] = l[qi] * corr + V::HSum(sum);
      m[qi] = m_new;
      float* a = acc + qi * hd;
      // As many independent accumulator chains as fit (hides the FMA latency).
      for (int d = 0; d < hd;) {
        const int g = std::min(kMaxG, (hd - d) / W);
        switch (g) {
          case 1: AccumulateV<V, 1>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 2: AccumulateV<V, 2>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 3: AccumulateV<V, 3>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 4: AccumulateV<V, 4>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 5: AccumulateV<V, 5>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 6: AccumulateV<V, 6>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          case 7: AccumulateV<V, 7>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
          default: AccumulateV<V, 8>(a + d, corr, sq + lo, n - lo, vt + lo * hd + d, hd); break;
        }
        d += g * W;
      }
    }
  }

  for (int qi = 0; qi < nq; ++qi) {
    float* dst = t.out + (qi / t.n_heads) * t.out_stride + (qi % t.n_heads) * hd;
    const F inv = V::Set1(1.0f / l[qi]);
    for (int d = 0; d < hd; d += W) V::Store(dst + d, V::Mul(V::Load(acc + qi * hd + d), inv));
  }
}

}  // namespace
}  // namespace trellis

#undef TRELLIS_UNROLL

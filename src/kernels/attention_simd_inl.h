// The SIMD tile kernels of PagedAttention, written once over the vector traits of
// ops_simd_inl.h and instantiated by attention_avx2.cc (V256), attention_avx512.cc (V512,
// and V256 for shapes that are not multiples of 16) and attention_neon.cc (V128).
//
// INCLUDE ONLY from *_avx2.cc / *_avx512.cc / *_neon.cc (anonymous namespace; see
// ops_simd_inl.h).
//
// Two tile kernels, chosen per tile by AttnTileT: AttnTileLanesT (below) when the tile
// has at least a vector of queries (prefill), with the queries in lanes; otherwise
// AttnTileRowsT (decode), whose per-block steps are:
//   1. converts the K tile (f16, or q8_0 / q4_0 rows dequantized first) -> f32
//      *transposed* into kt[d][t] (8x8 tiles), so a
//      query's scores for W slots are W-lane FMAs of broadcast q[d] with kt[d][...] and
//      need no horizontal sums; all queries of the tile (rows x GQA heads) reuse it;
//   2. converts (dequantizes) the V tile -> f32 into vt[t][d];
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
#include <cstring>
#include <limits>

#include "kernels/attention_internal.h"
#include "kernels/ops_simd_inl.h"
#include "kernels/unroll.h"


namespace trellis {
namespace {

// s[qq][c*W..] = sum_d qs[qq][d] * kt[d][c*W..], qq < NQ, c < NC: NC loads and NQ
// broadcasts feed NQ * NC independent FMA chains per d.
// qs: [NQ][hd], kt: [hd][bs], s: [NQ][bs]. The row kernel's scores (queries x slots, K
// transposed); the lanes kernel's with the roles swapped (slots x queries: K rows as qs,
// the transposed queries as kt).
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

// For NQ queries q at once: a_q[0 .. G*W) = a_q * corr[q] + sum_{j0 <= j < j1} p_q[j] * vt[j][0 .. G*W)
// (a_q = a + q * a_stride, p_q[j] = p[q * p_stride + j * p_jstride], vt row stride hd). Each V row is loaded
// once for the NQ queries, and the NQ * G accumulators are independent FMA chains (one
// query's G alone leaves the FMA units waiting on latency: 4 chains at hd 64 on AVX-512).
template <typename V, int NQ, int G>
inline void AccumulateV(float* a, int a_stride, const float* corr, const float* p, int p_stride,
                        int p_jstride, int j0, int j1, const float* vt, int hd) {
  using F = typename V::F;
  constexpr int W = V::kW;
  F acc[NQ][G];
  TRELLIS_UNROLL
  for (int q = 0; q < NQ; ++q) {
    const F vc = V::Set1(corr[q]);
    TRELLIS_UNROLL
    for (int g = 0; g < G; ++g) acc[q][g] = V::Mul(V::Load(a + q * a_stride + g * W), vc);
  }
  for (int j = j0; j < j1; ++j) {
    F v[G];
    const float* vr = vt + j * hd;
    TRELLIS_UNROLL
    for (int g = 0; g < G; ++g) v[g] = V::Load(vr + g * W);
    TRELLIS_UNROLL
    for (int q = 0; q < NQ; ++q) {
      const F pj = V::Set1(p[q * p_stride + j * p_jstride]);
      TRELLIS_UNROLL
      for (int g = 0; g < G; ++g) acc[q][g] = V::Fma(pj, v[g], acc[q][g]);
    }
  }
  TRELLIS_UNROLL
  for (int q = 0; q < NQ; ++q) {
    TRELLIS_UNROLL
    for (int g = 0; g < G; ++g) V::Store(a + q * a_stride + g * W, acc[q][g]);
  }
}

// Accumulator vectors one AccumulateV pass may hold (NQ * G): half the vector registers
// (32 on AVX-512 and NEON, 16 for V256, which AVX2 machines run).
template <typename V>
constexpr int kAccVectors = V::kW == 8 ? 8 : 16;

// AccumulateV over nq queries (rows of a) and G vectors at column d, as many queries per
// pass as the register budget allows; query q's probability of slot j is
// p[q * p_stride + j * p_jstride].
template <typename V, int G>
inline void AccumulateVGroup(float* a, const float* corr, const float* p, int p_stride, int p_jstride,
                             int nq, int j0, int j1, const float* vt, int hd) {
  constexpr int kNq = std::clamp(kAccVectors<V> / G, 1, 4);
  int q = 0;
  for (; q + kNq <= nq; q += kNq) {
    AccumulateV<V, kNq, G>(a + q * hd, hd, corr + q, p + q * p_stride, p_stride, p_jstride, j0, j1, vt, hd);
  }
  for (; q < nq; ++q) {
    AccumulateV<V, 1, G>(a + q * hd, hd, corr + q, p + q * p_stride, p_stride, p_jstride, j0, j1, vt, hd);
  }
}

// acc = acc * corr + P V for nq queries over slots [j0, j1), in passes of as many
// independent accumulator chains as fit (arguments as AccumulateVGroup's).
template <typename V>
inline void AccumulateVAll(float* acc, const float* corr, const float* p, int p_stride, int p_jstride,
                           int nq, int j0, int j1, const float* vt, int hd) {
  constexpr int W = V::kW;
  constexpr int kMaxG = 8;  // accumulator vectors per V pass
  for (int d = 0; d < hd;) {
    const int g = std::min(kMaxG, (hd - d) / W);
    float* a = acc + d;
    const float* v = vt + d;
    switch (g) {
      case 1: AccumulateVGroup<V, 1>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 2: AccumulateVGroup<V, 2>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 3: AccumulateVGroup<V, 3>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 4: AccumulateVGroup<V, 4>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 5: AccumulateVGroup<V, 5>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 6: AccumulateVGroup<V, 6>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      case 7: AccumulateVGroup<V, 7>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
      default: AccumulateVGroup<V, 8>(a, corr, p, p_stride, p_jstride, nq, j0, j1, v, hd); break;
    }
    d += g * W;
  }
}

// n rows of a quantized type (q8_0, q4_0; row_bytes apart) -> f32 [n][hd], W lanes at a
// time: the values DequantKvRow gives (d * q), without its scalar loop.
template <typename V>
inline void DequantRows(KvType type, const uint8_t* src, size_t row_bytes, int n, int hd, float* dst) {
  constexpr int W = V::kW;
  alignas(64) int8_t q[32];
  for (int r = 0; r < n; ++r, src += row_bytes, dst += hd) {
    const uint8_t* b = src;
    for (int c = 0; c < hd; c += 32) {
      uint16_t h;
      std::memcpy(&h, b, 2);
      const typename V::F d = V::Set1(Fp16ToFp32(h));
      const int8_t* codes;
      if (type == KvType::kQ8_0) {
        codes = reinterpret_cast<const int8_t*>(b + 2);
        b += 34;
      } else {
        for (int j = 0; j < 16; ++j) {
          q[j] = static_cast<int8_t>((b[2 + j] & 0x0F) - 8);
          q[j + 16] = static_cast<int8_t>((b[2 + j] >> 4) - 8);
        }
        codes = q;
        b += 18;
      }
      for (int j = 0; j < 32; j += W) V::Store(dst + c + j, V::Mul(d, V::LoadI8(codes + j)));
    }
  }
}

// n K or V rows (f16, or q8_0 / q4_0 rows dequantized; row_bytes apart) at src -> f32
// [n][hd] at dst.
template <typename V>
inline void LoadRows(KvType type, const uint8_t* src, size_t row_bytes, int n, int hd, float* dst) {
  if (type == KvType::kF16) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    for (int i = 0; i < n * hd; i += V::kW) V::Store(dst + i, V::LoadHalf(h + i));
  } else {
    DequantRows<V>(type, src, row_bytes, n, hd, dst);
  }
}

// The tile's outputs: query qi's row of acc divided by l[qi], into its place in t.out.
template <typename V>
inline void StoreOutputs(const internal::AttnTile& t, const float* acc, const float* l, int nq) {
  const int hd = t.head_dim;
  for (int qi = 0; qi < nq; ++qi) {
    float* dst = t.out + (qi / t.n_heads) * t.out_stride + (qi % t.n_heads) * hd;
    const auto inv = V::Set1(1.0f / l[qi]);
    for (int d = 0; d < hd; d += V::kW) V::Store(dst + d, V::Mul(V::Load(acc + qi * hd + d), inv));
  }
}

// The tile kernel with each query's scores in a row of s (s[q][slot]): for tiles of fewer
// queries than a vector has lanes (decoding, GQA groups of 8 on AVX-512).
// REQUIRES: head_dim % W == 0, block_size % W == 0, head_dim % 8 == 0.
template <typename V>
void AttnTileRowsT(const internal::AttnTile& t) {
  using F = typename V::F;
  constexpr int W = V::kW;
  constexpr int kNq = W == 16 ? 4 : 2;  // queries per score pass (register budget)
  constexpr int kMaxQ = internal::kAttnMaxQueries;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int hd = t.head_dim, bs = t.block_size;
  const int nq = t.n_rows * t.n_heads;
  float* kt = t.scratch;       // [hd][bs]
  float* vt = kt + bs * hd;    // [bs][hd]
  const int max_q = internal::AttnMaxQueries(hd);
  float* qs = vt + bs * hd;     // [max_q][hd]
  float* s = qs + max_q * hd;   // [max_q][bs]
  float* acc = s + max_q * bs;  // [max_q][hd]
  float* m = acc + max_q * hd;  // [max_q]
  float* l = m + max_q;         // [max_q]
  float corr[kMaxQ];            // this block's rescale factor per query
  int qn[kMaxQ];                // this block's causal end per query

  const F vscale = V::Set1(t.scale);
  float q8[internal::kKvMaxQuantizedHeadDim];
  for (int qi = 0; qi < nq; ++qi) {
    const float* src = t.q + (qi / t.n_heads) * t.q_stride + (qi % t.n_heads) * hd;
    if (t.k_type != KvType::kF16) src = internal::QueryThroughQ8_0(src, hd, q8);
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
    const uint8_t* blk = t.base + static_cast<size_t>(t.block_table[p0 / bs]) * t.block_bytes;
    const int nvalid = std::min(bs, kv_end - p0);
    // K slots converted (<= bs, whole 8x8 tiles and whole vectors); extra are masked.
    constexpr int kSlots = W > 8 ? W : 8;
    const int nkt = (nvalid + kSlots - 1) / kSlots * kSlots;
    // 1. K tile -> kt[d][t], transposed 8x8 at a time; quantized rows are dequantized
    //    into vt first (free until step 2).
    if (t.k_type == KvType::kF16) {
      const uint16_t* kblk = reinterpret_cast<const uint16_t*>(blk + t.k_off);
      for (int t0 = 0; t0 < nkt; t0 += 8) {
        for (int d0 = 0; d0 < hd; d0 += 8) V::KTile8x8(kblk + t0 * hd + d0, hd, kt + d0 * bs + t0, bs);
      }
    } else {
      DequantRows<V>(t.k_type, blk + t.k_off, t.k_row, nkt, hd, vt);
      for (int t0 = 0; t0 < nkt; t0 += 8) {
        for (int d0 = 0; d0 < hd; d0 += 8) V::Transpose8x8F32(vt + t0 * hd + d0, hd, kt + d0 * bs + t0, bs);
      }
    }
    // 2. V tile -> vt[t][d] (valid slots only: unwritten slots may hold NaN bits).
    LoadRows<V>(t.v_type, blk + t.v_off, t.v_row, nvalid, hd, vt);

    // 3a. Raw scores of all queries.
    const int n_chunks = nkt / W;
    int qi = 0;
    for (; qi + kNq <= nq; qi += kNq) {
      ScoreQueries<V, kNq>(qs + qi * hd, hd, kt, bs, n_chunks, s + qi * bs);
    }
    for (; qi < nq; ++qi) ScoreQueries<V, 1>(qs + qi * hd, hd, kt, bs, n_chunks, s + qi * bs);

    // 3b. Per query: soft-cap, causal and window masks, online softmax. Afterwards s holds
    // each query's probabilities over the slots [j_lo, j_hi) common to the tile, exact 0
    // outside its own [lo, n), and corr its rescale factor.
    int j_lo = bs, j_hi = 0;
    for (qi = 0; qi < nq; ++qi) {
      const int n = std::min(bs, t.pos_first + qi / t.n_heads + 1 - p0);
      const int lo = internal::AttnRowFirstSlot(t, qi / t.n_heads, p0);
      qn[qi] = n;
      if (n <= lo) {
        corr[qi] = 1.0f;
        continue;
      }
      j_lo = std::min(j_lo, lo);
      j_hi = std::max(j_hi, n);
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
      corr[qi] = m_new == m[qi] ? 1.0f : std::exp(m[qi] - m_new);
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
      l[qi] = l[qi] * corr[qi] + V::HSum(sum);
      m[qi] = m_new;
    }
    if (j_hi <= j_lo) continue;  // no query of the tile attends to this block
    // Zeros where a query's own range ends before the tile's (the causal diagonal, rows
    // that skip the block): the shared pass then adds exact zeros there.
    for (qi = 0; qi < nq; ++qi) {
      const int lo = internal::AttnRowFirstSlot(t, qi / t.n_heads, p0);
      const int from = qn[qi] <= lo ? j_lo : qn[qi];
      std::fill(s + qi * bs + std::max(from, j_lo), s + qi * bs + j_hi, 0.0f);
    }
    // 3c. acc = acc * corr + P V for all queries.
    AccumulateVAll<V>(acc, corr, s, bs, 1, nq, j_lo, j_hi, vt, hd);
  }

  StoreOutputs<V>(t, acc, l, nq);
}

// Scores with the queries in lanes: s[j][v*W ..) = sum_d kf[j][d] * qt[d][v*W ..) for
// slots j < n_slots (a multiple of 8) and query vectors v < nv (qt and s: rows of qp
// floats; kf: rows of hd), in register tiles (ScoreTile) of at most 16 accumulators (8
// with V256's 16 registers).
template <typename V>
inline void ScoreAllLanes(const float* qt, int qp, int nv, const float* kf, int hd, int n_slots, float* s) {
  constexpr int W = V::kW;
  constexpr int kMaxNv = W == 8 ? 2 : 4;
  for (int v0 = 0; v0 < nv; v0 += kMaxNv) {
    const float* q = qt + v0 * W;
    for (int j = 0; j < n_slots; j += 8) {
      const float* k = kf + j * hd;
      float* o = s + j * qp + v0 * W;
      const int g = std::min(kMaxNv, nv - v0);
      if (g == 1) {
        ScoreTile<V, 8, 1>(k, hd, q, qp, o);
      } else if (g == 2 && kMaxNv == 2) {
        ScoreTile<V, 4, 2>(k, hd, q, qp, o);
        ScoreTile<V, 4, 2>(k + 4 * hd, hd, q, qp, o + 4 * qp);
      } else if constexpr (kMaxNv == 4) {
        switch (g) {
          case 2: ScoreTile<V, 8, 2>(k, hd, q, qp, o); break;
          case 3:
            ScoreTile<V, 4, 3>(k, hd, q, qp, o);
            ScoreTile<V, 4, 3>(k + 4 * hd, hd, q, qp, o + 4 * qp);
            break;
          default:
            ScoreTile<V, 4, 4>(k, hd, q, qp, o);
            ScoreTile<V, 4, 4>(k + 4 * hd, hd, q, qp, o + 4 * qp);
            break;
        }
      }
    }
  }
}

// The tile kernel with the queries in lanes (s[slot][q]), for tiles of at least W queries
// (prefill): scores are FMAs of a slot's broadcast K values with W queries' values at
// once, so the K tile needs no transposing, and the online softmax runs down the slots
// for W queries at once: no horizontal max or sum, no scalar exp, masks as lane compares.
// Per block:
//   1. K rows -> kf[t][d] f32, V rows -> vt[t][d] f32;
//   2. s[t][q] = scale * q . k_t (ScoreAllLanes, over qt[d][q], the tile's queries
//      transposed once);
//   3. per W queries: soft-cap, causal and window masks (slot position against each
//      lane's row position), running max m, corr = exp(m_old - m_new), probabilities, l;
//   4. acc[q] = acc[q] * corr[q] + sum_t p[t][q] v_t (AccumulateVAll).
// REQUIRES: head_dim % W == 0, head_dim % 8 == 0, block_size % 8 == 0; positions up to
// 2^24 (they are compared as floats; AttnTileT sends longer contexts to the row kernel).
template <typename V>
void AttnTileLanesT(const internal::AttnTile& t) {
  using F = typename V::F;
  constexpr int W = V::kW;
  constexpr int kMaxQ = internal::kAttnMaxQueries;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int hd = t.head_dim, bs = t.block_size;
  const int nq = t.n_rows * t.n_heads;
  // Query columns: whole vectors and whole 8x8 transposes; the padding lanes hold zero
  // queries at position -1 (every slot masked), never written out.
  constexpr int kQAlign = W > 8 ? W : 8;
  const int qp = (nq + kQAlign - 1) / kQAlign * kQAlign;
  const int nv = qp / W;
  const int max_q = internal::AttnMaxQueries(hd);
  float* kf = t.scratch;        // [bs][hd]
  float* vt = kf + bs * hd;     // [bs][hd]
  float* qt = vt + bs * hd;     // [hd][qp]  (the scratch's qs)
  float* s = qt + max_q * hd;   // [bs][qp]
  float* acc = s + max_q * bs;  // [max_q][hd]
  float* m = acc + max_q * hd;  // [qp]
  float* l = m + max_q;         // [qp]
  alignas(64) float corr[kMaxQ], qhi[kMaxQ], qlo[kMaxQ];

  // Scaled queries (through q8_0 against a quantized K) as rows in acc, transposed into qt.
  const F vscale = V::Set1(t.scale);
  float q8[internal::kKvMaxQuantizedHeadDim];
  for (int qi = 0; qi < qp; ++qi) {
    float* row = acc + qi * hd;
    const int r = qi / t.n_heads;
    if (qi < nq) {
      const float* src = t.q + r * t.q_stride + (qi % t.n_heads) * hd;
      if (t.k_type != KvType::kF16) src = internal::QueryThroughQ8_0(src, hd, q8);
      for (int d = 0; d < hd; d += W) V::Store(row + d, V::Mul(V::Load(src + d), vscale));
    } else {
      for (int d = 0; d < hd; d += W) V::Store(row + d, V::Zero());
    }
    m[qi] = kNegInf;
    l[qi] = 0.0f;
    // Lane qi attends to slot positions [qlo, qhi].
    qhi[qi] = qi < nq ? static_cast<float>(t.pos_first + r) : -1.0f;
    qlo[qi] = t.window > 0 ? qhi[qi] - static_cast<float>(t.window) + 1.0f : -1.0f;
  }
  for (int q0 = 0; q0 < qp; q0 += 8) {
    for (int d0 = 0; d0 < hd; d0 += 8) V::Transpose8x8F32(acc + q0 * hd + d0, hd, qt + d0 * qp + q0, qp);
  }
  for (int i = 0; i < nq * hd; i += W) V::Store(acc + i, V::Zero());

  const int32_t kv_end = t.pos_first + t.n_rows;  // exclusive end for the last row
  // Slots below this position are outside some row's window.
  const int32_t window_lo = t.window > 0 ? kv_end - t.window : std::numeric_limits<int32_t>::min();
  const F ninf = V::Set1(kNegInf), zero = V::Zero();
  const F vcap = V::Set1(t.softcap), vinv_cap = V::Set1(t.softcap > 0 ? 1.0f / t.softcap : 0.0f);
  const F one = V::Set1(1.0f), two = V::Set1(2.0f);
  for (int32_t p0 = internal::AttnTileFirstPos(t) / bs * bs; p0 < kv_end; p0 += bs) {
    const uint8_t* blk = t.base + static_cast<size_t>(t.block_table[p0 / bs]) * t.block_bytes;
    const int nvalid = std::min(bs, kv_end - p0);
    const int n8 = (nvalid + 7) / 8 * 8;  // slots scored; those past nvalid are masked
    // 1. K rows (n8: unwritten slots may hold NaN bits, masked below) and V rows (valid
    //    only: they are multiplied by probabilities, and 0 * NaN is NaN).
    LoadRows<V>(t.k_type, blk + t.k_off, t.k_row, n8, hd, kf);
    LoadRows<V>(t.v_type, blk + t.v_off, t.v_row, nvalid, hd, vt);

    // 2. Scores.
    ScoreAllLanes<V>(qt, qp, nv, kf, hd, n8, s);

    // 3. Online softmax, W queries at a time. Masks only where a slot can be outside
    // some row's range: past the first row's position (the causal diagonal, unwritten
    // slots, padding lanes) or before the last row's window.
    const bool mask = p0 + n8 - 1 > t.pos_first || p0 < window_lo;
    for (int v = 0; v < nv; ++v) {
      float* sv = s + v * W;
      const F m_old = V::Load(m + v * W);
      F mx = m_old;
      if (mask || t.softcap > 0) {
        const F hi = V::Load(qhi + v * W), lo = V::Load(qlo + v * W);
        for (int j = 0; j < n8; ++j) {
          F x = V::Load(sv + j * qp);
          if (t.softcap > 0) {
            // cap * tanh(x / cap), tanh(y) = 1 - 2 / (1 + exp(2y)) (ExpV clamps: no inf/NaN).
            const F y = V::Mul(x, vinv_cap);
            x = V::Mul(vcap, V::Sub(one, V::Div(two, V::Add(one, ExpV<V>(V::Add(y, y))))));
          }
          if (mask) {
            const F kp = V::Set1(static_cast<float>(p0 + j));
            x = V::SelectLE(lo, kp, V::SelectLE(kp, hi, x, ninf), ninf);
          }
          V::Store(sv + j * qp, x);
          mx = V::Max(mx, x);
        }
      } else {
        for (int j = 0; j < n8; ++j) mx = V::Max(mx, V::Load(sv + j * qp));
      }
      // Lanes with no slot yet keep m = -inf and subtract 0: exp(-inf - -inf) would be NaN.
      const F ms = V::SelectLE(mx, ninf, zero, mx);
      const F c = ExpV<V>(V::Sub(m_old, ms));  // exactly 1 when the max did not move
      F sum = zero;
      for (int j = 0; j < n8; ++j) {
        const F x = V::Load(sv + j * qp);
        F p = ExpV<V>(V::Sub(x, ms));
        if (mask) p = V::SelectLE(x, ninf, zero, p);  // ExpV(-inf) is ~1e-38: exact 0
        V::Store(sv + j * qp, p);
        sum = V::Add(sum, p);
      }
      V::Store(l + v * W, V::Fma(V::Load(l + v * W), c, sum));
      V::Store(m + v * W, mx);
      V::Store(corr + v * W, c);
    }

    // 4. acc = acc * corr + P V over the valid slots (masked ones add exact zeros).
    AccumulateVAll<V>(acc, corr, s, 1, qp, nq, 0, nvalid, vt, hd);
  }

  StoreOutputs<V>(t, acc, l, nq);
}

// The tile kernel for a tile: queries in lanes when they fill a vector (and the positions
// are exact as floats, which the lanes kernel's masks compare).
// REQUIRES: head_dim % W == 0, block_size % W == 0, head_dim % 8 == 0.
template <typename V>
void AttnTileT(const internal::AttnTile& t) {
  if (t.n_rows * t.n_heads >= V::kW && t.pos_first + t.n_rows <= (1 << 24)) {
    AttnTileLanesT<V>(t);
  } else {
    AttnTileRowsT<V>(t);
  }
}

}  // namespace
}  // namespace trellis

#undef TRELLIS_UNROLL

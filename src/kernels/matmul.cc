#include "kernels/matmul.h"

#include <algorithm>
#include <array>
#include <span>
#include <cstring>
#include <vector>

#include "kernels/matmul_internal.h"
#include "kernels/packed.h"
#include "kernels/quant.h"
#include "util/clock.h"
#include "util/fp16.h"
#include "util/status.h"

namespace trellis {
namespace matmul_internal {
namespace {

constexpr int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ---- scalar dots: one weight row against one activation row (scratch layout) ----------

float DotQ4_0(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ4_0* wb = reinterpret_cast<const BlockQ4_0*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int isum = 0;
    const int8_t* q8 = aq + 32 * b;
    for (int j = 0; j < 16; ++j) {
      isum += ((wb[b].qs[j] & 0xF) - 8) * q8[j] + ((wb[b].qs[j] >> 4) - 8) * q8[j + 16];
    }
    sum += static_cast<float>(isum) * (Fp16ToFp32(wb[b].d) * ad[b]);
  }
  return sum;
}

float DotQ8_0(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += wb[b].qs[j] * aq[32 * b + j];
    sum += static_cast<float>(isum) * (Fp16ToFp32(wb[b].d) * ad[b]);
  }
  return sum;
}

float DotQ4_K(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ4_K* wb = reinterpret_cast<const BlockQ4_K*>(w);
  const int64_t nb = cols / kQkK;
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  const int16_t* bsums = reinterpret_cast<const int16_t*>(a + cols + 4 * nb);
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* q8 = aq + kQkK * b;
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      GetScaleMinK4(2 * c, wb[b].scales, &sc0, &m0);
      GetScaleMinK4(2 * c + 1, wb[b].scales, &sc1, &m1);
      int d0 = 0, d1 = 0;
      for (int l = 0; l < 32; ++l) {
        d0 += (wb[b].qs[32 * c + l] & 0xF) * q8[64 * c + l];
        d1 += (wb[b].qs[32 * c + l] >> 4) * q8[64 * c + 32 + l];
      }
      isum += sc0 * d0 + sc1 * d1;
      const int16_t* bs = bsums + 16 * b + 4 * c;
      msum += m0 * (bs[0] + bs[1]) + m1 * (bs[2] + bs[3]);
    }
    sum += Fp16ToFp32(wb[b].d) * ad[b] * static_cast<float>(isum) -
           Fp16ToFp32(wb[b].dmin) * ad[b] * static_cast<float>(msum);
  }
  return sum;
}

float DotQ5_K(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ5_K* wb = reinterpret_cast<const BlockQ5_K*>(w);
  const int64_t nb = cols / kQkK;
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  const int16_t* bsums = reinterpret_cast<const int16_t*>(a + cols + 4 * nb);
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* q8 = aq + kQkK * b;
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      GetScaleMinK4(j, wb[b].scales, &sc, &m);
      int dot = 0;
      for (int l = 0; l < 32; ++l) dot += Q5KElement(wb[b], 32 * j + l) * q8[32 * j + l];
      isum += sc * dot;
      msum += m * (bsums[16 * b + 2 * j] + bsums[16 * b + 2 * j + 1]);
    }
    sum += Fp16ToFp32(wb[b].d) * ad[b] * static_cast<float>(isum) -
           Fp16ToFp32(wb[b].dmin) * ad[b] * static_cast<float>(msum);
  }
  return sum;
}

float DotQ6_K(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ6_K* wb = reinterpret_cast<const BlockQ6_K*>(w);
  const int64_t nb = cols / kQkK;
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int q[256];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = wb[b].ql + 64 * h;
      const uint8_t* qh = wb[b].qh + 32 * h;
      int* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        qq[l] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        qq[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        qq[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        qq[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      }
    }
    const int8_t* q8 = aq + kQkK * b;
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += q[16 * g + i] * q8[16 * g + i];
      isum += wb[b].scales[g] * s;
    }
    sum += Fp16ToFp32(wb[b].d) * ad[b] * static_cast<float>(isum);
  }
  return sum;
}

// The low-bit types, from their element accessors (quant.h): the integer dot of each
// block (or 16 / 32-element group) with the Q8 activations, then the scales.

// Q5_0: d_w d_a sum (q - 16) a; Q5_1: d_w d_a sum q a + m_w d_a sum a.
template <typename B, bool kOffset>
float DotQ5(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const B* wb = reinterpret_cast<const B*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  const int32_t* asum = reinterpret_cast<const int32_t*>(a + Q8_0SumOffset(cols));
  float sum = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int isum = 0;
    for (int k = 0; k < 32; ++k) isum += Q5Element(wb[b], k) * aq[32 * b + k];
    if constexpr (kOffset) {
      sum += static_cast<float>(isum) * (Fp16ToFp32(wb[b].d) * ad[b]) +
             Fp16ToFp32(wb[b].m) * ad[b] * static_cast<float>(asum[b]);
    } else {
      sum += static_cast<float>(isum - 16 * asum[b]) * (Fp16ToFp32(wb[b].d) * ad[b]);
    }
  }
  return sum;
}
float DotQ5_0(const uint8_t* w, const uint8_t* a, int64_t cols) { return DotQ5<BlockQ5_0, false>(w, a, cols); }
float DotQ5_1(const uint8_t* w, const uint8_t* a, int64_t cols) { return DotQ5<BlockQ5_1, true>(w, a, cols); }

float DotIQ4_NL(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockIQ4_NL* wb = reinterpret_cast<const BlockIQ4_NL*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < cols / 32; ++b) {
    int isum = 0;
    for (int k = 0; k < 32; ++k) isum += IQ4NlElement(wb[b], k) * aq[32 * b + k];
    sum += static_cast<float>(isum) * (Fp16ToFp32(wb[b].d) * ad[b]);
  }
  return sum;
}

// Q2_K: d_a (d_w sum_g sc_g sum q a - dmin_w sum_g m_g bsum_g), g over 16-element groups.
float DotQ2_K(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ2_K* wb = reinterpret_cast<const BlockQ2_K*>(w);
  const int64_t nb = cols / kQkK;
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  const int16_t* bsums = reinterpret_cast<const int16_t*>(a + Q8KBsumsOffset(cols));
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int gsum = 0;
      for (int k = 16 * g; k < 16 * g + 16; ++k) gsum += Q2KElement(wb[b], k) * aq[kQkK * b + k];
      isum += (wb[b].scales[g] & 0xF) * gsum;
      msum += (wb[b].scales[g] >> 4) * bsums[16 * b + g];
    }
    sum += ad[b] * (Fp16ToFp32(wb[b].d) * static_cast<float>(isum) - Fp16ToFp32(wb[b].dmin) * static_cast<float>(msum));
  }
  return sum;
}

float DotQ3_K(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockQ3_K* wb = reinterpret_cast<const BlockQ3_K*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < cols / kQkK; ++b) {
    int isum = 0;
    for (int g = 0; g < 16; ++g) {
      int gsum = 0;
      for (int k = 16 * g; k < 16 * g + 16; ++k) gsum += Q3KElement(wb[b], k) * aq[kQkK * b + k];
      isum += Q3KScale(wb[b], g) * gsum;
    }
    sum += ad[b] * Fp16ToFp32(wb[b].d) * static_cast<float>(isum);
  }
  return sum;
}

float DotIQ4_XS(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const BlockIQ4_XS* wb = reinterpret_cast<const BlockIQ4_XS*>(w);
  const int8_t* aq = reinterpret_cast<const int8_t*>(a);
  const float* ad = reinterpret_cast<const float*>(a + cols);
  float sum = 0;
  for (int64_t b = 0; b < cols / kQkK; ++b) {
    int isum = 0;
    for (int j = 0; j < 8; ++j) {
      int jsum = 0;
      for (int k = 32 * j; k < 32 * j + 32; ++k) jsum += IQ4XsElement(wb[b], k) * aq[kQkK * b + k];
      isum += IQ4XsScale(wb[b], j) * jsum;
    }
    sum += ad[b] * Fp16ToFp32(wb[b].d) * static_cast<float>(isum);
  }
  return sum;
}

float DotF16(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const uint16_t* wh = reinterpret_cast<const uint16_t*>(w);
  const float* x = reinterpret_cast<const float*>(a);
  float sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += Fp16ToFp32(wh[c]) * x[c];
  return sum;
}

float DotBF16(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const uint16_t* wh = reinterpret_cast<const uint16_t*>(w);
  const uint16_t* x = reinterpret_cast<const uint16_t*>(a);
  float sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += Bf16ToFp32(wh[c]) * Bf16ToFp32(x[c]);
  return sum;
}

float DotF32(const uint8_t* w, const uint8_t* a, int64_t cols) {
  const float* wf = reinterpret_cast<const float*>(w);
  const float* x = reinterpret_cast<const float*>(a);
  float sum = 0;
  for (int64_t c = 0; c < cols; ++c) sum += wf[c] * x[c];
  return sum;
}

using DotFn = float (*)(const uint8_t*, const uint8_t*, int64_t);

DotFn GetDotScalar(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return DotQ4_0;
    case GgmlType::kQ8_0: return DotQ8_0;
    case GgmlType::kQ4_K: return DotQ4_K;
    case GgmlType::kQ5_K: return DotQ5_K;
    case GgmlType::kQ6_K: return DotQ6_K;
    case GgmlType::kQ5_0: return DotQ5_0;
    case GgmlType::kQ5_1: return DotQ5_1;
    case GgmlType::kIQ4_NL: return DotIQ4_NL;
    case GgmlType::kQ2_K: return DotQ2_K;
    case GgmlType::kQ3_K: return DotQ3_K;
    case GgmlType::kIQ4_XS: return DotIQ4_XS;
    case GgmlType::kF16: return DotF16;
    case GgmlType::kBF16: return DotBF16;
    case GgmlType::kF32: return DotF32;
    default: return nullptr;
  }
}

template <DotFn kDot>
void ScalarTile(const TileArgs& p) {
  for (int t = 0; t < p.nt; ++t) {
    for (int r = 0; r < p.nr; ++r) {
      p.y[t * p.y_stride + r] = kDot(p.w + r * p.w_stride, p.a + t * p.a_stride, p.cols);
    }
  }
}

}  // namespace

size_t ActRowBytes(GgmlType type, int64_t cols) {
  switch (ActFamily(type)) {
    case GgmlType::kQ8_0: return RoundUp(cols + 12 * (cols / 32), 64);
    case GgmlType::kQ8_K: return RoundUp(cols + 4 * (cols / kQkK) + 2 * (cols / 16) + 4 * (cols / 32) + 4 * (cols / 16), 64);
    case GgmlType::kF16: return RoundUp(4 * cols, 64);
    case GgmlType::kBF16: return RoundUp(2 * cols, 64);
    default: return 0;
  }
}

void QuantizeActRow(GgmlType type, const float* x, int64_t cols, uint8_t* dst) {
  switch (ActFamily(type)) {
    case GgmlType::kQ8_0: {
      float* d = reinterpret_cast<float*>(dst + cols);
      int32_t* sums = reinterpret_cast<int32_t*>(dst + cols + 4 * (cols / 32));
      float* dsums = reinterpret_cast<float*>(dst + cols + 8 * (cols / 32));
      for (int64_t b = 0; b < cols / 32; ++b) {
        BlockQ8_0 blk;
        QuantizeRowQ8_0(x + 32 * b, &blk, 32);
        std::memcpy(dst + 32 * b, blk.qs, 32);
        d[b] = Fp16ToFp32(blk.d);
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += blk.qs[j];
        sums[b] = sum;
        dsums[b] = d[b] * static_cast<float>(sum);
      }
      break;
    }
    case GgmlType::kQ8_K: {
      const int64_t nb = cols / kQkK;
      float* d = reinterpret_cast<float*>(dst + cols);
      int16_t* bsums = reinterpret_cast<int16_t*>(dst + cols + 4 * nb);
      for (int64_t b = 0; b < nb; ++b) {
        BlockQ8_K blk;
        QuantizeRowQ8_K(x + kQkK * b, &blk, kQkK);
        std::memcpy(dst + kQkK * b, blk.qs, kQkK);
        d[b] = blk.d;
        std::memcpy(bsums + 16 * b, blk.bsums, sizeof(blk.bsums));
      }
      FillQ8KBlockSums(dst, cols);
      break;
    }
    case GgmlType::kF16: {
      float* o = reinterpret_cast<float*>(dst);
      for (int64_t c = 0; c < cols; ++c) o[c] = Fp16ToFp32(Fp32ToFp16(x[c]));
      break;
    }
    case GgmlType::kBF16: {
      uint16_t* o = reinterpret_cast<uint16_t*>(dst);
      for (int64_t c = 0; c < cols; ++c) o[c] = Fp32ToBf16(x[c]);
      break;
    }
    default: break;
  }
}

TileKernel GetTileKernelScalar(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return {ScalarTile<DotQ4_0>, 4, 4};
    case GgmlType::kQ8_0: return {ScalarTile<DotQ8_0>, 4, 4};
    case GgmlType::kQ4_K: return {ScalarTile<DotQ4_K>, 4, 4};
    case GgmlType::kQ5_K: return {ScalarTile<DotQ5_K>, 4, 4};
    case GgmlType::kQ6_K: return {ScalarTile<DotQ6_K>, 4, 4};
    case GgmlType::kQ5_0: return {ScalarTile<DotQ5_0>, 4, 4};
    case GgmlType::kQ5_1: return {ScalarTile<DotQ5_1>, 4, 4};
    case GgmlType::kIQ4_NL: return {ScalarTile<DotIQ4_NL>, 4, 4};
    case GgmlType::kQ2_K: return {ScalarTile<DotQ2_K>, 4, 4};
    case GgmlType::kQ3_K: return {ScalarTile<DotQ3_K>, 4, 4};
    case GgmlType::kIQ4_XS: return {ScalarTile<DotIQ4_XS>, 4, 4};
    case GgmlType::kF16: return {ScalarTile<DotF16>, 4, 4};
    case GgmlType::kBF16: return {ScalarTile<DotBF16>, 4, 4};
    case GgmlType::kF32: return {ScalarTile<DotF32>, 4, 4};
    default: return {};
  }
}

namespace {

// Packed x16 tiles for one or more matrices of the same cols reading the same activation
// scratch, each with its kernel (pks[i] for outs[i]): all their tiles (units of groups
// 16-row groups) are split across threads in one pass, contiguous runs per thread;
// inside, token chunks that stay in L2, and per unit tiles of up to kPackedMaxTokens
// tokens.
void RunPacked(std::span<const PackedKernel> pks, std::span<const MatMulOut> outs, const uint8_t* a,
               int64_t a_stride, int64_t n_tokens, ThreadPool& pool) {
  TRELLIS_CHECK(pks.size() == outs.size());
  const int64_t cols = outs[0].w->cols;
  auto units = [&](size_t i) {
    const int64_t unit_rows = kPackRows * pks[i].groups;
    return (outs[i].w->rows + unit_rows - 1) / unit_rows;
  };
  int64_t total_units = 0;
  for (size_t i = 0; i < outs.size(); ++i) total_units += units(i);
  const int64_t token_bytes = pks[0].tiled ? a_stride / kPackedMaxTokens : a_stride;
  const int64_t tc = std::max<int64_t>(kPackedMaxTokens, 192 * 1024 / token_bytes / kPackedMaxTokens * kPackedMaxTokens);
  pool.Run([&](int ith, int nth) {
    const int64_t u_begin = total_units * ith / nth, u_end = total_units * (ith + 1) / nth;
    PackedArgs p;
    p.nb = cols / 32;
    p.a_stride = a_stride;
    p.cols = cols;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += tc) {
      const int64_t t1 = std::min(n_tokens, t0 + tc);
      int64_t u0 = 0;  // first unit of the current matrix
      for (size_t i = 0; i < outs.size(); ++i) {
        const PackedKernel& pk = pks[i];
        const WeightMatrix& w = *outs[i].w;
        const int64_t n_units = units(i), unit_rows = kPackRows * pk.groups;
        const int64_t b = std::max(u_begin, u0) - u0, e = std::min(u_end, u0 + n_units) - u0;
        u0 += n_units;
        p.group_bytes = static_cast<int64_t>(PackedGroupBytes(w.type, cols));
        p.y_stride = outs[i].y_stride;
        for (int64_t u = b; u < e; ++u) {
          const int64_t g = u * pk.groups;
          p.g = w.packed + g * p.group_bytes;
          p.nr = static_cast<int>(std::min<int64_t>(unit_rows, w.rows - g * kPackRows));
          p.ng = static_cast<int>((p.nr + kPackRows - 1) / kPackRows);
          for (int64_t t = t0; t < t1; t += kPackedMaxTokens) {
            p.a = a + (pk.tiled ? t / kPackedMaxTokens : t) * a_stride;  // t0 and tc: multiples of the tile
            p.y = outs[i].y + t * outs[i].y_stride + g * kPackRows;
            p.nt = static_cast<int>(std::min<int64_t>(kPackedMaxTokens, t1 - t));
            p.cached = t > t0;
            pk.fn(p);
          }
        }
      }
    }
  });
}

// SetActivationTimer's sink (matmul.h), per calling thread.
thread_local int64_t* activation_timer = nullptr;

// Activation rows x[t] -> scratch in `type`'s layout, or tiled (matmul_internal.h) for a
// packed kernel that reads them so; returns the row stride (tiled: the tile stride).
int64_t QuantizeActivationsUntimed(KernelIsa isa, GgmlType type, const float* x, int64_t x_stride, int64_t n_tokens,
                                   int64_t cols, ThreadPool& pool, void* scratch, bool tiled) {
  TRELLIS_CHECK(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % 64 == 0);
  const bool tiled_q8k = tiled && ActFamily(type) == GgmlType::kQ8_K;
  TRELLIS_CHECK(!tiled || ActFamily(type) == GgmlType::kQ8_0 || tiled_q8k);
#if !TRELLIS_X86
  TRELLIS_CHECK(!tiled);  // only the x86 packed kernels read tiles
#endif
  const int64_t a_stride = tiled ? TiledActStride(cols) : static_cast<int64_t>(ActRowBytes(type, cols));
  uint8_t* s = static_cast<uint8_t*>(scratch);
  auto quantize = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
#if TRELLIS_X86
      if (tiled) {
        uint8_t* tile = s + t / kPackedMaxTokens * a_stride;
        const int slot = static_cast<int>(t % kPackedMaxTokens);
        if (tiled_q8k) {
          QuantizeActTiledQ8KAvx2(x + t * x_stride, cols, tile, slot);
        } else {
          QuantizeActTiledAvx2(x + t * x_stride, cols, TiledActOffset(type), tile, slot);
        }
        continue;
      }
      if (isa == KernelIsa::kAvx2 || isa == KernelIsa::kAvx512) {
        QuantizeActRowAvx2(type, x + t * x_stride, cols, s + t * a_stride);
        continue;
      }
#endif
      QuantizeActRow(type, x + t * x_stride, cols, s + t * a_stride);
    }
  };
  // A decode-sized batch takes ~1 us per row to convert: cheaper here than a round trip
  // through the pool (a wake-up and a barrier).
  if (n_tokens * cols <= 8 * 8192) {
    quantize(0, n_tokens, 0);
  } else {
    pool.ParallelFor(n_tokens, quantize);
  }
  return a_stride;
}

// QuantizeActivationsUntimed, its wall time added to the thread's activation timer if set.
int64_t QuantizeActivations(KernelIsa isa, GgmlType type, const float* x, int64_t x_stride, int64_t n_tokens,
                            int64_t cols, ThreadPool& pool, void* scratch, bool tiled = false) {
  if (activation_timer == nullptr) return QuantizeActivationsUntimed(isa, type, x, x_stride, n_tokens, cols, pool, scratch, tiled);
  const int64_t t0 = NowNanos();
  const int64_t stride = QuantizeActivationsUntimed(isa, type, x, x_stride, n_tokens, cols, pool, scratch, tiled);
  *activation_timer += NowNanos() - t0;
  return stride;
}

}  // namespace

TileKernel GetTileKernel(KernelIsa isa, GgmlType type, int64_t n_tokens) {
  TileKernel k;
#if TRELLIS_X86
  if (isa == KernelIsa::kAvx512) k = GetTileKernelAvx512(type, n_tokens);
  if (k.fn == nullptr && (isa == KernelIsa::kAvx2 || isa == KernelIsa::kAvx512)) k = GetTileKernelAvx2(type, n_tokens);
#endif
#if TRELLIS_ARM64
  if (isa == KernelIsa::kNeon) k = GetTileKernelNeon(type, n_tokens);
#endif
  if (k.fn == nullptr) k = GetTileKernelScalar(type);
  return k;
}

PackedKernel GetPackedKernel(KernelIsa isa, GgmlType type) {
#if TRELLIS_X86
  if (isa == KernelIsa::kAvx512) return GetPackedKernelAvx512(type);
  if (isa == KernelIsa::kAvx2) return GetPackedKernelAvx2(type);
#endif
#if TRELLIS_ARM64
  if (isa == KernelIsa::kNeon && NeonDotprodEnabled()) return GetPackedKernelNeonDot(type);
#endif
  return {};
}

void MatMulWithIsa(KernelIsa isa, const WeightMatrix& w, const float* x, int64_t x_stride,
                   int64_t n_tokens, float* y, int64_t y_stride, ThreadPool& pool, void* scratch) {
  TRELLIS_CHECK(IsaSupported(isa));
  TRELLIS_CHECK(w.row_bytes == RowBytes(w.type, w.cols));
  const TileKernel k = GetTileKernel(isa, w.type, n_tokens);
  TRELLIS_CHECK(k.fn != nullptr);
  const PackedKernel pk = w.packed != nullptr ? GetPackedKernel(isa, w.type).ForTokens(n_tokens) : PackedKernel{};
  if (n_tokens <= 0 || w.rows <= 0) return;

  // 1. Activations -> scratch (one row per token).
  const int64_t cols = w.cols;
  const uint8_t* a = reinterpret_cast<const uint8_t*>(x);
  int64_t a_stride = x_stride * static_cast<int64_t>(sizeof(float));
  if (w.type != GgmlType::kF32) {
    a_stride = QuantizeActivations(isa, w.type, x, x_stride, n_tokens, cols, pool, scratch, pk.tiled);
    a = static_cast<const uint8_t*>(scratch);
  }

  // 2a. Packed x16 weights.
  if (pk.fn != nullptr) {
    const MatMulOut out{&w, y, y_stride};
    RunPacked(std::span<const PackedKernel>(&pk, 1), std::span<const MatMulOut>(&out, 1), a, a_stride, n_tokens, pool);
    return;
  }
  // 2b. Rows split across threads in contiguous chunks of 16; each thread walks token chunks
  // that stay in L2, and inside them row tiles x token tiles.
  constexpr int64_t kRowUnit = 16;
  const int64_t n_units = (w.rows + kRowUnit - 1) / kRowUnit;
  const int64_t chunk_bytes = 192 * 1024;
  int64_t tc = std::max<int64_t>(k.nt, chunk_bytes / std::max<int64_t>(a_stride, 1) / k.nt * k.nt);
  const uint8_t* wdata = static_cast<const uint8_t*>(w.data);
  pool.Run([&](int ith, int nth) {
    const int64_t r_begin = n_units * ith / nth * kRowUnit;
    const int64_t r_end = std::min(w.rows, n_units * (ith + 1) / nth * kRowUnit);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += tc) {
      const int64_t t1 = std::min(n_tokens, t0 + tc);
      for (int64_t r = r_begin; r < r_end; r += k.mr) {
        TileArgs p;
        p.w = wdata + r * w.row_bytes;
        p.w_stride = w.row_bytes;
        p.a_stride = a_stride;
        p.cols = cols;
        p.y_stride = y_stride;
        p.nr = static_cast<int>(std::min<int64_t>(k.mr, r_end - r));
        for (int64_t t = t0; t < t1; t += k.nt) {
          p.a = a + t * a_stride;
          p.y = y + t * y_stride + r;
          p.nt = static_cast<int>(std::min<int64_t>(k.nt, t1 - t));
          k.fn(p);
        }
      }
    }
  });
}

bool SharedPackedKernels(KernelIsa isa, std::span<const MatMulOut> outs, int64_t n_tokens,
                         std::array<PackedKernel, kMaxSharedOuts>& pks) {
  if (outs.empty() || n_tokens <= 0 || outs.size() > pks.size()) return false;
  const WeightMatrix& w0 = *outs[0].w;
  for (size_t i = 0; i < outs.size(); ++i) {
    const WeightMatrix& w = *outs[i].w;
    pks[i] = GetPackedKernel(isa, w.type).ForTokens(n_tokens);
    const GgmlType family = ActFamily(w.type);
    const bool quantized = family == GgmlType::kQ8_0 || family == GgmlType::kQ8_K;
    if (pks[i].fn == nullptr || w.packed == nullptr || w.cols != w0.cols || w.rows <= 0 ||
        family != ActFamily(w0.type) || (!quantized && w.type != w0.type) || pks[i].tiled != pks[0].tiled ||
        (pks[i].tiled && family == GgmlType::kQ8_0 && TiledActOffset(w.type) != TiledActOffset(w0.type))) {
      return false;
    }
  }
  return true;
}

void MatMulSharedWithIsa(KernelIsa isa, std::span<const MatMulOut> outs, const float* x, int64_t x_stride,
                         int64_t n_tokens, ThreadPool& pool, void* scratch) {
  if (outs.empty()) return;
  const WeightMatrix& w0 = *outs[0].w;
  std::array<PackedKernel, kMaxSharedOuts> pks;
  const bool shared = SharedPackedKernels(isa, outs, n_tokens, pks);
  if (!shared) {
    for (const MatMulOut& o : outs) MatMulWithIsa(isa, *o.w, x, x_stride, n_tokens, o.y, o.y_stride, pool, scratch);
    return;
  }
  TRELLIS_CHECK(IsaSupported(isa));
  const int64_t a_stride = QuantizeActivations(isa, w0.type, x, x_stride, n_tokens, w0.cols, pool, scratch, pks[0].tiled);
  RunPacked(std::span<const PackedKernel>(pks.data(), outs.size()), outs, static_cast<const uint8_t*>(scratch), a_stride,
            n_tokens, pool);
}

}  // namespace matmul_internal

void SetActivationTimer(int64_t* ns) { matmul_internal::activation_timer = ns; }

size_t MatMulScratchBytes(GgmlType type, int64_t cols, int64_t n_tokens) {
  using namespace matmul_internal;
  const size_t rows = ActRowBytes(type, cols) * static_cast<size_t>(n_tokens);
  if (ActFamily(type) != GgmlType::kQ8_0 && ActFamily(type) != GgmlType::kQ8_K) return rows;
  return std::max(rows, static_cast<size_t>(TiledActBytes(cols, n_tokens)));  // a packed kernel's tiles
}

void MatMul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
            int64_t y_stride, ThreadPool& pool, void* scratch) {
  matmul_internal::MatMulWithIsa(BestKernelIsa(), w, x, x_stride, n_tokens, y, y_stride, pool, scratch);
}

void MatMulShared(std::span<const MatMulOut> outs, const float* x, int64_t x_stride, int64_t n_tokens,
                  ThreadPool& pool, void* scratch) {
  matmul_internal::MatMulSharedWithIsa(BestKernelIsa(), outs, x, x_stride, n_tokens, pool, scratch);
}

void MatMulRef(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n_tokens, float* y,
               int64_t y_stride) {
  using namespace matmul_internal;
  const DotFn dot = GetDotScalar(w.type);
  TRELLIS_CHECK(dot != nullptr);
  const int64_t a_stride = static_cast<int64_t>(ActRowBytes(w.type, w.cols));
  std::vector<uint8_t> act(static_cast<size_t>(a_stride * n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) QuantizeActRow(w.type, x + t * x_stride, w.cols, act.data() + t * a_stride);
  const uint8_t* wdata = static_cast<const uint8_t*>(w.data);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const uint8_t* a = w.type == GgmlType::kF32 ? reinterpret_cast<const uint8_t*>(x + t * x_stride)
                                                : act.data() + t * a_stride;
    for (int64_t r = 0; r < w.rows; ++r) y[t * y_stride + r] = dot(wdata + r * w.row_bytes, a, w.cols);
  }
}

void GetRow(const WeightMatrix& w, int64_t r, float* dst) {
  TRELLIS_CHECK(r >= 0 && r < w.rows);
  const Status s = DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, dst, w.cols);
  TRELLIS_CHECK(s.ok());
}

}  // namespace trellis

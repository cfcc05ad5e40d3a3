#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "util/fp16.h"

namespace trellis {
namespace {

// ---- dequantizers -------------------------------------------------------------------

template <typename B, bool kOffset>
void DequantizeQ5(const B* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = Fp16ToFp32(x[b].d);
    if constexpr (kOffset) {
      const float m = Fp16ToFp32(x[b].m);
      for (int k = 0; k < 32; ++k) y[k] = static_cast<float>(Q5Element(x[b], k)) * d + m;
    } else {
      for (int k = 0; k < 32; ++k) y[k] = static_cast<float>(Q5Element(x[b], k) - 16) * d;
    }
  }
}

void DequantizeIQ4_NL(const BlockIQ4_NL* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, y += 32) {
    const float d = Fp16ToFp32(x[b].d);
    for (int k = 0; k < 32; ++k) y[k] = d * static_cast<float>(IQ4NlElement(x[b], k));
  }
}

void DequantizeIQ4_XS(const BlockIQ4_XS* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, y += kQkK) {
    const float d = Fp16ToFp32(x[b].d);
    for (int k = 0; k < kQkK; ++k) {
      y[k] = d * static_cast<float>(IQ4XsScale(x[b], k / 32)) * static_cast<float>(IQ4XsElement(x[b], k));
    }
  }
}

void DequantizeQ2_K(const BlockQ2_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, y += kQkK) {
    const float d = Fp16ToFp32(x[b].d), dmin = Fp16ToFp32(x[b].dmin);
    for (int k = 0; k < kQkK; ++k) {
      const uint8_t sc = x[b].scales[k / 16];
      y[k] = d * static_cast<float>(sc & 0xF) * static_cast<float>(Q2KElement(x[b], k)) - dmin * static_cast<float>(sc >> 4);
    }
  }
}

void DequantizeQ3_K(const BlockQ3_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, y += kQkK) {
    const float d = Fp16ToFp32(x[b].d);
    for (int k = 0; k < kQkK; ++k) {
      y[k] = d * static_cast<float>(Q3KScale(x[b], k / 16)) * static_cast<float>(Q3KElement(x[b], k));
    }
  }
}

void DequantizeQ4_0(const BlockQ4_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQk4_0; ++b, y += kQk4_0) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((x[b].qs[j] & 0xF) - 8) * d;
      y[j + 16] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQk8_0; ++b, y += kQk8_0) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

void DequantizeQ4_K(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float dmin = Fp16ToFp32(x[b].dmin);
    const uint8_t* q = x[b].qs;
    for (int c = 0; c < 4; ++c, q += 32) {  // 64 elements: sub-blocks 2c, 2c+1
      uint8_t sc0, m0, sc1, m1;
      GetScaleMinK4(2 * c, x[b].scales, &sc0, &m0);
      GetScaleMinK4(2 * c + 1, x[b].scales, &sc1, &m1);
      const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(q[l] & 0xF) - mm0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] >> 4) - mm1;
    }
  }
}

void DequantizeQ5_K(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float dmin = Fp16ToFp32(x[b].dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      GetScaleMinK4(j, x[b].scales, &sc, &m);
      const float dj = d * sc, mj = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = dj * static_cast<float>(Q5KElement(x[b], 32 * j + l)) - mj;
    }
  }
}

// Q6_K element order: each half of 128 uses ql[64], qh[32]; for l < 32
//   elem l      = ql[l] & 15      | (qh[l] >> 0 & 3) << 4
//   elem l + 32 = ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4
//   elem l + 64 = ql[l] >> 4      | (qh[l] >> 4 & 3) << 4
//   elem l + 96 = ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4
void DequantizeQ6_K(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is] * q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
      }
    }
  }
}

// ---- weight quantizers ----------------------------------------------------------------

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQk4_0; ++b, x += kQk4_0) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Least-squares fit x ~ s*q - m over q in [0, nmax] (m >= 0), trying a few grid scales.
void FitAsymmetric(const float* x, int n, int nmax, float* s_out, float* m_out) {
  float xmin = 0.f, xmax = x[0];
  for (int i = 0; i < n; ++i) {
    xmin = std::min(xmin, x[i]);
    xmax = std::max(xmax, x[i]);
  }
  if (xmax <= xmin) {
    *s_out = 0.f;
    *m_out = -xmin;
    return;
  }
  float best_err = INFINITY, best_s = (xmax - xmin) / nmax, best_m = -xmin;
  for (int step = -6; step <= 12; ++step) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * step) / (xmax - xmin);
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    int q[256];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(NearestInt((x[i] - xmin) * iscale), 0, nmax);
      sq += q[i];
      sqq += q[i] * q[i];
      sx += x[i];
      sxq += x[i] * q[i];
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double a = (n * sxq - sq * sx) / det;
    double b = (sqq * sx - sq * sxq) / det;
    if (b > 0) {
      b = 0;
      a = sxq / sqq;
    }
    if (a <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = a * q[i] + b - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best_s = static_cast<float>(a);
      best_m = static_cast<float>(-b);
    }
  }
  *s_out = best_s;
  *m_out = best_m;
}

// Q4_K and Q5_K share scales and mins (6 bits each, 8 sub-blocks of 32); qmax is 15 or 31.
template <int kQmax, typename Block>
void QuantizeRowK45(const float* x, Block* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, x += kQkK) {
    float s[8], m[8], max_s = 0, max_m = 0;
    for (int j = 0; j < 8; ++j) {
      FitAsymmetric(x + 32 * j, 32, kQmax, &s[j], &m[j]);
      max_s = std::max(max_s, s[j]);
      max_m = std::max(max_m, m[j]);
    }
    const float d = max_s / 63.f, dmin = max_m / 63.f;
    y[b].d = Fp32ToFp16(d);
    y[b].dmin = Fp32ToFp16(dmin);
    const float id = d > 0 ? 1.f / d : 0.f, idmin = dmin > 0 ? 1.f / dmin : 0.f;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(std::clamp(NearestInt(s[j] * id), 0, 63));
      mn[j] = static_cast<uint8_t>(std::clamp(NearestInt(m[j] * idmin), 0, 63));
    }
    for (int j = 0; j < 4; ++j) {
      y[b].scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
      y[b].scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
      y[b].scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
    // Requantize against the scales as stored.
    const float dq = Fp16ToFp32(y[b].d), dminq = Fp16ToFp32(y[b].dmin);
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      const float es = dq * sc[j], em = dminq * mn[j];
      const float ies = es > 0 ? 1.f / es : 0.f;
      for (int i = 0; i < 32; ++i) {
        q[32 * j + i] = static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + i] + em) * ies), 0, kQmax));
      }
    }
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[b].qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 0xF) | ((q[64 * c + 32 + l] & 0xF) << 4));
      }
    }
    if constexpr (kQmax == 31) {
      for (int l = 0; l < 32; ++l) {
        uint8_t h = 0;
        for (int j = 0; j < 8; ++j) h |= static_cast<uint8_t>(((q[32 * j + l] >> 4) & 1) << j);
        y[b].qh[l] = h;
      }
    }
  }
}

void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t n) { QuantizeRowK45<15>(x, y, n); }

void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t n) { QuantizeRowK45<31>(x, y, n); }

// Symmetric least-squares scale for q in [-nmax, nmax - 1]; returns s with x ~ s*q.
float FitSymmetric(const float* x, int n, int nmax) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0) return 0.f;
  float best_err = INFINITY, best_s = max / -nmax;
  for (int step = -8; step <= 8; ++step) {
    const float iscale = -(static_cast<float>(nmax) + 0.1f * step) / max;
    double sxq = 0, sqq = 0;
    int q[32];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      sxq += x[i] * q[i];
      sqq += q[i] * q[i];
    }
    if (sqq <= 0) continue;
    const double s = sxq / sqq;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best_s = static_cast<float>(s);
    }
  }
  return best_s;
}

void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, x += kQkK) {
    float s[16], amax = 0;
    for (int g = 0; g < 16; ++g) {
      s[g] = FitSymmetric(x + 16 * g, 16, 32);
      amax = std::max(amax, std::fabs(s[g]));
    }
    const float d = amax / 127.f;
    y[b].d = Fp32ToFp16(d);
    const float id = d > 0 ? 1.f / d : 0.f;
    const float dq = Fp16ToFp32(y[b].d);
    uint8_t q[256];
    for (int g = 0; g < 16; ++g) {
      const int sc = std::clamp(NearestInt(s[g] * id), -127, 127);
      y[b].scales[g] = static_cast<int8_t>(sc);
      const float es = dq * sc;
      const float ies = es != 0 ? 1.f / es : 0.f;
      for (int i = 0; i < 16; ++i) {
        q[16 * g + i] = static_cast<uint8_t>(std::clamp(NearestInt(x[16 * g + i] * ies), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* qq = q + 128 * h;
      uint8_t* ql = y[b].ql + 64 * h;
      uint8_t* qh = y[b].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                     ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

Status CheckBlockMultiple(GgmlType type, int64_t n) {
  const GgmlTypeTraits tr = GetGgmlTypeTraits(type);
  if (!tr.computable) return Unsupported("quant: unsupported type " + std::to_string(static_cast<int>(type)));
  if (n < 0 || n % tr.block_elems != 0) {
    return InvalidArgument("quant: n=" + std::to_string(n) + " is not a multiple of the block size of " +
                           std::string(tr.name));
  }
  return Status::Ok();
}

}  // namespace

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQk8_0; ++b, x += kQk8_0) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < 32; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQkK; ++b, x += kQkK) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQkK; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQkK; ++j) y[b].qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * x[j])));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[16 * g + i];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.f / iscale;
  }
}

Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  TRELLIS_RETURN_IF_ERROR(CheckBlockMultiple(type, n));
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case GgmlType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      break;
    }
    case GgmlType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      break;
    }
    case GgmlType::kQ4_0: DequantizeQ4_0(static_cast<const BlockQ4_0*>(src), dst, n); break;
    case GgmlType::kQ8_0: DequantizeQ8_0(static_cast<const BlockQ8_0*>(src), dst, n); break;
    case GgmlType::kQ4_K: DequantizeQ4_K(static_cast<const BlockQ4_K*>(src), dst, n); break;
    case GgmlType::kQ5_K: DequantizeQ5_K(static_cast<const BlockQ5_K*>(src), dst, n); break;
    case GgmlType::kQ6_K: DequantizeQ6_K(static_cast<const BlockQ6_K*>(src), dst, n); break;
    case GgmlType::kQ5_0: DequantizeQ5<BlockQ5_0, false>(static_cast<const BlockQ5_0*>(src), dst, n); break;
    case GgmlType::kQ5_1: DequantizeQ5<BlockQ5_1, true>(static_cast<const BlockQ5_1*>(src), dst, n); break;
    case GgmlType::kIQ4_NL: DequantizeIQ4_NL(static_cast<const BlockIQ4_NL*>(src), dst, n); break;
    case GgmlType::kIQ4_XS: DequantizeIQ4_XS(static_cast<const BlockIQ4_XS*>(src), dst, n); break;
    case GgmlType::kQ2_K: DequantizeQ2_K(static_cast<const BlockQ2_K*>(src), dst, n); break;
    case GgmlType::kQ3_K: DequantizeQ3_K(static_cast<const BlockQ3_K*>(src), dst, n); break;
    default: return Unsupported("quant: dequantize " + std::string(GetGgmlTypeTraits(type).name));
  }
  return Status::Ok();
}

Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  TRELLIS_RETURN_IF_ERROR(CheckBlockMultiple(type, n));
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      break;
    case GgmlType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      break;
    }
    case GgmlType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      break;
    }
    case GgmlType::kQ4_0: QuantizeRowQ4_0(src, static_cast<BlockQ4_0*>(dst), n); break;
    case GgmlType::kQ8_0: QuantizeRowQ8_0(src, static_cast<BlockQ8_0*>(dst), n); break;
    case GgmlType::kQ4_K: QuantizeRowQ4_K(src, static_cast<BlockQ4_K*>(dst), n); break;
    case GgmlType::kQ5_K: QuantizeRowQ5_K(src, static_cast<BlockQ5_K*>(dst), n); break;
    case GgmlType::kQ6_K: QuantizeRowQ6_K(src, static_cast<BlockQ6_K*>(dst), n); break;
    default: return Unsupported("quant: quantize " + std::string(GetGgmlTypeTraits(type).name));
  }
  return Status::Ok();
}

}  // namespace trellis

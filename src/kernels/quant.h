// Quantized block formats (byte-exact with GGUF / ggml) and reference (de)quantizers.
//
// A row of n elements in a block type is n / kBlockElems consecutive blocks. All f16
// scales are IEEE half bits (util/fp16.h). Layouts:
//   Q4_0 (32 elems, 18 B): value = (q - 8) * d; qs[j] low nibble = elem j, high = elem j+16.
//   Q8_0 (32 elems, 34 B): value = qs[j] * d.
//   Q4_K (256 elems, 144 B): 8 sub-blocks of 32; sub-block j has 6-bit scale sc_j and min
//     m_j packed in scales[12] (see GetScaleMinK4); value = d*sc_j*q - dmin*m_j, q in 0..15.
//     qs[32c + l]: low nibble = elem 64c + l, high nibble = elem 64c + 32 + l.
//   Q6_K (256 elems, 210 B): 16 sub-blocks of 16 with int8 scales; value = d*sc*(q - 32),
//     q in 0..63 = 4 low bits in ql, 2 high bits in qh (see DequantizeRow for the order).
//   Q8_K (256 elems, 292 B): activation format, value = qs[j] * d (f32 d), bsums[g] =
//     sum of qs[16g .. 16g+15].
//
// Thread safety: pure functions on caller-owned buffers.
#pragma once

#include <cstdint>

#include "model/ggml_type.h"
#include "util/status.h"

namespace trellis {

inline constexpr int kQk4_0 = 32;
inline constexpr int kQk8_0 = 32;
inline constexpr int kQkK = 256;

struct BlockQ4_0 {
  uint16_t d;       // f16 scale
  uint8_t qs[16];   // (32) nibbles
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ8_0 {
  uint16_t d;       // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_K {
  uint16_t d;           // f16 super-block scale for the 6-bit scales
  uint16_t dmin;        // f16 super-block scale for the 6-bit mins
  uint8_t scales[12];   // 8 scales + 8 mins, 6 bits each
  uint8_t qs[128];      // (256) nibbles
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;           // f16 super-block scale for the 6-bit scales
  uint16_t dmin;        // f16 super-block scale for the 6-bit mins
  uint8_t scales[12];   // 8 scales + 8 mins, 6 bits each (as Q4_K)
  uint8_t qh[32];       // 5th bits: element k's is bit k / 32 of qh[k % 32]
  uint8_t qs[128];      // low nibbles, ordered as Q4_K's
};
static_assert(sizeof(BlockQ5_K) == 176);

// Element k (0..255) of a Q5_K block as 0..31 (value d * sc_j * q - dmin * m_j, j = k / 32).
inline int Q5KElement(const BlockQ5_K& b, int k) {
  const uint8_t byte = b.qs[32 * (k / 64) + k % 32];
  const int low = (k % 64) < 32 ? byte & 0xF : byte >> 4;
  return low | ((b.qh[k % 32] >> (k / 32)) & 1) << 4;
}

struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // per 16 elements
  uint16_t d;         // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210);

// The types below are read (dequantized and multiplied), not written: their files come
// from llama-quantize. Element accessors give the integer value of element k of a block,
// which the dequantizers and the scalar dot kernels share.

struct BlockQ5_0 {
  uint16_t d;      // f16 scale
  uint8_t qh[4];   // 5th bits: element k's is bit k of the 32-bit little-endian qh
  uint8_t qs[16];  // low nibbles: element k < 16 in qs[k] & 15, k >= 16 in qs[k - 16] >> 4
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
  uint16_t d;      // f16 scale
  uint16_t m;      // f16 offset (x = d * q + m)
  uint8_t qh[4];   // as BlockQ5_0
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 0..31 (Q5_0 subtracts 16).
template <typename B>
inline int Q5Element(const B& b, int k) {
  const uint32_t qh = static_cast<uint32_t>(b.qh[0]) | static_cast<uint32_t>(b.qh[1]) << 8 |
                      static_cast<uint32_t>(b.qh[2]) << 16 | static_cast<uint32_t>(b.qh[3]) << 24;
  const int low = k < 16 ? b.qs[k] & 0xF : b.qs[k - 16] >> 4;
  return low | static_cast<int>((qh >> k) & 1) << 4;
}

// IQ4_NL / IQ4_XS: 4-bit indices into a fixed non-uniform grid.
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

struct BlockIQ4_NL {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // indices, nibbles ordered as BlockQ5_0's
};
static_assert(sizeof(BlockIQ4_NL) == 18);

inline int IQ4NlElement(const BlockIQ4_NL& b, int k) {
  return kIq4NlValues[k < 16 ? b.qs[k] & 0xF : b.qs[k - 16] >> 4];
}

struct BlockIQ4_XS {
  uint16_t d;            // f16 super-block scale
  uint16_t scales_h;     // high 2 bits of the 8 sub-block scales
  uint8_t scales_l[4];   // low 4 bits of the 8 sub-block scales
  uint8_t qs[128];       // 8 sub-blocks of 32 indices, each ordered as BlockIQ4_NL's
};
static_assert(sizeof(BlockIQ4_XS) == 136);

// Sub-block j's scale, -32..31.
inline int IQ4XsScale(const BlockIQ4_XS& b, int j) {
  return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}
inline int IQ4XsElement(const BlockIQ4_XS& b, int k) {
  const uint8_t* q = b.qs + 16 * (k / 32);
  const int j = k % 32;
  return kIq4NlValues[j < 16 ? q[j] & 0xF : q[j - 16] >> 4];
}

struct BlockQ2_K {
  uint8_t scales[16];  // per 16 elements: scale (low nibble) and min (high nibble)
  uint8_t qs[64];      // 2-bit values: element k is bits 2 * ((k % 128) / 32) of qs[32 * (k / 128) + k % 32]
  uint16_t d;          // f16 super-block scale of the scales
  uint16_t dmin;       // f16 super-block scale of the mins
};
static_assert(sizeof(BlockQ2_K) == 84);

// 0..3; x = d * (scales[k / 16] & 15) * q - dmin * (scales[k / 16] >> 4).
inline int Q2KElement(const BlockQ2_K& b, int k) {
  return (b.qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
}

struct BlockQ3_K {
  uint8_t hmask[32];   // 3rd bits: element k's is bit k / 32 of hmask[k % 32]; clear means -4
  uint8_t qs[64];      // low 2 bits, laid out as BlockQ2_K's
  uint8_t scales[12];  // 16 6-bit scales, biased by 32
  uint16_t d;          // f16 super-block scale
};
static_assert(sizeof(BlockQ3_K) == 110);

// -4..3.
inline int Q3KElement(const BlockQ3_K& b, int k) {
  const int low = (b.qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
  return low - (((b.hmask[k % 32] >> (k / 32)) & 1) ? 0 : 4);
}
// Group g's (16 elements) scale, -32..31: low 4 bits from scales[g % 8] (low or high nibble
// by g / 8), high 2 bits from scales[8 + g % 4] (bits 2 * (g / 4)).
inline int Q3KScale(const BlockQ3_K& b, int g) {
  const int low = g < 8 ? b.scales[g] & 0xF : b.scales[g - 8] >> 4;
  const int high = (b.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
  return (low | high << 4) - 32;
}

struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Scale and min (6 bits each) of sub-block j (0..7) of a Q4_K block's scales[12].
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Reference dequantization of n elements (n a multiple of the type's block size).
// Types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K.
Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Quantizes n elements (multiple of the block size) into dst (RowBytes(type, n) bytes).
// Types: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K.
Status QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

// Activation quantizers, numerically as llama.cpp's reference ones.
// Q8_0: d = amax / 127 (stored f16), q = round(x / d) (ties away from zero).
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
// Q8_K: scale from the signed value of largest magnitude, q = nearest-even(-127/max * x)
// capped at 127, d = 1 / iscale, plus bsums.
void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n);

// Round to nearest, ties to even (ggml's nearest_int), for |x| < 2^22.
inline int NearestInt(float x) {
  const float v = x + 12582912.f;
  int32_t i;
  __builtin_memcpy(&i, &v, 4);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace trellis

// Weight layouts repacked at load time for the AVX-512 VNNI, AVX2 and NEON dotprod matmul
// kernels.
//
// GGUF stores a Q4_0 / Q8_0 matrix row by row, 32-element blocks one after the other.
// A kernel over that layout vectorizes along a row: per 64 elements it needs one int8 dot
// (vpdpbusd) plus a convert, a multiply and an add to apply the block scales, so three
// quarters of the issued work is scale bookkeeping. The "x16" layout interleaves 16 rows
// instead: one zmm holds 4 consecutive elements of each of 16 rows, so vpdpbusd against
// 4 activation bytes broadcast to every lane accumulates 16 outputs at once, and the
// scales of a 32-element block are applied once per 8 dots, to 16 rows at a time.
//
// Layout of one group of 16 rows (rows past the matrix end are zero, scale 0):
//   qs:     nb blocks x kLines 64-byte lines, block b at qs + b * kLines * 64
//     Q4_0 (4 lines per block): line i byte 4r+q = e(r, 8i+q) | e(r, 8i+4+q) << 4, where
//          e(r, k) in 0..15 is row r's k-th nibble of the block (value e - 8).
//     Q8_0 (8 lines per block): line j byte 4r+q = q(r, 4j+q) + 128 (as unsigned).
//     IQ4_NL (4 lines): as Q4_0, e(r, k) the grid index (value kIq4NlValues[e]).
//     Q5_0, Q5_1 (5 lines): 4 nibble lines of the low 4 bits as Q4_0, then a line whose
//          byte 4r+q holds the 5th bits of elements 8i+q (bit 2i) and 8i+4+q (bit 2i+1),
//          i = 0..3; e in 0..31 (Q5_0 value e - 16, Q5_1 d * e + m).
//   scales: nb x 16 f16, scales[16 b + r] = row r's block b scale;
//   Q5_1 only: then mins: nb x 16 f16, row r's block b offset m.
//   padding to a multiple of 64 bytes.
// Q4_K (value d * sc_j * e - dmin * m_j, e in 0..15, 8 sub-blocks j of 32 per 256): per
// super-block of 256 elements, 2368 bytes:
//   qs[8 sub-blocks][4 lines][64], each sub-block packed as a Q4_0 block above;
//   d[16] f16, dmin[16] f16; sc[8][16] u8, m[8][16] u8 (sc[16 j + r] is row r's 6-bit scale).
// Its kernels take llama.cpp's Q8_K activations, as the row-major Q4_K kernels do.
// Q5_K (Q4_K plus a 5th bit, e in 0..31): per super-block, 2880 bytes: per sub-block j of
// 32, 320 bytes: 4 nibble lines as Q4_0, then a line whose byte 4r+q holds the 5th bits of
// elements 8i+q (bit 2i) and 8i+4+q (bit 2i+1), i = 0..3; then d, dmin, sc, m as Q4_K.
// Q6_K (value d * sc_g * (q - 32), q in 0..63, 16 groups g of 16 per 256): per super-block,
// 3392 bytes: per 32-element block j, 4 lines of low nibbles packed as a Q4_0 block, then 2
// lines of high bit pairs: line m byte 4r+q holds, from bit 0, the high bits of the
// elements 16m+q, 16m+4+q, 16m+8+q, 16m+12+q of the block (the lo and hi nibbles of
// nibble lines 2m and 2m+1); then sc[16 groups][16 rows] int8, d[16] f16, 32 bytes pad.
// IQ4_XS (value d * sc_j * kIq4NlValues[e], 8 sub-blocks j of 32 per 256): per super-block,
// 2240 bytes: qs[8 sub-blocks][4 lines][64] of grid indices packed as Q4_0 blocks; d[16]
// f16; sc[8][16] int8 (sc[16 j + r] is row r's scale, -32..31); 32 bytes pad.
// Q2_K (value d * sc_g * q - dmin * m_g, q in 0..3, 16 groups g of 16 per 256) and Q3_K
// (value d * sc_g * (e - 4), e in 0..7): per 32-element block j of a super-block, 2 lines
// of 2-bit values: line m byte 4r+q holds the low 2 bits of the elements 16m+q, 16m+4+q,
// 16m+8+q, 16m+12+q of the block at bits 0, 2, 4, 6 (so line m is group 2j+m); Q3_K then
// a line whose byte 4r+q holds the 3rd bit of element 4f+q at bit f, f = 0..7.
//   Q2_K, 1344 bytes: the 8 blocks (128 bytes each); scm[16 groups][16 rows] u8 (scale |
//     min << 4, as GGUF stores them); d[16] f16; dmin[16] f16.
//   Q3_K, 1856 bytes: the 8 blocks (192 bytes each); sc[16 groups][16 rows] int8 (-32..31);
//     d[16] f16; 32 bytes pad.
// F16: per group, cols x 16 f16, element (r, k) at 16 k + r: one 32-byte load gives column k
// of all 16 rows (kernels take the f16-rounded f32 activation scratch).
// BF16: per group, column pairs: element (r, k) at 32 (k / 2) + 2 r + k % 2 (u16 units), so
// one 64-byte load holds columns k, k+1 of 16 rows as vdpbf16ps pairs (bf16 activations).
// The packed copy is as large as the original (Q4_K 2.8%, Q6_K 1% larger); the original
// stays mapped (GetRow, other ISAs) and the loader may drop its pages from memory.
//
// Thread safety: pure functions; PackWeights writes only dst.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/matmul.h"

namespace trellis {

inline constexpr int64_t kPackRows = 16;
inline constexpr int64_t kPackedQ4KSuperBytes = 2048 + 64 + 256;  // per 256 columns
inline constexpr int64_t kPackedQ5KSuperBytes = 8 * 320 + 64 + 256;       // per 256 columns
inline constexpr int64_t kPackedQ6KSuperBytes = 8 * 384 + 256 + 32 + 32;  // per 256 columns
inline constexpr int64_t kPackedIQ4XSSuperBytes = 8 * 256 + 32 + 128 + 32;  // per 256 columns
inline constexpr int64_t kPackedQ2KSuperBytes = 8 * 128 + 256 + 32 + 32;      // per 256 columns
inline constexpr int64_t kPackedQ3KSuperBytes = 8 * 192 + 256 + 32 + 32;      // per 256 columns

// 64-byte lines per 32-element block of the x16 layout of Q4_0, IQ4_NL (4), Q5_0, Q5_1
// (5) and Q8_0 (8).
constexpr int PackedLines(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kIQ4_NL ? 4
         : type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1 ? 5
                                                              : 8;
}

// True if `type` has an x16 layout (Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_XS, F16, BF16). Whether MatMul uses it
// depends on the CPU as well: see PackingUseful().
bool PackableType(GgmlType type);

// True if MatMul on this CPU runs packed kernels for w (AVX-512 VNNI and AVX2, with or
// without AVX-VNNI: every packable type; aarch64 NEON with dotprod: every type but F16 and
// BF16), so packing it at load time pays off.
bool PackingUseful(const WeightMatrix& w);

// Bytes of one 16-row group and of the whole packed copy of w (0 if not packable).
size_t PackedGroupBytes(GgmlType type, int64_t cols);
size_t PackedBytes(const WeightMatrix& w);

// Writes row groups [g_begin, g_end) of w's packed copy into dst (the start of the whole
// packed copy, 64-byte aligned, PackedBytes(w) bytes). Groups are independent, so
// callers may split the range across threads.
// REQUIRES: PackableType(w.type).
void PackWeights(const WeightMatrix& w, int64_t g_begin, int64_t g_end, uint8_t* dst);

}  // namespace trellis

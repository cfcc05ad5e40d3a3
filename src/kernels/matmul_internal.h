// Internals shared by the MatMul driver and its per-ISA tile kernels. Not a public API.
//
// Activation scratch layout, one row per token, each row padded to 64 bytes:
//   Q4_0 / Q8_0 weights:  int8 qs[cols]; float d[cols / 32]; int32 sum[cols / 32];
//                         float dsum[cols / 32]  (Q8_0 values, d = f16(d); sum of each
//                         block's qs and d * sum, for the packed kernels' weight offsets;
//                         packed Q4_K weights take this format too)
//   Q4_K / Q6_K weights:  int8 qs[cols]; float d[cols / 256]; int16 bsums[cols / 16];
//                         float dsum32[cols / 32]; int32 bias16[cols / 16]  (Q8_K;
//                         dsum32[j] = d * sum of the 32 qs of block j, for the packed
//                         Q4_K kernels' mins; bias16[g] = -32 * bsums[g], the packed Q6_K
//                         kernels' weight offset)
//   F16 weights:          float x[cols], each rounded through f16
//   BF16 weights:         uint16 x[cols], bf16 bits
//   F32 weights:          none; kernels read x directly.
// A tile kernel computes y for rows [r0, r0+nr) x tokens [t0, t0+nt), nr <= mr, nt <= nt.
//
// Thread safety: kernels are pure functions on caller-owned memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"

namespace trellis::matmul_internal {

struct TileArgs {
  const uint8_t* w;  // weight row r0
  int64_t w_stride;  // bytes between weight rows
  const uint8_t* a;  // activation row t0 (layout above)
  int64_t a_stride;  // bytes between activation rows
  int64_t cols;
  float* y;          // y of (t0, r0); element (t, r) at y[t * y_stride + r]
  int64_t y_stride;
  int nr;
  int nt;
};

using TileFn = void (*)(const TileArgs&);

struct TileKernel {
  TileFn fn = nullptr;  // null: this ISA has no kernel for the type
  int mr = 1;           // max rows per tile
  int nt = 1;           // max tokens per tile
};

// Byte offsets of the fields after qs and d in an activation row (layout above).
inline int64_t Q8_0SumOffset(int64_t cols) { return cols + 4 * (cols / 32); }
inline int64_t Q8KBsumsOffset(int64_t cols) { return cols + 4 * (cols / 256); }
inline int64_t Q8KDsum32Offset(int64_t cols) { return Q8KBsumsOffset(cols) + 2 * (cols / 16); }
inline int64_t Q8KBias16Offset(int64_t cols) { return Q8KDsum32Offset(cols) + 4 * (cols / 32); }

// Fills dsum32 and bias16 of a Q8_K activation row whose qs, d and bsums are written.
inline void FillQ8KBlockSums(uint8_t* row, int64_t cols) {
  const float* d = reinterpret_cast<const float*>(row + cols);
  const int16_t* bsums = reinterpret_cast<const int16_t*>(row + Q8KBsumsOffset(cols));
  float* dsum32 = reinterpret_cast<float*>(row + Q8KDsum32Offset(cols));
  for (int64_t j = 0; j < cols / 32; ++j) dsum32[j] = d[j / 8] * static_cast<float>(bsums[2 * j] + bsums[2 * j + 1]);
  int32_t* bias16 = reinterpret_cast<int32_t*>(row + Q8KBias16Offset(cols));
  for (int64_t g = 0; g < cols / 16; ++g) bias16[g] = -32 * bsums[g];
}

// The packed tiles' weight streams: each line kNear bytes ahead into L1 (the distance is
// the ISA's), and, for tiles of several tokens, kL2PrefetchBytes ahead into L2 as well.
// An 8-token tile spends ~8 cycles on a line, so its near prefetch leads by less than
// DRAM's latency; the far one keeps more lines in flight (packed_avx512.cc: measured).
inline constexpr int64_t kL2PrefetchBytes = 8192;
// kOn = false: none, for a tile whose weights an earlier tile has just read
// (PackedArgs::cached).
template <int NT, int64_t kNear, bool kOn = true>
__attribute__((always_inline)) inline void PrefetchWeights(const uint8_t* p) {
  if constexpr (!kOn) return;
  __builtin_prefetch(p + kNear, 0, 3);                                  // prefetcht0
  if constexpr (NT > 1) __builtin_prefetch(p + kL2PrefetchBytes, 0, 2);  // prefetcht1
}

// The x16 layouts of the 32-element block types (packed.h: Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL)
// keep each group's f16 block scales (Q5_1: then its mins) after its weight lines: a
// second stream, 32 bytes a block, that the lines' prefetch does not reach, and that the
// hardware prefetchers did not cover either: with it, one-token tiles over weights in
// DRAM run 1.04-1.25x faster (AVX-512; bench_kernels' dram/ rows) and decode 1.05-1.13x
// (IQ4_NL, Q4_0, Q8_0; `bench speed`, alternating rounds). A tile calls
// PrefetchScalesStart once and PrefetchScales for each block b, so each 64-byte line of
// scales is asked for kLead blocks (the lines' lead) before it is read. Past the group's
// end the addresses fall in the next group (or past the copy: a prefetch does not fault).
template <int64_t kLead>
__attribute__((always_inline)) inline void PrefetchScalesStart(const uint16_t* scales) {
  static_assert(kLead >= 2);
  for (int64_t b = 0; b < kLead; b += 2) __builtin_prefetch(scales + 16 * b, 0, 3);
}
template <int64_t kLead>
__attribute__((always_inline)) inline void PrefetchScales(const uint16_t* scales, int64_t b) {
  if (b % 2 == 0) __builtin_prefetch(scales + 16 * (b + kLead), 0, 3);
}

// 4 bytes at p (any alignment).
inline int32_t Load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// For each of nt activation rows starting at a (stride a_stride), a pointer to the field
// at byte offset `offset` of the row (layout above): out[t] = a + t * a_stride + offset.
template <typename T, int NT>
inline void RowFields(const uint8_t* a, int64_t a_stride, int64_t offset, const T* (&out)[NT]) {
  for (int t = 0; t < NT; ++t) out[t] = reinterpret_cast<const T*>(a + t * a_stride + offset);
}

// The activation layout a weight type multiplies with (layout above): kQ8_0 for the
// 32-element block types (Q4_0, Q5_0, Q5_1, Q8_0, IQ4_NL), kQ8_K for the 256-element ones
// (Q2_K .. Q6_K, IQ4_XS), the type itself for F16 / BF16 / F32.
inline GgmlType ActFamily(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kIQ4_NL: return GgmlType::kQ8_0;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS: return GgmlType::kQ8_K;
    default: return t;
  }
}

// Bytes of one activation row in scratch (0 for F32).
size_t ActRowBytes(GgmlType type, int64_t cols);

// Converts one activation row x[cols] into the scratch layout for `type`.
void QuantizeActRow(GgmlType type, const float* x, int64_t cols, uint8_t* dst);

// Same result as QuantizeActRow, byte for byte, with AVX2 + F16C (matmul_avx2.cc).
// REQUIRES: IsaSupported(KernelIsa::kAvx2).
void QuantizeActRowAvx2(GgmlType type, const float* x, int64_t cols, uint8_t* dst);

TileKernel GetTileKernelScalar(GgmlType type);
TileKernel GetTileKernelAvx2(GgmlType type, int64_t n_tokens);  // matmul_avx2.cc
// The AVX2 tiles of Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K and IQ4_XS (matmul_lowbit_avx2.cc);
// GetTileKernelAvx2 hands these types on to it.
TileKernel GetTileKernelLowbitAvx2(GgmlType type, int64_t n_tokens);
// Decode-sized batches (n_tokens <= kGemvMaxTokens): tiles of one weight row for the
// 32-element block types. Measured on Zen 4, one thread, a 64 MB Q4_0 matrix from DRAM:
// 1 token 3-row tiles 7.7 GB/s vs 1-row 27 GB/s; 4 tokens 4.2 vs 3.2 ms; 8 tokens 9.6 vs
// 7.0 ms. Prefill (larger batches) keeps the 3-row tiles, which reuse activations better.
inline constexpr int64_t kGemvMaxTokens = 8;
// The AVX-512 tile for a weight type and a batch of n_tokens rows (matmul_avx512.cc).
TileKernel GetTileKernelAvx512(GgmlType type, int64_t n_tokens);
// The aarch64 NEON tile ({} for a type without one): matmul_neon.cc, with the dotprod
// build (matmul_neondot.cc) where the CPU has it.
TileKernel GetTileKernelNeon(GgmlType type, int64_t n_tokens);
// The tile `isa` runs for a type: its own, else a narrower family's, else scalar.
TileKernel GetTileKernel(KernelIsa isa, GgmlType type, int64_t n_tokens);

// Packed (x16, packed.h) kernels: y for ng consecutive groups of 16 weight rows x nt tokens.
struct PackedArgs {
  const uint8_t* g;     // the first group's packed bytes
  int64_t group_bytes;  // bytes between groups
  int64_t nb;           // 32-element blocks per row
  const uint8_t* a;     // activation row t0 (layout above)
  int64_t a_stride;
  int64_t cols;
  float* y;             // y of (t0, first row of the group); element (t, r) at y[t * y_stride + r]
  int64_t y_stride;
  int ng;               // groups (1..PackedKernel::groups)
  int nr;               // rows of those groups that exist (1..16 * ng)
  int nt;               // tokens (1..kPackedMaxTokens)
  // The same weights were read by the tile just before (earlier tokens of a prefill
  // chunk), so they are in L1 or L2: a kernel may skip its software prefetches, which
  // then only take load slots. The 32-element block types do (bench_kernels, 512 tokens,
  // 8 alternating rounds: Q8_0 1.07x on one thread, 1.03x on two; Q4_0, Q5_0, IQ4_NL
  // 1.00-1.04x); the K-quants measured 1.00-1.01x without them and keep them.
  bool cached = false;
};
using PackedFn = void (*)(const PackedArgs&);

// Each of a tile's NT tokens' Q8_K activation row fields (layout above): qs, d (one per
// 256) and bias16 (-32 x each 16-element sum), as the Q2_K / Q3_K / Q6_K / IQ4_XS tiles
// read them.
template <int NT>
struct Q8KTokens {
  const uint8_t* q[NT];
  const float* d[NT];
  const int32_t* bias16[NT];
  explicit Q8KTokens(const PackedArgs& p) {
    RowFields(p.a, p.a_stride, 0, q);
    RowFields(p.a, p.a_stride, p.cols, d);
    RowFields(p.a, p.a_stride, Q8KBias16Offset(p.cols), bias16);
  }
};
inline constexpr int kPackedMaxTokens = 8;
// A tiled kernel may have a row_fn over row activations for batches of at most
// kRowFnMaxTokens tokens (decode), where building its per-tile operands costs more than
// the tiles save; ForTokens picks.
inline constexpr int kRowFnMaxTokens = 2;
struct PackedKernel {
  PackedFn fn = nullptr;  // null: no x16 layout for the type
  int groups = 1;         // max groups per tile
  bool tiled = false;     // reads tiled activations (below), not rows
  PackedFn row_fn = nullptr;
  PackedKernel ForTokens(int64_t n_tokens) const {
    if (row_fn == nullptr || n_tokens > kRowFnMaxTokens) return *this;
    return {row_fn, groups, false, nullptr};
  }
};

// Tiled Q8_0 activations, for the AVX-512 packed kernels of the 32-element block types: tokens in tiles of
// kPackedMaxTokens, tile T at T * TiledActStride(cols) (PackedArgs::a is the tile, a_stride
// the tile stride); in a tile, block b at kTiledBlockBytes * b holds int8 qs[8][32] (token
// slot-major), float d[8], int32 corr[8]. corr = -offset * the sum of the block's qs, with
// offset the weights' unsigned bias (8 for Q4_0, 128 for Q8_0): the int32 accumulator's
// start. Everything a tile reads per block is then at fixed offsets from one pointer, so
// the activation bytes go straight into vpdpbusd as broadcast memory operands; the row
// layout made the kernel carry 3 x 8 row pointers, more than the registers.
// Slots past the last token of the last tile are never written nor read.
// Tiled Q8_K activations (Q4_K, Q5_K and Q6_K's AVX-512 kernels) use the same blocks of 32: qs as
// the Q8_K row's, d[8] the super-block's scale of each token (repeated in its 8 blocks),
// and in place of corr int32 pair[8]: the int16 pair (sum of the block's qs 0..15, sum of
// 16..31), the Q8_K row's bsums, vpdpwssd's operand for Q4_K / Q5_K's mins and Q6_K's
// bias.
inline constexpr int64_t kTiledBlockBytes = 32 * kPackedMaxTokens + 8 * kPackedMaxTokens;
inline int64_t TiledActStride(int64_t cols) { return (cols / 32) * kTiledBlockBytes; }
inline int64_t TiledActBytes(int64_t cols, int64_t n_tokens) {
  return (n_tokens + kPackedMaxTokens - 1) / kPackedMaxTokens * TiledActStride(cols);
}
// The tiled activations' offset for a packed weight type: the unsigned bias of its stored
// weights (Q4_0 8, Q5_0 16, Q8_0 and IQ4_NL's grid 128), so corr starts the accumulator
// at the correction; Q5_1 (no bias, an offset m per block) takes -1: corr is the sum.
inline int32_t TiledActOffset(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return 8;
    case GgmlType::kQ5_0: return 16;
    case GgmlType::kQ5_1: return -1;
    default: return 128;
  }
}
// Writes one token's activations x[cols] into slot `slot` of the tile at `tile`, the same
// values as QuantizeActRow's Q8_0 row (AVX2 + F16C, matmul_avx2.cc).
void QuantizeActTiledAvx2(const float* x, int64_t cols, int32_t offset, uint8_t* tile, int slot);
// The same for tiled Q8_K activations (the values of QuantizeActRow's Q8_K row).
void QuantizeActTiledQ8KAvx2(const float* x, int64_t cols, uint8_t* tile, int slot);

// Packed kernels read the same activation scratch as the row-major ones (layout above),
// or tiled activations where PackedKernel::tiled says so.
PackedKernel GetPackedKernelAvx512(GgmlType type);  // packed_avx512.cc
// packed_avx2.cc (the same types as AVX-512): the AVX-VNNI build where the CPU has it and
// TRELLIS_AVXVNNI is not 0, else plain AVX2.
PackedKernel GetPackedKernelAvx2(GgmlType type);
// REQUIRES: GetCpuFeatures().avxvnni.
PackedKernel GetPackedKernelAvxVnni(GgmlType type);     // packed_avxvnni.cc
// packed_neondot.cc (every packable type but F16 and BF16). REQUIRES: NeonDotprodEnabled().
PackedKernel GetPackedKernelNeonDot(GgmlType type);
// The packed kernel for an ISA family ({} for scalar or a type without one).
PackedKernel GetPackedKernel(KernelIsa isa, GgmlType type);
// Whether MatMulShared runs `outs` as one pass over one activation conversion, and then
// each one's kernel in pks: every matrix packed, the same cols, kernels that read the same
// activation bytes (the same family, tiled or not alike, and for tiled Q8_0 the same
// weight offset), e.g. Q4_K_M's Q4_K q and k with a Q6_K v, at most kMaxSharedOuts.
inline constexpr size_t kMaxSharedOuts = 4;
bool SharedPackedKernels(KernelIsa isa, std::span<const MatMulOut> outs, int64_t n_tokens,
                         std::array<PackedKernel, kMaxSharedOuts>& pks);

// MatMulShared with a forced kernel family.
void MatMulSharedWithIsa(KernelIsa isa, std::span<const MatMulOut> outs, const float* x, int64_t x_stride,
                         int64_t n_tokens, ThreadPool& pool, void* scratch);

// MatMul with a forced kernel family (falls back to scalar for types the ISA lacks).
// REQUIRES: IsaSupported(isa).
void MatMulWithIsa(KernelIsa isa, const WeightMatrix& w, const float* x, int64_t x_stride,
                   int64_t n_tokens, float* y, int64_t y_stride, ThreadPool& pool, void* scratch);

}  // namespace trellis::matmul_internal

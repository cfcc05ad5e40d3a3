// Internals of attention.cc shared with its ISA-specific files and tests: the unit of
// work of PagedAttention (one tile of query rows x query heads against one KV head) and
// the per-ISA kernels that process it. Not part of the public API.
//
// Thread safety: a tile kernel touches only its tile's output rows and its own scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "util/fp16.h"

namespace trellis::internal {

// Max queries (rows x heads) one work item processes together: the K/V tile each block
// converts to f32 serves that many queries, so more is faster (bench speed -p 128 -d 2816
// on 2 cores: 64 against 16 gave 1.15x at head_dim 64, 1.12x at 128, 1.4x at 256), while
// PagedAttention keeps enough items for its threads. Bounds per-thread scratch
// independently of the model's GQA ratio.
inline constexpr int kAttnMaxQueries = 64;
inline int AttnMaxQueries(int /*head_dim*/) { return kAttnMaxQueries; }

// Floats of scratch one thread needs (see AttnTile::scratch), a multiple of 16.
inline size_t AttentionScratchFloatsPerThread(int head_dim, int block_size) {
  const size_t hd = static_cast<size_t>(head_dim), bs = static_cast<size_t>(block_size);
  const size_t q = static_cast<size_t>(AttnMaxQueries(head_dim));
  const size_t n = 2 * bs * hd + 2 * q * hd + q * bs + 2 * q;
  return (n + 15) / 16 * 16;
}

// One work item: query rows [0, n_rows) (row r at position pos_first + r, attending to KV
// positions [0, pos_first + r]) x query heads [0, n_heads) of one KV head.
// REQUIRES: n_rows * n_heads <= AttnMaxQueries(head_dim).
struct AttnTile {
  const uint8_t* base;      // pool base
  size_t block_bytes;       // bytes per block
  size_t k_off, v_off;      // byte offset in a block of (layer, K|V, kv head, slot 0)
  KvType k_type, v_type;    // element types of K and V rows
  size_t k_row, v_row;      // bytes of one slot's K / V row (KvRowBytes)
  int head_dim, block_size;
  const int32_t* block_table;  // the sequence's block table
  int32_t pos_first;           // position of row 0
  int n_rows, n_heads;
  const float* q;  // element (row r, head j, d) at q[r * q_stride + j * head_dim + d]
  int64_t q_stride;
  float* out;  // same indexing as q with out_stride
  int64_t out_stride;
  float scale;
  float softcap;   // AttnOptions::softcap (0: none)
  int32_t window;  // AttnOptions::window (0: none): row r attends (pos_first + r - window, pos_first + r]
  // Per-thread scratch, AttentionScratchFloatsPerThread floats, laid out as:
  //   kt  [head_dim][block_size]   K tile, f32 (SIMD rows kernel: transposed; scalar and
  //                                SIMD lanes kernel: [block_size][head_dim])
  //   vt  [block_size][head_dim]   V tile, f32
  //   qs  [Q][head_dim]   scale * q           (Q = AttnMaxQueries(head_dim); lanes kernel:
  //                                            transposed, [head_dim][Q])
  //   s   [Q][block_size] scores / probabilities of the current block (lanes kernel:
  //                       [block_size][Q])
  //   acc [Q][head_dim]   unnormalised output
  //   m   [Q], l [Q]      running max and sum
  float* scratch;
};

// One K or V row of head_dim elements in a quantized type (q8_0, q4_0) -> f32, as ggml's
// dequantizers compute it (d * q). Inline, so each ISA's translation unit compiles (and
// vectorizes) its own copy.
inline void DequantKvRow(KvType type, const uint8_t* src, float* dst, int head_dim) {
  if (type == KvType::kQ8_0) {
    for (int b = 0; b < head_dim / 32; ++b, src += 34, dst += 32) {
      uint16_t h;
      std::memcpy(&h, src, 2);
      const float d = Fp16ToFp32(h);
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j]);
    }
  } else {  // q4_0: element j of a block is the low nibble of qs[j], j + 16 the high one; minus 8
    for (int b = 0; b < head_dim / 32; ++b, src += 18, dst += 32) {
      uint16_t h;
      std::memcpy(&h, src, 2);
      const float d = Fp16ToFp32(h);
      const uint8_t* q = src + 2;
      for (int j = 0; j < 16; ++j) {
        dst[j] = d * static_cast<float>((q[j] & 0x0F) - 8);
        dst[j + 16] = d * static_cast<float>((q[j] >> 4) - 8);
      }
    }
  }
}

// Quantized types hold rows of at most this many values (a query row's q8_0 copy is on
// the stack).
inline constexpr int kKvMaxQuantizedHeadDim = 512;

// A query row as llama.cpp's flash attention takes it against a quantized K: through
// q8_0 (its K.Q is a q8_0 x K-type dot product) and back, into out[head_dim]. Returns out.
inline const float* QueryThroughQ8_0(const float* q, int head_dim, float* out) {
  BlockQ8_0 b[kKvMaxQuantizedHeadDim / 32];
  QuantizeRowQ8_0(q, b, head_dim);
  DequantKvRow(KvType::kQ8_0, reinterpret_cast<const uint8_t*>(b), out, head_dim);
  return out;
}

void AttnTileScalar(const AttnTile& t);
// REQUIRES: head_dim % 8 == 0 and block_size % 8 == 0.
void AttnTileAvx2(const AttnTile& t);
// REQUIRES: head_dim % 8 == 0 and block_size % 8 == 0.
void AttnTileAvx512(const AttnTile& t);
// REQUIRES: head_dim % 8 == 0 and block_size % 8 == 0. aarch64 only (attention_neon.cc).
void AttnTileNeon(const AttnTile& t);

// x: [n] f32 -> y: [n] f16 with F16C (round to nearest even).
void F32ToF16Avx2(const float* x, uint16_t* y, int64_t n);

// PagedAttention with the tile kernel of a given level (tests compare every level).
void PagedAttentionAt(SimdLevel level, const PagedKv& kv, int layer,
                      std::span<const AttnSeq> seqs, const float* q, int64_t q_stride,
                      int n_head, float scale, float* out, int64_t out_stride,
                      ThreadPool& pool, float* scratch, const AttnOptions& opt = {});

// First KV position the tile's earliest row attends to (0 without a window).
inline int32_t AttnTileFirstPos(const AttnTile& t) {
  return t.window > 0 && t.pos_first - t.window + 1 > 0 ? t.pos_first - t.window + 1 : 0;
}
// Slots [lo, n) of the block starting at p0 that query row r attends to.
inline int AttnRowFirstSlot(const AttnTile& t, int r, int32_t p0) {
  if (t.window <= 0) return 0;
  const int32_t lo = t.pos_first + r - t.window + 1 - p0;
  return lo > 0 ? static_cast<int>(lo) : 0;
}

}  // namespace trellis::internal

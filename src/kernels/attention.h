// Paged KV cache kernels: write K/V rows into blocks of f16, q8_0 or q4_0 rows
// (docs/kv_layout.md, version 1) and causal grouped-query attention that reads them block
// by block with an online (flash-style) softmax.
//
// Thread safety: KvWrite and PagedAttentionRef are plain functions on caller-owned
// memory. PagedAttention runs one job on `pool` (so, like ThreadPool::Run, it must be
// called from one thread at a time per pool) and uses `scratch` exclusively for the
// duration of the call. No function here allocates or takes a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "util/thread_pool.h"

namespace trellis {

// The element type of K or of V in the cache (docs/kv_layout.md). The quantized ones are
// ggml's q8_0 and q4_0 blocks of 32 (an f16 scale, then the codes), one row of head_dim
// per slot, as llama.cpp's -ctk/-ctv q8_0 and q4_0 store them.
enum class KvType : uint8_t { kF16 = 0, kQ8_0 = 1, kQ4_0 = 2 };
const char* KvTypeName(KvType t);
// "f16", "q8_0", "q4_0" -> the type; false for any other name.
bool ParseKvType(std::string_view name, KvType* t);
// The inverse of KvLayout::TypeCode; false for a code that names no types (it may come
// from a peer). Inline: the grid's wire decoder (and its fuzzer) use it without the
// kernels.
inline bool KvTypesFromCode(uint32_t code, KvType* k, KvType* v) {
  const uint32_t kc = code & 0xFF, vc = code >> 8;
  if (kc > static_cast<uint32_t>(KvType::kQ4_0) || vc > static_cast<uint32_t>(KvType::kQ4_0)) return false;
  *k = static_cast<KvType>(kc);
  *v = static_cast<KvType>(vc);
  return true;
}
// Bytes of one slot's row of head_dim elements. REQUIRES: head_dim % 32 == 0 unless f16.
size_t KvRowBytes(KvType t, int head_dim);

// Geometry of the paged KV cache (docs/kv_layout.md).
struct KvLayout {
  int n_layer, n_head_kv, head_dim, block_size;
  KvType k_type = KvType::kF16, v_type = KvType::kF16;

  // Bytes of one slot's K (kv 0) or V (kv 1) row of one head, and of a head's
  // [block_size] tile of them.
  size_t RowBytes(int kv) const { return KvRowBytes(kv == 0 ? k_type : v_type, head_dim); }
  size_t TileBytes(int kv) const { return static_cast<size_t>(block_size) * RowBytes(kv); }
  // Bytes of one layer in a block: every head's K tile, then every head's V tile, padded
  // to a multiple of 64 (never needed for f16 with block_size x head_dim a multiple of 32).
  size_t LayerBytes() const;
  // Bytes of one block: n_layer * LayerBytes().
  size_t BlockBytes() const;
  // Byte offset from the block start of (layer, kv in {0 = K, 1 = V}, kv head, slot).
  size_t ByteOffset(int layer, int kv, int head, int slot) const;
  // The (K, V) types as one number: k | v << 8 (0: both f16). What names blocks of this
  // layout in the prefix store and the grid's handshake.
  uint32_t TypeCode() const { return static_cast<uint32_t>(k_type) | static_cast<uint32_t>(v_type) << 8; }
};

// The rotation llama.cpp applies around a quantized cache (its attention rotation, since
// ggml-org/llama.cpp#21038): an orthonormal Walsh-Hadamard transform of each chunk of n
// consecutive values of a head's row, which spreads a row's outliers over the whole
// chunk so a 32-value block loses less to q8_0 / q4_0. K is rotated, and Q with it (Q.K is
// unchanged), in chunks of the largest power of two dividing head_dim; V in chunks of 64,
// and the attention output back (the transform is its own inverse). Only for a quantized
// type and head_dim a multiple of 64, as llama.cpp. Returns n, or 0 for no rotation.
int KvRotationK(const KvLayout& l);
int KvRotationV(const KvLayout& l);
// Rows [0, n_rows) of x (row stride `stride` floats), the first `width` floats of each
// in chunks of n: chunk <- H_n chunk / sqrt(n), H_n the Sylvester Hadamard matrix
// (entries +-1). REQUIRES: n a power of two, width % n == 0.
void HadamardRows(float* x, int64_t stride, int64_t n_rows, int64_t width, int n);

// A pool of KV blocks: block b occupies base + b * layout.BlockBytes(). Borrowed.
struct PagedKv {
  uint8_t* base;
  KvLayout layout;
};

// One sequence's part of a batch: query rows [q_row0, q_row0 + n_tokens) are the
// sequence's positions pos0 .. pos0+n_tokens-1; token i attends causally to KV positions
// [0, pos0 + i]. block_table[p / block_size] is the block of position p (borrowed, valid
// for the call).
struct AttnSeq {
  const int32_t* block_table;
  int32_t pos0;
  int32_t n_tokens;
  int32_t q_row0;
};

// What some architectures change in attention (Gemma 2/3). The defaults are plain causal
// softmax attention.
struct AttnOptions {
  // > 0: scores (already times scale) become softcap * tanh(score / softcap) before the
  // softmax (Gemma 2's attention logit soft-capping).
  float softcap = 0.0f;
  // > 0: a sliding-window layer: the query at position p attends to positions
  // (p - window, p] only, as llama.cpp's standard SWA masks p - p_k >= window. Blocks
  // wholly before the window are not read.
  int32_t window = 0;
};

// Stores k, v of every row of each sequence at its positions in the layout's types (f16:
// round to nearest even; q8_0, q4_0: llama.cpp's reference quantizers). k, v: [n_rows][n_head_kv * head_dim] with row strides k_stride / v_stride
// (floats); row q_row0 + i of a sequence goes to position pos0 + i.
void KvWrite(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs, const float* k,
             int64_t k_stride, const float* v, int64_t v_stride);
void KvWriteRef(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride);

// Per-thread scratch floats PagedAttention needs (sized once at start-up), in total for
// n_threads threads.
size_t AttentionScratchFloats(int n_threads, int head_dim, int block_size);

// Causal grouped-query attention over the paged cache (KV must already hold these
// tokens' own K/V, written by KvWrite).
// q: [n_rows][n_head * head_dim] (stride q_stride), out: same shape (stride out_stride).
// Query head h uses KV head h / (n_head / n_head_kv). out = softmax(scale * q.K^T) V per
// head, computed block by block with an online softmax (no score matrix). Runs on all
// threads of pool; work items are (sequence, tile of query rows, KV head, chunk of its
// query heads), so the GQA group shares each K/V tile, taken from an atomic counter
// heaviest-first (balances causal prefill). No heap allocation.
// REQUIRES: scratch holds AttentionScratchFloats(pool.size(), head_dim, block_size)
// floats; n_head % n_head_kv == 0; out does not overlap q.
void PagedAttention(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs,
                    const float* q, int64_t q_stride, int n_head, float scale, float* out,
                    int64_t out_stride, ThreadPool& pool, float* scratch, const AttnOptions& opt = {});

// Scalar reference: dense, per head: dequantizes the K/V it needs with the weights'
// reference dequantizers (DequantizeRow), full softmax, no paging tricks. Allocates
// (test use only).
void PagedAttentionRef(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs,
                       const float* q, int64_t q_stride, int n_head, float scale, float* out,
                       int64_t out_stride, const AttnOptions& opt = {});

}  // namespace trellis

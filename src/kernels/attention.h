// Paged KV cache kernels: write K/V rows into f16 blocks (docs/kv_layout.md, version 1)
// and causal grouped-query attention that reads them block by block with an online
// (flash-style) softmax.
//
// Thread safety: KvWrite and PagedAttentionRef are plain functions on caller-owned
// memory. PagedAttention runs one job on `pool` (so, like ThreadPool::Run, it must be
// called from one thread at a time per pool) and uses `scratch` exclusively for the
// duration of the call. No function here allocates or takes a lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "util/thread_pool.h"

namespace trellis {

// Geometry of the paged KV cache (docs/kv_layout.md).
struct KvLayout {
  int n_layer, n_head_kv, head_dim, block_size;
  // Bytes of one block: n_layer * 2 * n_head_kv * block_size * head_dim * 2.
  size_t BlockBytes() const;
  // Offset in f16 elements from the block start of (layer, kv in {0 = K, 1 = V}, kv head,
  // slot), d = 0: (((layer * 2 + kv) * n_head_kv + head) * block_size + slot) * head_dim.
  size_t ElementOffset(int layer, int kv, int head, int slot) const;
};

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

// Stores k, v (f32 -> f16, round to nearest even) of every row of each sequence at its
// positions. k, v: [n_rows][n_head_kv * head_dim] with row strides k_stride / v_stride
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

// Scalar reference: dense, per head: dequantizes the f16 K/V it needs, full softmax, no
// paging tricks. Allocates (test use only).
void PagedAttentionRef(const PagedKv& kv, int layer, std::span<const AttnSeq> seqs,
                       const float* q, int64_t q_stride, int n_head, float scale, float* out,
                       int64_t out_stride, const AttnOptions& opt = {});

}  // namespace trellis

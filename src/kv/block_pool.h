// BlockPool: the fixed-capacity pool of KV blocks shared by every session.
//
// One contiguous, 64-byte aligned arena of n_blocks * layout.BlockBytes() bytes,
// allocated once at start-up. Blocks are named by int32 ids; each has a reference
// count. Allocate pops the free list (refcount 1), Acquire adds a reference to a live
// block (prefix sharing: a second session reuses a block instead of recomputing it),
// Release drops one and returns the block to the free list at zero. All three are O(1)
// and perform no heap allocation.
//
// A layout of zero layers (a grid head that runs no layers) makes a pool of ids only.
//
// Running out is not an error: Allocate returns kNoBlock and the caller evicts,
// preempts or waits (see the scheduler).
//
// Thread safety: not thread-safe. The engine thread owns the pool; attention kernels
// read block memory concurrently during a forward pass, which the engine thread
// orchestrates.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/attention.h"
#include "util/status.h"

namespace trellis {

class BlockPool {
 public:
  static constexpr int32_t kNoBlock = -1;

  // Sizes the pool from a block count, or from a byte budget via BlocksForBytes.
  static Result<std::unique_ptr<BlockPool>> Create(const KvLayout& layout, int32_t n_blocks);
  static int64_t BlocksForBytes(const KvLayout& layout, int64_t bytes) {
    return bytes / static_cast<int64_t>(layout.BlockBytes());
  }

  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Returns a block with refcount 1, or kNoBlock when the pool is exhausted.
  int32_t Allocate();
  // REQUIRES: refcount(id) > 0.
  void Acquire(int32_t id);
  // REQUIRES: refcount(id) > 0. Frees the block when the count reaches zero.
  void Release(int32_t id);

  int32_t refcount(int32_t id) const { return refcount_[static_cast<size_t>(id)]; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t n_used() const { return n_blocks_ - n_free(); }
  const KvLayout& layout() const { return layout_; }
  size_t block_bytes() const { return block_bytes_; }
  uint8_t* BlockData(int32_t id) { return base_ + static_cast<size_t>(id) * block_bytes_; }
  // Copy-on-write of a cached block's prefix: copies the K/V of slots [0, n_slots) of
  // block src, every layer, into block dst. REQUIRES: src != dst, 0 <= n_slots <= block_size.
  void CopySlots(int32_t src, int32_t dst, int32_t n_slots);
  PagedKv view() const { return PagedKv{base_, layout_}; }

 private:
  BlockPool(const KvLayout& layout, int32_t n_blocks, uint8_t* base);

  KvLayout layout_;
  int32_t n_blocks_;
  size_t block_bytes_;
  uint8_t* base_;                 // owned, aligned_alloc
  std::vector<int32_t> refcount_;  // [n_blocks]
  std::vector<int32_t> free_;      // stack of free ids, capacity n_blocks
};

}  // namespace trellis

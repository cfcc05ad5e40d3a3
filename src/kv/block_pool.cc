#include "kv/block_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/core.h>

namespace trellis {

Result<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout, int32_t n_blocks) {
  if (n_blocks <= 0) return InvalidArgument(fmt::format("KV pool needs at least one block (got {})", n_blocks));
  const size_t bb = layout.BlockBytes();
  if (bb % 64 != 0) return InvalidArgument(fmt::format("KV block size {} bytes is not a multiple of 64", bb));
  // bb == 0: a pool of no layers (a grid head that runs none) only hands out ids.
  const size_t total = std::max<size_t>(64, bb * static_cast<size_t>(n_blocks));
  void* p = std::aligned_alloc(64, total);
  if (!p) return ResourceExhausted(fmt::format("cannot allocate {} MiB for {} KV blocks", total >> 20, n_blocks));
  // Touch it all now: the pool is resident from the start (as llama.cpp's KV cache is), so
  // memory use shows at start-up and not as a surprise under load, and no block ever holds
  // another process's old bytes.
  std::memset(p, 0, total);
  return std::unique_ptr<BlockPool>(new BlockPool(layout, n_blocks, static_cast<uint8_t*>(p)));
}

BlockPool::BlockPool(const KvLayout& layout, int32_t n_blocks, uint8_t* base)
    : layout_(layout), n_blocks_(n_blocks), block_bytes_(layout.BlockBytes()), base_(base),
      refcount_(static_cast<size_t>(n_blocks), 0) {
  free_.reserve(static_cast<size_t>(n_blocks));
  // Hand out low ids first: pop from the back.
  for (int32_t i = n_blocks - 1; i >= 0; --i) free_.push_back(i);
}

BlockPool::~BlockPool() { std::free(base_); }

int32_t BlockPool::Allocate() {
  if (free_.empty()) return kNoBlock;
  const int32_t id = free_.back();
  free_.pop_back();
  refcount_[static_cast<size_t>(id)] = 1;
  return id;
}

void BlockPool::Acquire(int32_t id) {
  TRELLIS_CHECK(id >= 0 && id < n_blocks_ && refcount_[static_cast<size_t>(id)] > 0);
  ++refcount_[static_cast<size_t>(id)];
}

void BlockPool::Release(int32_t id) {
  TRELLIS_CHECK(id >= 0 && id < n_blocks_ && refcount_[static_cast<size_t>(id)] > 0);
  if (--refcount_[static_cast<size_t>(id)] == 0) free_.push_back(id);
}

void BlockPool::CopySlots(int32_t src, int32_t dst, int32_t n_slots) {
  TRELLIS_CHECK(src >= 0 && src < n_blocks_ && dst >= 0 && dst < n_blocks_ && src != dst);
  TRELLIS_CHECK(n_slots >= 0 && n_slots <= layout_.block_size);
  if (n_slots == 0) return;
  const uint8_t* from = BlockData(src);
  uint8_t* to = BlockData(dst);
  // Each (layer, K/V, kv head) is a [block_size] run of rows: copy its first n_slots rows.
  for (int l = 0; l < layout_.n_layer; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const size_t bytes = static_cast<size_t>(n_slots) * layout_.RowBytes(kv);
      for (int h = 0; h < layout_.n_head_kv; ++h) {
        const size_t off = layout_.ByteOffset(l, kv, h, 0);
        std::memcpy(to + off, from + off, bytes);
      }
    }
  }
}

}  // namespace trellis

// Arena: the memory tier's space. One anonymous mapping (the server registers it with the
// transport, so peers read tensors straight out of it), handed out first fit in byte
// ranges; a freed range merges with free neighbours. Nothing here evicts: Take fails when
// no hole is large enough, and the caller (Tiers) decides what to evict.
//
// Thread safety: none; the store server's loop thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "util/status.h"

namespace trellis::store {

class Arena {
 public:
  // Maps `bytes` (at least 4 KiB), asking for huge pages where the kernel offers them.
  static Result<std::unique_ptr<Arena>> Map(uint64_t bytes);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  uint8_t* data() const { return base_; }
  uint64_t capacity() const { return capacity_; }
  // The offset of `bytes` free bytes (the first hole that holds them), now taken; nullopt
  // if bytes is 0 or no hole is large enough.
  std::optional<uint64_t> Take(uint64_t bytes);
  // Returns [offset, offset + bytes), which Take handed out.
  void Free(uint64_t offset, uint64_t bytes);
  uint64_t free_bytes() const;
  size_t holes() const { return free_.size(); }

 private:
  Arena(uint8_t* base, uint64_t capacity);
  uint8_t* base_;
  uint64_t capacity_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length; no two adjacent
};

}  // namespace trellis::store

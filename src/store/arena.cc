#include "store/arena.h"

#include <sys/mman.h>

#include <fmt/format.h>

namespace trellis::store {

Result<std::unique_ptr<Arena>> Arena::Map(uint64_t bytes) {
  if (bytes < 4096) return InvalidArgument("--mem must be at least 4K");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return ResourceExhausted(fmt::format("cannot map {} bytes for the store", bytes));
  // Huge pages where the kernel offers them on request (THP "madvise" mode): a 90 MB
  // publish otherwise takes ~22k first-touch page faults on the loop thread. Advisory;
  // failure changes nothing but speed.
  madvise(p, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<Arena>(new Arena(static_cast<uint8_t*>(p), bytes));
}

Arena::Arena(uint8_t* base, uint64_t capacity) : base_(base), capacity_(capacity) { free_[0] = capacity; }

Arena::~Arena() { munmap(base_, capacity_); }

std::optional<uint64_t> Arena::Take(uint64_t bytes) {
  if (bytes == 0) return std::nullopt;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= bytes) {
      const uint64_t off = it->first, len = it->second;
      free_.erase(it);
      if (len > bytes) free_[off + bytes] = len - bytes;
      return off;
    }
  }
  return std::nullopt;
}

void Arena::Free(uint64_t offset, uint64_t bytes) {
  auto it = free_.emplace(offset, bytes).first;
  if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

uint64_t Arena::free_bytes() const {
  uint64_t n = 0;
  for (const auto& [off, len] : free_) n += len;
  return n;
}

}  // namespace trellis::store

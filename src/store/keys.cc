#include "store/keys.h"

#include <cstdio>
#include <cstdint>
#include <cstring>

#include <xxhash.h>

#include "store/protocol.h"
#include "util/checksum.h"

namespace trellis::store {

std::string Key::Hex() const {
  char b[33];
  std::snprintf(b, sizeof b, "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  return b;
}

Key Namespace::Hash() const {
  uint8_t b[8 + 4 + 4 + 4 + 8 + 8];
  size_t o = 0;
  auto put = [&](const void* p, size_t n) {
    std::memcpy(b + o, p, n);
    o += n;
  };
  const uint64_t tag = 0x5452454c4c495331ull;  // "TRELLIS1": a namespace, not a block
  put(&tag, 8);
  put(&model_fingerprint, 8);
  put(&block_tokens, 4);
  put(&kv_dtype, 4);
  put(&layout_version, 4);
  put(&salt, 8);
  const XXH128_hash_t h = XXH3_128bits(b, o);
  return {h.low64, h.high64};
}

std::vector<Key> ChainKeys(const Namespace& ns, std::span<const int32_t> tokens) {
  std::vector<Key> keys;
  if (ns.block_tokens == 0) return keys;
  const size_t n = tokens.size() / ns.block_tokens;
  keys.reserve(n);
  Key prev = ns.Hash();
  std::vector<uint8_t> buf(sizeof(Key) + ns.block_tokens * sizeof(int32_t));
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(buf.data(), &prev, sizeof prev);
    std::memcpy(buf.data() + sizeof prev, tokens.data() + i * ns.block_tokens, ns.block_tokens * sizeof(int32_t));
    const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
    prev = {h.low64, h.high64};
    keys.push_back(prev);
  }
  return keys;
}

void SliceChecksums(const uint8_t* block, uint64_t block_bytes, uint32_t slices, uint64_t* out) {
  const uint64_t each = block_bytes / slices;
  for (uint32_t k = 0; k < slices; ++k) out[k] = Checksum64(block + k * each, each);
}

}  // namespace trellis::store

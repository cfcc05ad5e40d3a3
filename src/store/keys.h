// Names in the prefix tensor store (docs/store.md, "Data model").
//
// A namespace is everything that must match for stored K/V to be usable: the model's
// fingerprint (weights and tokenizer), the block size in tokens, the KV dtype and layout
// version, and the cache salt. A token sequence is named by the chain of its whole
// blocks' hashes: key(i) = XXH3-128(key(i-1) || the i-th block's token ids), key(0) the
// namespace's hash. key(i) therefore names the whole prefix of i blocks in its
// namespace, and two sequences share key(i) exactly when they share that prefix.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace trellis::store {

struct Key {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Key&) const = default;
  std::string Hex() const;
};

struct KeyHash {
  size_t operator()(const Key& k) const { return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)); }
};

// Blocks [first, first + count) of tensor `tensor` stored by node `owner`.
struct Run {
  uint64_t owner = 0, tensor = 0;
  uint32_t first = 0, count = 0;
};

struct Namespace {
  uint64_t model_fingerprint = 0;
  uint32_t block_tokens = 32;
  uint32_t kv_dtype = 0;        // the engine's KV element type code
  uint32_t layout_version = 1;  // docs/kv_layout.md
  uint64_t salt = 0;            // 0: no salt
  Key Hash() const;
};

// Keys of every whole block of `tokens` (a trailing partial block has none).
std::vector<Key> ChainKeys(const Namespace& ns, std::span<const int32_t> tokens);

}  // namespace trellis::store

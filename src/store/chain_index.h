// ChainIndex: the chain keys placed on this server (docs/store.md, "Data model"), each
// naming where its block is stored: key -> (owner, tensor, block index inside the
// tensor); and the single-flight claims on keys some client is computing now.
//
// Lookup walks a sequence's keys to the longest indexed prefix, as runs of consecutive
// blocks of one tensor. The first writer of a key wins; an entry goes when its tensor's
// owner is known to have lost the tensor (Forget). A claim lives until its key is
// committed, the claimer unclaims it, or its time is up; at most kMaxClaims are kept.
//
// Thread safety: none; the store server's loop thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "store/keys.h"
#include "store/protocol.h"

namespace trellis::store {

struct IndexEntry {
  uint64_t owner = 0, tensor = 0;
  uint32_t index = 0;
};

class ChainIndex {
 public:
  using Clock = std::chrono::steady_clock;

  // The longest indexed prefix of `keys` (matched, runs); the keys past it go to `rest`
  // when given.
  LookupReply Lookup(std::span<const Key> keys, std::vector<Key>* rest) const;
  // Single-flight over `rest` (the keys past the stored prefix): counts the leading keys
  // another client holds live claims on (pending, and when the latest of those ends),
  // then claims for `client` the keys after them, until one is held by another client,
  // for ttl_ms (0: claims nothing). Fills reply.pending, pending_ms, claimed.
  void Claim(std::span<const Key> rest, uint64_t client, uint32_t ttl_ms, Clock::time_point now, LookupReply& reply);
  // Drops `client`'s claims of `keys`; the number dropped.
  uint32_t Unclaim(uint64_t client, std::span<const Key> keys);
  // Indexes keys[i] -> (owner, tensor, i) for each key not indexed yet (first writer
  // wins), calling on_new for each, and ends every claim of the keys (they are computed).
  // The number newly indexed.
  uint32_t Commit(uint64_t owner, uint64_t tensor, std::span<const Key> keys,
                  const std::function<void(const Key&, uint32_t index)>& on_new);
  // An entry as the SSD tier's log left it (at start); false if the key is indexed.
  bool Restore(const Key& key, const IndexEntry& e);
  // Drops the entries of (owner, tensor); the number dropped.
  uint64_t Forget(uint64_t owner, uint64_t tensor);

  size_t size() const { return index_.size(); }
  uint64_t live_claims(Clock::time_point now) const;

 private:
  struct Hold {
    uint64_t client;
    Clock::time_point until;
  };
  std::unordered_map<Key, IndexEntry, KeyHash> index_;
  std::map<std::pair<uint64_t, uint64_t>, std::vector<Key>> keys_of_;  // (owner, tensor) -> its keys here
  std::unordered_map<Key, Hold, KeyHash> claims_;
};

}  // namespace trellis::store

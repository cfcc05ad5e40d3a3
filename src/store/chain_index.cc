#include "store/chain_index.h"

#include <algorithm>

namespace trellis::store {

LookupReply ChainIndex::Lookup(std::span<const Key> keys, std::vector<Key>* rest) const {
  LookupReply out;
  size_t i = 0;
  for (; i < keys.size(); ++i) {
    auto it = index_.find(keys[i]);
    if (it == index_.end()) break;
    const IndexEntry& e = it->second;
    if (!out.runs.empty() && out.runs.back().owner == e.owner && out.runs.back().tensor == e.tensor &&
        out.runs.back().first + out.runs.back().count == e.index) {
      ++out.runs.back().count;
    } else {
      out.runs.push_back({e.owner, e.tensor, e.index, 1});
    }
    ++out.matched;
  }
  if (rest) rest->assign(keys.begin() + static_cast<ptrdiff_t>(i), keys.end());
  return out;
}

void ChainIndex::Claim(std::span<const Key> rest, uint64_t client, uint32_t ttl_ms, Clock::time_point now,
                       LookupReply& reply) {
  uint32_t pending = 0, claimed = 0;
  int64_t pending_ms = 0;
  size_t i = 0;
  for (; i < rest.size(); ++i) {
    auto it = claims_.find(rest[i]);
    if (it == claims_.end() || it->second.until <= now || it->second.client == client) break;
    pending_ms = std::max<int64_t>(pending_ms,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(it->second.until - now).count());
    ++pending;
  }
  if (claims_.size() + (rest.size() - i) > kMaxClaims) {
    std::erase_if(claims_, [now](const auto& kv) { return kv.second.until <= now; });
  }
  for (; i < rest.size() && ttl_ms > 0 && claims_.size() < kMaxClaims; ++i) {
    auto it = claims_.find(rest[i]);
    if (it != claims_.end() && it->second.until > now && it->second.client != client) break;
    claims_[rest[i]] = Hold{client, now + std::chrono::milliseconds(ttl_ms)};
    ++claimed;
  }
  reply.pending = pending;
  reply.pending_ms = static_cast<uint32_t>(pending_ms);
  reply.claimed = claimed;
}

uint32_t ChainIndex::Unclaim(uint64_t client, std::span<const Key> keys) {
  uint32_t released = 0;
  for (const Key& k : keys) {
    auto it = claims_.find(k);
    if (it != claims_.end() && it->second.client == client) {
      claims_.erase(it);
      ++released;
    }
  }
  return released;
}

uint32_t ChainIndex::Commit(uint64_t owner, uint64_t tensor, std::span<const Key> keys,
                            const std::function<void(const Key&, uint32_t)>& on_new) {
  uint32_t stored = 0;
  auto& mine = keys_of_[{owner, tensor}];
  for (uint32_t i = 0; i < keys.size(); ++i) {
    claims_.erase(keys[i]);  // computed: nobody waits on a claim of it any more
    if (index_.emplace(keys[i], IndexEntry{owner, tensor, i}).second) {
      mine.push_back(keys[i]);
      ++stored;
      if (on_new) on_new(keys[i], i);
    }
  }
  if (mine.empty()) keys_of_.erase({owner, tensor});
  return stored;
}

bool ChainIndex::Restore(const Key& key, const IndexEntry& e) {
  if (!index_.emplace(key, e).second) return false;
  keys_of_[{e.owner, e.tensor}].push_back(key);
  return true;
}

uint64_t ChainIndex::Forget(uint64_t owner, uint64_t tensor) {
  auto it = keys_of_.find({owner, tensor});
  if (it == keys_of_.end()) return 0;
  uint64_t n = 0;
  for (const Key& k : it->second) {
    auto e = index_.find(k);
    if (e != index_.end() && e->second.owner == owner && e->second.tensor == tensor) {
      index_.erase(e);
      ++n;
    }
  }
  keys_of_.erase(it);
  return n;
}

uint64_t ChainIndex::live_claims(Clock::time_point now) const {
  return static_cast<uint64_t>(std::count_if(claims_.begin(), claims_.end(), [now](const auto& kv) { return kv.second.until > now; }));
}

}  // namespace trellis::store

// Tiers: the tensors one store server holds, where each is (memory arena, SSD tier, or
// both), and which leaves memory next (docs/store.md, "Memory and eviction").
//
// One GDSF priority orders every tensor: clock + reads x cost / bytes, the clock raised
// to each evicted priority. When a new tensor does not fit the arena, the lowest goes:
// replicas first (they can be copied again), then owned tensors, which move to the SSD
// tier rather than away unless the tier is full of higher priorities. A leased (pinned)
// tensor never moves. A replica is a copy of another node's tensor, held within its own
// share of the arena and never at an owned tensor's expense.
//
// Thread safety: none; the store server's loop thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "store/arena.h"
#include "store/ssd.h"
#include "util/status.h"

namespace trellis::store {

struct Tensor {
  uint64_t offset = 0, bytes = 0;
  uint32_t n_blocks = 0;
  uint64_t block_bytes = 0;
  uint32_t slices = 1;              // checksummed parts of each block
  std::vector<uint64_t> checksums;  // n_blocks x slices, block-major
  double cost_s = 0;                // recompute time the tensor saves
  uint64_t reads = 1;
  double priority = 0;
  uint32_t leases = 0;
  bool ready = false;    // bytes landed and checked
  bool in_mem = false;   // at `offset` in the arena
  bool on_ssd = false;   // in the SSD tier (a tensor read back keeps its file)
  bool replica = false;  // a copy of (origin_owner, origin_tensor), held for local readers
  uint64_t origin_owner = 0, origin_tensor = 0;
};

// Events counted by the tiers (the server's stats copy them).
struct TierCounters {
  uint64_t evictions = 0, evicted_bytes = 0, replicas_dropped = 0;
  uint64_t ssd_flushes = 0, ssd_reads = 0, ssd_evictions = 0, ssd_checksum_failures = 0;
};

class Tiers {
 public:
  // ssd: nullptr for none. on_drop(id) runs when a tensor is gone from every tier (its
  // index entries go with it).
  Tiers(Arena& arena, SsdTier* ssd, std::function<void(uint64_t id)> on_drop);

  Tensor* Find(uint64_t id);
  const std::unordered_map<uint64_t, Tensor>& all() const { return tensors_; }
  // A new tensor of `bytes` in memory, pinned (its bytes are to land): evicts in GDSF
  // order to make room. nullptr if it cannot fit (larger than memory, or the rest leased).
  Tensor* AddInMemory(uint64_t id, uint64_t bytes);
  // A new replica of (owner, tensor): within `budget` bytes of replicas, evicting only
  // other replicas. nullptr if it cannot fit.
  Tensor* AddReplica(uint64_t id, uint64_t bytes, uint64_t budget, uint64_t owner, uint64_t tensor);
  // Restores what the SSD tier held before a restart (SSD only, until read).
  void RestoreFromSsd();
  // The local replica of (owner, tensor), or 0.
  uint64_t ReplicaOf(uint64_t owner, uint64_t tensor) const;

  // The tensor's bytes have landed and been checked: it is ready, and evictable at its
  // GDSF priority once unleased.
  void MarkReady(uint64_t id, Tensor& tn);
  // A reader leases the tensor (pinned while any lease holds) / ends a lease.
  void Lease(uint64_t id, Tensor& tn);
  void EndLease(uint64_t id, Tensor& tn);
  // Brings an SSD-only tensor back into memory (its file checked again); on failure the
  // tensor is dropped if its file is gone or bad.
  Status LoadFromSsd(uint64_t id, Tensor& tn);
  void Drop(uint64_t id);
  // Writes what is only in memory to the SSD tier, highest priority first (a clean stop).
  void FlushAllToSsd();

  uint8_t* At(const Tensor& tn) const { return arena_.data() + tn.offset; }
  uint64_t replica_bytes() const { return replica_bytes_; }
  const TierCounters& counters() const { return c_; }

 private:
  std::optional<uint64_t> Allocate(uint64_t bytes);
  bool EvictOne();
  bool MakeSsdRoom(uint64_t bytes, double below);
  double Gdsf(const Tensor& tn) const;
  SsdTensor SsdMeta(uint64_t id, const Tensor& tn) const;
  // Evictable: ready, in memory and not leased; replicas and owned tensors in their own
  // sets, since replicas are evicted first.
  void Pin(uint64_t id, Tensor& tn);
  void Unpin(uint64_t id, Tensor& tn);
  void SetPriority(uint64_t id, Tensor& tn, double p);

  Arena& arena_;
  SsdTier* ssd_;
  std::function<void(uint64_t)> on_drop_;
  std::unordered_map<uint64_t, Tensor> tensors_;
  std::set<std::pair<double, uint64_t>> by_priority_;         // (priority, tensor) in memory, evictable
  std::set<std::pair<double, uint64_t>> ssd_only_;            // (priority, tensor) on SSD, not in memory
  std::set<std::pair<double, uint64_t>> replicas_evictable_;  // (priority, tensor): replicas go first
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> replica_of_;  // (owner, tensor) -> local replica id
  uint64_t replica_bytes_ = 0;
  double clock_ = 0;
  TierCounters c_;
};

}  // namespace trellis::store

// PrefixStore: how the engine reaches a shared store of KV prefixes (the prefix tensor
// store of docs/store.md, or anything else that can look up, read and write whole KV
// blocks named by their token prefix).
//
// The engine thread never waits on it: it starts fetches and publishes, and collects
// their completions with Poll at each scheduling step. A fetch writes blocks straight
// into pool blocks the session owns and nothing else touches until the fetch completes;
// a publish reads full blocks the engine has pinned (refcount) until it completes.
//
// A grid head (docs/grid.md) holds only some layers of each block; the nodes hold the
// rest under the same block ids. Its fetches and publishes name the whole block (the
// store's unit), the byte range its own pool holds, and the block ids, so an
// implementation that handles_layer_split() has each node read or give its own range.
//
// Thread safety: Start*, Poll and Drain are called by the engine thread; the
// implementation does its I/O on threads of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace trellis {

// What must match for stored K/V to be usable (docs/store.md, "Data model").
struct StoreNamespace {
  uint64_t model_fingerprint = 0;
  uint32_t block_tokens = 32;
  uint32_t kv_dtype = 0;        // KvLayout::TypeCode(): K type | V type << 8 (0: both f16)
  uint32_t layout_version = 1;  // docs/kv_layout.md
  uint64_t salt = 0;
};

// Why a fetch brought fewer blocks than the prompt could use.
enum class StoreMiss : uint8_t {
  kNone = 0,
  kNotStored,       // the store has no longer prefix
  kEvicted,         // found by the lookup, gone by the read
  kFingerprint,     // stored under another namespace or block size
  kChecksum,        // a block failed its checksum after the transfer
  kDeadline,        // the store answered too late
  kDown,            // no store server reachable
  kSlower,          // fetching was estimated slower than computing
  kPendingTimeout,  // another node was computing it, and not done within the wait bound
  kError,           // the store refused or failed otherwise (malformed, full, I/O): a bug or a fault
};
inline constexpr int kStoreMissKinds = 10;
const char* StoreMissName(StoreMiss m);  // "not_stored", "evicted", ...

// The bytes of each block this process holds: [offset, offset + bytes) of the whole
// block (all of it in a whole-model engine; a grid head's own layers).
struct LocalSlice {
  uint64_t offset = 0, bytes = 0;
};

struct StoreFetch {
  uint64_t id = 0;  // the caller's, echoed in the completion
  StoreNamespace ns;
  std::vector<int32_t> tokens;  // the sequence; its whole blocks are looked up
  int32_t first_block = 0;      // blocks [0, first_block) are held already: read from here
  std::vector<uint8_t*> dst;    // where blocks first_block, first_block + 1, ... go (local bytes)
  std::vector<int32_t> dst_blocks;  // their pool block ids
  uint64_t block_bytes = 0;     // a whole block (every layer): the store's unit
  uint32_t slices = 1;          // the block's layers (checksummed one by one)
  LocalSlice local;             // what dst holds of each block
  uint64_t epoch = 0;           // the executor's epoch when started (a grid's K/V lost since voids it)
  // The engine's current cost of computing one block, seconds (0: not measured yet):
  // a fetch estimated slower than that is not made.
  double compute_seconds_per_block = 0;
};

struct StoreFetchDone {
  uint64_t id = 0;
  int32_t blocks = 0;  // read into dst[0 .. blocks)
  // Where they came from: the local store server's memory, its replicas, its SSD, or
  // other nodes.
  int32_t from_memory = 0, from_replica = 0, from_ssd = 0, from_remote = 0;
  int32_t waited = 0;  // of `blocks`, those another node was computing when asked (single-flight)
  StoreMiss miss = StoreMiss::kNone;  // why not all of dst (kNone: all of it)
  double seconds = 0;                 // lookup + read
};

struct StorePublish {
  uint64_t id = 0;
  StoreNamespace ns;
  std::vector<int32_t> tokens;             // whole blocks
  std::vector<const uint8_t*> blocks;      // block i of tokens (local bytes), pinned until done
  std::vector<int32_t> block_ids;          // their pool block ids
  uint64_t block_bytes = 0;                // a whole block (every layer)
  uint32_t slices = 1;                     // the block's layers
  LocalSlice local;                        // what blocks[i] holds of each block
  uint64_t epoch = 0;                      // as StoreFetch::epoch
  double cost_seconds = 0;                 // compute time the blocks save (eviction cost)
};

struct StorePublishDone {
  uint64_t id = 0;
  Status status;
  int32_t stored = 0;  // blocks newly stored (the rest were there already)
};

class PrefixStore {
 public:
  virtual ~PrefixStore() = default;
  virtual void StartFetch(StoreFetch f) = 0;
  virtual void StartPublish(StorePublish p) = 0;
  // A request that ends (cancelled, failed) before publishing the blocks its fetch found
  // missing: the fetch may have claimed them for this engine (single-flight), and nobody
  // will put them now, so the claims are dropped and others compute them at once instead
  // of waiting for the claims to expire. Best effort, never completed through Poll;
  // Drain waits for it.
  virtual void GiveUp(const StoreNamespace& ns, std::vector<int32_t> tokens) {}
  // Appends the completions ready now; if there are none, waits up to `wait` for one.
  virtual void Poll(std::vector<StoreFetchDone>* fetched, std::vector<StorePublishDone>* published,
                    std::chrono::microseconds wait) = 0;
  // Waits until everything started has completed (each within its deadline); the
  // completions are then ready for Poll. Nothing writes to a fetch's dst or reads a
  // publish's blocks after it returns.
  virtual void Drain() = 0;
  // Completes every operation not started yet at once (fetches with nothing read,
  // publishes as cancelled): shutting down waits only for what is in flight.
  virtual void AbandonQueued() = 0;
  // How many started operations have not been returned by Poll yet.
  virtual size_t in_flight() const = 0;
  // Whether it reads and writes blocks whose layers are spread over processes (a grid):
  // each process its own range. A store that cannot is refused for a grid head.
  virtual bool handles_layer_split() const { return false; }
};

}  // namespace trellis

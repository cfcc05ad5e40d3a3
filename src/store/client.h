// StoreClient: an engine's (or a script's) handle on the prefix tensor store.
//
// It connects to every store server named, or registered in etcd (placement is a
// consistent-hash ring over the live members, docs/store.md "Placement"), and offers:
//   Lookup: the longest stored prefix of a token sequence, in whole blocks, with one
//           round trip to the one server indexing the sequence's first block;
//   Get:    that prefix's first n blocks into caller-given block buffers: one Acquire
//           at the local server (what it owns, its replicas), then one per owner of
//           what is left (leases, addresses, per-block checksums), then all segments
//           read by bulk reads at once, checksums verified, leases released;
//   Put:    a sequence's blocks beyond what is stored (the increment past the longest
//           common prefix), as one new tensor on one owner, then indexed.
// Every call takes a deadline; a server that is down, slow or answers nonsense makes the
// call fail (a miss for the caller), never hang. Calls are synchronous and thread-safe:
// they run on the client's transport thread and wait for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "net/transport.h"
#include "store/keys.h"
#include "store/protocol.h"
#include "util/status.h"

namespace trellis::store {

struct ClientOptions {
  std::vector<std::string> servers;  // "host:port", every member of the store
  // This node's own server (one of `servers`), or "". Reads ask it first: it serves what
  // it owns and its replicas of other nodes' hot tensors, and learns from the misses
  // which tensors to replicate.
  std::string local;
  // etcd ("http://HOST:PORT"), or "": the members registered there join `servers`, and
  // the membership follows etcd (polled every etcd_poll_ms; placement is rebuilt over
  // the live members, so a member joining or leaving moves only its share of keys).
  std::string etcd;
  uint32_t etcd_poll_ms = 1000;
  // Without etcd: ask the first server that answers for the members it knows (itself
  // and its --peers), so an engine needs only its local server's address.
  bool discover = true;
  // Whether Connect fails when no server (or etcd) answers. False (what engines use: a
  // cache must never keep a server from starting): Connect succeeds, calls are
  // Unavailable misses, and the servers are joined (and discovered) when they come up.
  bool require_reachable = true;
  net::TransportOptions transport;
  uint32_t lease_ms = 5000;
};

// The bytes of each block a reader wants: [offset, offset + bytes) (bytes 0: all of it).
// A grid node reads its layers' range; the store checks it against the slices' checksums.
struct ByteRange {
  uint64_t offset = 0, bytes = 0;
};

struct LookupResult {
  size_t blocks = 0;      // the longest stored prefix, in whole blocks
  std::vector<Run> runs;  // where those blocks are, in order
  std::vector<Key> keys;  // the sequence's chain keys (all whole blocks)
  // With a claim (Lookup's claim_ms): after `blocks`, `pending` blocks another client is
  // computing (its claims end within pending_ms), then `claimed` blocks this client now
  // holds: others asking for them wait for its Put instead of computing them.
  uint32_t pending = 0, pending_ms = 0, claimed = 0;
};

// Where the blocks of one Get came from.
struct GetReceipt {
  uint64_t memory = 0;   // the local server's memory (tensors it owns)
  uint64_t replica = 0;  // the local server's replicas of other nodes' tensors
  uint64_t ssd = 0;      // the local server's SSD tier (read back into memory)
  uint64_t remote = 0;   // other nodes
};

struct ClientStats {
  uint64_t lookups = 0, gets = 0, get_blocks = 0, get_bytes = 0, puts = 0, put_blocks = 0, put_skipped_blocks = 0;
  uint64_t blocks_local_memory = 0, blocks_local_replica = 0, blocks_local_ssd = 0, blocks_remote = 0;
  uint64_t checksum_failures = 0, misses_not_stored = 0, misses_evicted = 0, misses_down = 0, misses_deadline = 0;
  uint64_t misses_mismatch = 0;  // stored with another block size or slicing
  uint64_t misses_error = 0;     // refused as malformed, or another error: a bug or a hostile peer
};

// One server's Stats (its tiers and hits), or why there are none.
struct MemberStats {
  std::string address;
  Status status;
  StatsReply stats;
};

class StoreClient {
 public:
  static Result<std::unique_ptr<StoreClient>> Connect(const ClientOptions& options, net::Deadline deadline);
  ~StoreClient();

  // claim_ms > 0: also claim the blocks past the stored prefix that nobody else is
  // computing, for claim_ms (single-flight; a Put of them ends the claim).
  Result<LookupResult> Lookup(const Namespace& ns, std::span<const int32_t> tokens, net::Deadline deadline,
                              uint32_t claim_ms = 0);

  // Reads the first `n_blocks` blocks of a lookup's prefix, block i into dst[i]
  // (block_bytes each). On error nothing in dst is to be trusted, and nothing lands in it
  // after the call returns.
  Status Get(const LookupResult& found, size_t n_blocks, std::span<void* const> dst, uint64_t block_bytes,
             net::Deadline deadline, GetReceipt* receipt = nullptr) {
    return GetRange(found, 0, n_blocks, dst, block_bytes, deadline, receipt);
  }
  // Blocks [first, first + n_blocks) of the prefix, block first + i into dst[i]: an
  // engine that holds the first blocks itself reads only the rest. With a range, only
  // those bytes of each block are read (dst[i] holds range.bytes); the tensor's slices
  // must tile the range, or the read fails (InvalidArgument) with nothing read.
  Status GetRange(const LookupResult& found, size_t first, size_t n_blocks, std::span<void* const> dst,
                  uint64_t block_bytes, net::Deadline deadline, GetReceipt* receipt = nullptr, ByteRange range = {});

  // Drops this client's claims of `tokens`' whole blocks (it will not put them); returns
  // how many it held. Others asking for them then compute at once instead of waiting.
  Result<size_t> Unclaim(const Namespace& ns, std::span<const int32_t> tokens, net::Deadline deadline);

  // Stores `tokens`' whole blocks (blocks[i] holds block i, block_bytes each) past the
  // longest prefix already stored. cost_s: the compute time the increment saves (GDSF).
  // slices: each block is checksummed in that many equal parts (a KV block's layers), so
  // readers of some layers can check them. Returns how many blocks were newly stored (0
  // if all were already there). blocks[i] may be null for a block the caller saw
  // stored; if it is not stored any more, the put fails (Unavailable).
  Result<size_t> Put(const Namespace& ns, std::span<const int32_t> tokens, std::span<const void* const> blocks,
                     uint64_t block_bytes, double cost_s, net::Deadline deadline, uint32_t slices = 1);

  ClientStats stats() const;
  // The live members' addresses, as this client sees them now.
  std::vector<std::string> Members() const;
  // How many of them answered when last tried (connected and greeted, not down).
  size_t ReachableMembers() const;
  // Every live member's Stats, asked in turn (one that is down fails at once).
  std::vector<MemberStats> StatsOfMembers(net::Deadline deadline);
  // Tests only: runs on every segment a read lands, on the transport's thread, before the
  // read completes (net::Transport::SetLandedHookForTesting).
  void SetLandedHookForTesting(std::function<void(void* local, uint64_t length)> hook);
  // The member that indexes a sequence starting with this first-block key.
  std::string IndexServer(const Key& first_block) const;

  struct Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::store

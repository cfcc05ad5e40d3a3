// The store's messages (docs/store.md, "Protocol"). Each is a net::Transport request of
// the type below whose body is WireWriter-encoded as listed; every reply may instead be an
// error (Transport::ReplyError). Lists are u32-counted and bounded by the limits below.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "net/transport.h"
#include "net/wire.h"
#include "store/keys.h"

namespace trellis::store {

enum MsgType : uint16_t {
  // -> node u64, region base u64, region length u64, rkey str, version u32
  kHello = 1,
  // n u32, keys[n] (16 B each; the prompt's chain keys, in order)
  // -> matched u32, runs u32, [owner u64, tensor u64, first u32, count u32]
  //    (the longest stored prefix: `matched` blocks, as runs of blocks inside tensors)
  kLookup = 2,
  // n u32, keys[n] (the increment's chain keys), first u32 (index of keys[0] in the
  // chain), block_bytes u64, slices u32, cost_s f64, region base u64, region length u64,
  // rkey str, segments u32, [addr u64, len u64] (the increment's bytes in the client's
  // memory), checksums u32 (= n x slices), [u64] (the writer's, block-major). Each block
  // is checksummed in `slices` equal parts (a KV block's layers), so a reader of some
  // layers only (a grid node) can check what it read.
  // -> tensor u64. The owner pulls the bytes by a bulk read into one contiguous run and checks
  // them against the writer's checksums before anything is indexed: a mismatch (bytes
  // changed on the way) is refused with Corrupt and the tensor dropped.
  kPutData = 3,
  // owner u64, tensor u64, n u32, keys[n] -> stored u32 (keys newly indexed)
  kPutCommit = 4,
  // lease_ms u32, n u32, [tensor u64, first u32, count u32]
  // -> lease u64, n u32, [found u8, tier u8, addr u64, count u32, block_bytes u64,
  //    slices u32, checksums count x slices u64 (block-major)]
  kAcquire = 5,
  // lease u64 -> (empty)
  kRelease = 6,
  // n u32, [owner u64, tensor u64] -> forgotten u32 (index entries dropped)
  kForget = 7,
  // -> StatsReply: the server's tiers and hits (an engine's cache view)
  kStats = 8,
  // -> n u32, [address str] (this server's advertised address, then its peers': the
  //    membership as it knows it)
  kMembers = 9,
  // ttl_ms u32, client u64, n u32, keys[n]
  // -> as kLookup, then pending u32, pending_ms u32, claimed u32: after the `matched`
  //    stored keys, `pending` keys another client claimed (it is computing them; the
  //    latest of those claims expires in pending_ms), then `claimed` keys this client
  //    now holds for ttl_ms (single-flight: others wait for it instead of computing).
  kLookupClaim = 10,
  // client u64, n u32, keys[n] -> released u32: drops this client's claims of those keys
  // (it will not put them: its publish failed), so others compute them at once instead
  // of waiting for the claims to expire.
  kUnclaim = 11,
};

// 2: checksums per slice of a block; 3: the writer's checksums in PutData.
inline constexpr uint32_t kProtocolVersion = 4;
inline constexpr uint32_t kMaxKeys = 1 << 16;       // blocks in one message (2M tokens at 32)
inline constexpr uint32_t kMaxSegments = 1 << 16;
inline constexpr uint32_t kMaxLeaseMs = 60000;
inline constexpr uint32_t kMaxRkeyBytes = 1 << 16;
inline constexpr uint32_t kMaxClaimMs = 600000;    // a claim lives 10 minutes at most
inline constexpr size_t kMaxClaims = 1 << 20;      // claimed keys a server tracks
inline constexpr uint32_t kMaxSlices = 4096;       // checksummed parts of one block
inline constexpr uint64_t kMaxChecksums = 1 << 23;  // blocks x slices of one tensor

// The checksums of a block's `slices` equal parts (block_bytes % slices == 0), into
// out[0 .. slices).
void SliceChecksums(const uint8_t* block, uint64_t block_bytes, uint32_t slices, uint64_t* out);
// Whether `slices` cuts blocks of block_bytes into equal parts.
inline bool ValidSlices(uint64_t block_bytes, uint32_t slices) {
  return slices >= 1 && slices <= kMaxSlices && block_bytes % slices == 0;
}

// ---- Typed messages. Encode* writes a body; Decode* reads one, checking every count
// against the limits above before anything is allocated, and returns false for a body
// that is malformed (short, long, or out of bounds). Requests are decoded by the server,
// replies by the client (and by a server copying a replica from its peer).

struct HelloReply {
  uint64_t node = 0;
  net::RemoteRegion region;
  uint32_t version = 0;
};
std::string EncodeHelloReply(const HelloReply& h);
bool DecodeHelloReply(std::string_view body, HelloReply& h);

// kLookup, or kLookupClaim when claim.
struct LookupRequest {
  bool claim = false;
  uint32_t ttl_ms = 0;   // claim only
  uint64_t client = 0;   // claim only
  std::vector<Key> keys;
};
struct LookupReply {
  uint32_t matched = 0;
  std::vector<Run> runs;  // sum of counts = matched
  uint32_t pending = 0, pending_ms = 0, claimed = 0;  // claim only
};
std::string EncodeLookupRequest(const LookupRequest& m);
bool DecodeLookupRequest(std::string_view body, bool claim, LookupRequest& m);
std::string EncodeLookupReply(const LookupReply& m, bool claim);
// keys: the keys asked for (the reply must fit them).
bool DecodeLookupReply(std::string_view body, bool claim, size_t keys, LookupReply& m);

struct Segment {
  uint64_t addr = 0, len = 0;
};
struct PutDataRequest {
  std::vector<Key> keys;
  uint32_t first = 0;
  uint64_t block_bytes = 0;
  uint32_t slices = 1;
  double cost_s = 0;
  net::RemoteRegion src;
  std::vector<Segment> segments;
  std::vector<uint64_t> checksums;  // keys x slices, block-major
};
std::string EncodePutDataRequest(const PutDataRequest& m);
// Also checks the put is self-consistent: keys, slices and checksums agree, segments are
// non-empty and add up to keys x block_bytes, which is at most max_bytes.
bool DecodePutDataRequest(std::string_view body, uint64_t max_bytes, PutDataRequest& m);

struct PutCommitRequest {
  uint64_t owner = 0, tensor = 0;
  std::vector<Key> keys;
};
std::string EncodePutCommitRequest(const PutCommitRequest& m);
bool DecodePutCommitRequest(std::string_view body, PutCommitRequest& m);

struct AcquireRequest {
  uint32_t lease_ms = 0;
  std::vector<Run> runs;  // count 0: to the tensor's end
};
struct AcquiredRun {
  bool found = false;
  uint8_t tier = 0;  // 0 memory, 1 replica, 2 read back from SSD
  uint64_t addr = 0;
  uint32_t count = 0;
  uint64_t block_bytes = 0;
  uint32_t slices = 0;
  std::vector<uint64_t> checksums;  // count x slices, block-major
};
struct AcquireReply {
  uint64_t lease = 0;
  std::vector<AcquiredRun> runs;  // one per run asked for
};
std::string EncodeAcquireRequest(const AcquireRequest& m);
bool DecodeAcquireRequest(std::string_view body, AcquireRequest& m);
std::string EncodeAcquireReply(const AcquireReply& m);
// runs: how many were asked for. A found run's slices must cut its blocks evenly.
bool DecodeAcquireReply(std::string_view body, size_t runs, AcquireReply& m);

std::string EncodeRelease(uint64_t lease);
bool DecodeRelease(std::string_view body, uint64_t& lease);

std::string EncodeForgetRequest(const std::vector<std::pair<uint64_t, uint64_t>>& gone);  // (owner, tensor)
bool DecodeForgetRequest(std::string_view body, std::vector<std::pair<uint64_t, uint64_t>>& gone);

struct UnclaimRequest {
  uint64_t client = 0;
  std::vector<Key> keys;
};
std::string EncodeUnclaimRequest(const UnclaimRequest& m);
bool DecodeUnclaimRequest(std::string_view body, UnclaimRequest& m);

// Replies that are one count (PutCommit's stored, Forget's forgotten, Unclaim's released)
// or one id (PutData's tensor).
std::string EncodeU32(uint32_t v);
bool DecodeU32(std::string_view body, uint32_t& v);
std::string EncodeU64(uint64_t v);
bool DecodeU64(std::string_view body, uint64_t& v);

// Stats' reply: what a person looking at the store wants of each server (a subset of
// ServerStats, in this order on the wire, u64 each).
struct StatsReply {
  uint64_t memory_used = 0, memory_capacity = 0, tensors = 0;
  uint64_t replicas = 0, replica_bytes = 0, replica_hits = 0;
  uint64_t ssd_used = 0, ssd_capacity = 0, ssd_tensors = 0, ssd_reads = 0;
  uint64_t lookups = 0, lookup_blocks_matched = 0, acquire_hits = 0, acquire_misses = 0;
  uint64_t puts = 0, evictions = 0, peers = 0;
};
std::string EncodeStatsReply(const StatsReply& m);
bool DecodeStatsReply(std::string_view body, StatsReply& m);

inline constexpr uint32_t kMaxMembersReply = 1024;
inline constexpr uint32_t kMaxAddressBytes = 256;
std::string EncodeMembersReply(const std::vector<std::string>& addresses);
bool DecodeMembersReply(std::string_view body, std::vector<std::string>& addresses);

}  // namespace trellis::store

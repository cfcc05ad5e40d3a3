// The store's messages (docs/store.md, "Protocol"). Each is a net::Transport request of
// the type below whose body is WireWriter-encoded as listed; every reply may instead be an
// error (Transport::ReplyError). Lists are u32-counted and bounded by the limits below.
#pragma once

#include <cstdint>
#include <string_view>

#include "net/transport.h"
#include "net/wire.h"

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
  // -> Prometheus text
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
inline constexpr uint32_t kProtocolVersion = 3;
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

// A Hello reply: the server's node id and registered region. False if malformed.
struct HelloReply {
  uint64_t node = 0;
  net::RemoteRegion region;
  uint32_t version = 0;
};
inline bool DecodeHello(std::string_view body, HelloReply& h) {
  net::WireReader rd(body);
  h.node = rd.U64();
  h.region.base = rd.U64();
  h.region.length = rd.U64();
  h.region.rkey = std::string(rd.Str(kMaxRkeyBytes));
  h.version = rd.U32();
  return rd.Done();
}

}  // namespace trellis::store

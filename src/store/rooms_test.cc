// The store server's rooms, each alone: the arena, the chain index and its claims, the
// tiers (GDSF eviction, replicas, the SSD tier) and the typed protocol, including every
// decoder fed truncated and hostile bodies. No transport, no UCX, no child process.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "store/arena.h"
#include "store/chain_index.h"
#include "store/protocol.h"
#include "store/ssd.h"
#include "store/tiers.h"
#include "util/checksum.h"
#include "util/mem_env.h"

namespace trellis::store {
namespace {

Key K(uint64_t i) { return Key{i * 0x9E3779B97F4A7C15ull + 1, i}; }

TEST(ArenaTest, TakesFirstFitAndMergesFreedNeighbours) {
  auto a = Arena::Map(1 << 20);
  ASSERT_TRUE(a.ok());
  Arena& m = **a;
  EXPECT_FALSE(Arena::Map(100).ok());
  EXPECT_FALSE(m.Take(0));
  EXPECT_FALSE(m.Take((1 << 20) + 1));
  auto x = m.Take(4096), y = m.Take(8192), z = m.Take(4096);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 4096u);
  EXPECT_EQ(*z, 12288u);
  m.Free(*y, 8192);
  EXPECT_EQ(m.holes(), 2u);
  EXPECT_EQ(*m.Take(4096), 4096u);  // first fit: the hole y left
  m.Free(4096, 4096);
  m.Free(*x, 4096);  // merges with the hole after it
  m.Free(*z, 4096);  // and with both sides: one hole again
  EXPECT_EQ(m.holes(), 1u);
  EXPECT_EQ(m.free_bytes(), uint64_t{1} << 20);
  EXPECT_EQ(*m.Take(1 << 20), 0u);
  EXPECT_FALSE(m.Take(1));
}

TEST(ChainIndexTest, LookupWalksTheLongestPrefixAsRuns) {
  ChainIndex ix;
  const std::vector<Key> keys = {K(1), K(2), K(3), K(4), K(5)};
  std::vector<Key> logged;
  EXPECT_EQ(ix.Commit(7, 100, std::span(keys).first(3), [&](const Key& k, uint32_t) { logged.push_back(k); }), 3u);
  EXPECT_EQ(logged.size(), 3u);
  // A second tensor holding blocks 3..4 of the chain (index 0, 1 inside it).
  EXPECT_EQ(ix.Commit(8, 200, std::span(keys).subspan(3), nullptr), 2u);
  std::vector<Key> rest;
  LookupReply r = ix.Lookup(keys, &rest);
  EXPECT_EQ(r.matched, 5u);
  ASSERT_EQ(r.runs.size(), 2u);
  EXPECT_EQ(r.runs[0].owner, 7u);
  EXPECT_EQ(r.runs[0].count, 3u);
  EXPECT_EQ(r.runs[1].tensor, 200u);
  EXPECT_EQ(r.runs[1].first, 0u);
  EXPECT_TRUE(rest.empty());
  // The first writer wins: the same keys from another tensor index nothing.
  EXPECT_EQ(ix.Commit(9, 300, keys, nullptr), 0u);
  // Forget drops (owner, tensor)'s entries only; the walk stops where they were.
  EXPECT_EQ(ix.Forget(8, 200), 2u);
  EXPECT_EQ(ix.Forget(9, 300), 0u);
  r = ix.Lookup(keys, &rest);
  EXPECT_EQ(r.matched, 3u);
  EXPECT_EQ(rest.size(), 2u);
  EXPECT_EQ(ix.size(), 3u);
  EXPECT_FALSE(ix.Restore(K(1), IndexEntry{1, 1, 0}));  // indexed already
  EXPECT_TRUE(ix.Restore(K(4), IndexEntry{8, 201, 0}));
  EXPECT_EQ(ix.Lookup(keys, nullptr).matched, 4u);
}

TEST(ChainIndexTest, ClaimsMakeOthersWaitUntilCommittedUnclaimedOrExpired) {
  ChainIndex ix;
  const std::vector<Key> keys = {K(1), K(2), K(3)};
  const auto t0 = ChainIndex::Clock::now();
  LookupReply a, b, c;
  ix.Claim(keys, /*client=*/1, 1000, t0, a);
  EXPECT_EQ(a.claimed, 3u);
  EXPECT_EQ(a.pending, 0u);
  ix.Claim(keys, 2, 1000, t0 + std::chrono::milliseconds(400), b);
  EXPECT_EQ(b.pending, 3u);
  EXPECT_EQ(b.claimed, 0u);
  EXPECT_EQ(b.pending_ms, 600u);
  EXPECT_EQ(ix.live_claims(t0), 3u);
  // Another client's unclaim releases nothing; the claimer's does.
  EXPECT_EQ(ix.Unclaim(2, std::span(keys).first(1)), 0u);
  EXPECT_EQ(ix.Unclaim(1, std::span(keys).first(1)), 1u);
  ix.Claim(keys, 2, 1000, t0, c);
  EXPECT_EQ(c.pending, 0u);   // key 1 is free: client 2 takes it, then meets client 1's key 2
  EXPECT_EQ(c.claimed, 1u);
  // A commit ends the claims of its keys; an expired claim is no claim.
  ix.Commit(5, 50, std::span(keys).first(2), nullptr);
  LookupReply d;
  ix.Claim(std::span(keys).subspan(2), 3, 1000, t0 + std::chrono::milliseconds(1001), d);
  EXPECT_EQ(d.pending, 0u);
  EXPECT_EQ(d.claimed, 1u);
  LookupReply e;
  ix.Claim(std::span(keys).subspan(2), 4, 0, t0 + std::chrono::milliseconds(1002), e);
  EXPECT_EQ(e.pending, 1u);
  EXPECT_EQ(e.claimed, 0u);  // ttl 0 claims nothing
}

// Fills a tensor's blocks with a pattern and their checksums.
void Fill(Tiers& t, Tensor& tn, uint8_t v) {
  std::memset(t.At(tn), v, tn.bytes);
  tn.checksums.resize(tn.n_blocks);
  for (uint32_t b = 0; b < tn.n_blocks; ++b) tn.checksums[b] = Checksum64(t.At(tn) + b * tn.block_bytes, tn.block_bytes);
}

Tensor* AddOwned(Tiers& t, uint64_t id, uint64_t bytes, double cost, uint8_t v) {
  Tensor* tn = t.AddInMemory(id, bytes);
  if (!tn) return nullptr;
  tn->n_blocks = 1;
  tn->block_bytes = bytes;
  tn->cost_s = cost;
  Fill(t, *tn, v);
  t.MarkReady(id, *tn);
  return tn;
}

TEST(TiersTest, EvictsInGdsfOrderReplicasFirstAndNeverALeasedTensor) {
  auto a = Arena::Map(4 * 4096);
  ASSERT_TRUE(a.ok());
  std::vector<uint64_t> dropped;
  Tiers t(**a, nullptr, [&](uint64_t id) { dropped.push_back(id); });
  ASSERT_TRUE(AddOwned(t, 1, 4096, 1.0, 1));   // cheap to recompute
  ASSERT_TRUE(AddOwned(t, 2, 4096, 10.0, 2));  // dear
  Tensor* r = t.AddReplica(3, 4096, 8192, /*owner=*/99, /*tensor=*/5);
  ASSERT_TRUE(r);
  r->n_blocks = 1;
  r->block_bytes = 4096;
  Fill(t, *r, 3);
  t.MarkReady(3, *r);
  EXPECT_EQ(t.ReplicaOf(99, 5), 3u);
  EXPECT_EQ(t.replica_bytes(), 4096u);
  ASSERT_TRUE(AddOwned(t, 4, 4096, 5.0, 4));  // the arena is full now
  Tensor* dear = t.Find(2);
  t.Lease(2, *dear);
  // The replica goes first, then the cheapest owned tensor; the leased one never.
  ASSERT_TRUE(AddOwned(t, 5, 4096, 1.0, 5));
  EXPECT_EQ(dropped, std::vector<uint64_t>{3});
  EXPECT_EQ(t.ReplicaOf(99, 5), 0u);
  EXPECT_EQ(t.replica_bytes(), 0u);
  ASSERT_TRUE(AddOwned(t, 6, 4096, 1.0, 6));
  EXPECT_EQ(dropped, (std::vector<uint64_t>{3, 1}));
  ASSERT_TRUE(AddOwned(t, 7, 4096, 1.0, 7));
  EXPECT_EQ(dropped.size(), 3u);
  EXPECT_NE(dropped[2], 2u);
  EXPECT_TRUE(t.Find(2));
  // Everything else leased too: nothing fits, and nothing is dropped for trying.
  for (uint64_t id : {4u, 5u, 6u, 7u}) {
    if (Tensor* x = t.Find(id)) t.Lease(id, *x);
  }
  const size_t before = dropped.size();
  EXPECT_FALSE(t.AddInMemory(8, 4096));
  EXPECT_EQ(dropped.size(), before);
  EXPECT_EQ(t.counters().replicas_dropped, 1u);
  // A replica never pushes out an owned tensor: with no replica to evict, no room.
  t.EndLease(2, *dear);
  EXPECT_FALSE(t.AddReplica(9, 4096, 8192, 99, 6));
  EXPECT_TRUE(t.Find(2));
}

TEST(TiersTest, AnEvictedOwnedTensorMovesToSsdAndComesBackChecked) {
  const std::string dir = ::testing::TempDir() + "/tiers_ssd_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  auto ssd = SsdTier::Open(dir, 1 << 20);
  ASSERT_TRUE(ssd.ok()) << ssd.status().ToString();
  auto a = Arena::Map(2 * 4096);
  ASSERT_TRUE(a.ok());
  std::vector<uint64_t> dropped;
  Tiers t(**a, ssd->get(), [&](uint64_t id) { dropped.push_back(id); });
  ASSERT_TRUE(AddOwned(t, 1, 4096, 1.0, 0xA1));
  ASSERT_TRUE(AddOwned(t, 2, 4096, 9.0, 0xB2));
  ASSERT_TRUE(AddOwned(t, 3, 4096, 9.0, 0xC3));  // pushes tensor 1 to SSD, not away
  EXPECT_TRUE(dropped.empty());
  Tensor* one = t.Find(1);
  ASSERT_TRUE(one);
  EXPECT_FALSE(one->in_mem);
  EXPECT_TRUE(one->on_ssd);
  EXPECT_EQ(t.counters().ssd_flushes, 1u);
  ASSERT_TRUE(t.LoadFromSsd(1, *one).ok());  // evicts another to make room
  EXPECT_TRUE(one->in_mem);
  EXPECT_EQ(t.At(*one)[4095], 0xA1);
  EXPECT_EQ(t.counters().ssd_reads, 1u);
  std::filesystem::remove_all(dir);
}

// The SSD tier on an in-memory file system (util/mem_env.h): a clean stop writes what is
// only in memory, and a tier opened again on the same files serves every tensor, checked.
TEST(TiersTest, TheSsdTierOnAnInMemoryEnvServesAfterARestart) {
  MemEnv mem;
  {
    auto ssd = SsdTier::Open("ssd", 1 << 20, 4096, &mem);
    ASSERT_TRUE(ssd.ok()) << ssd.status().ToString();
    auto a = Arena::Map(2 * 4096);
    ASSERT_TRUE(a.ok());
    Tiers t(**a, ssd->get(), nullptr);
    ASSERT_TRUE(AddOwned(t, 1, 4096, 1.0, 0xA1));
    ASSERT_TRUE(AddOwned(t, 2, 4096, 9.0, 0xB2));
    ASSERT_TRUE(AddOwned(t, 3, 4096, 9.0, 0xC3));  // tensor 1 to SSD
    t.FlushAllToSsd();                              // 2 and 3 too: a clean stop
  }
  auto ssd = SsdTier::Open("ssd", 1 << 20, 4096, &mem);
  ASSERT_TRUE(ssd.ok()) << ssd.status().ToString();
  EXPECT_EQ((*ssd)->restored().size(), 3u);
  auto a = Arena::Map(2 * 4096);
  ASSERT_TRUE(a.ok());
  Tiers t(**a, ssd->get(), nullptr);
  t.RestoreFromSsd();
  for (uint64_t id : {1u, 2u, 3u}) {
    Tensor* tn = t.Find(id);
    ASSERT_TRUE(tn) << id;
    ASSERT_TRUE(t.LoadFromSsd(id, *tn).ok()) << id;
    EXPECT_EQ(t.At(*tn)[100], id == 1 ? 0xA1 : id == 2 ? 0xB2 : 0xC3) << id;
    t.Lease(id, *tn);  // read as a reader would, then evictable again (back to SSD only)
    t.EndLease(id, *tn);
  }
}

// ---- the protocol -----------------------------------------------------------------------

// Every proper prefix of a valid body fails to decode (and does not crash).
template <typename F>
void EveryTruncationFails(const std::string& body, F decode) {
  for (size_t n = 0; n < body.size(); ++n) EXPECT_FALSE(decode(body.substr(0, n))) << "prefix of " << n << " bytes";
  EXPECT_FALSE(decode(body + "x")) << "a trailing byte";
}

TEST(StoreProtocolTest, EveryMessageRoundTripsAndEveryTruncationFails) {
  LookupRequest lq{true, 500, 42, {K(1), K(2)}};
  LookupRequest lq2;
  ASSERT_TRUE(DecodeLookupRequest(EncodeLookupRequest(lq), true, lq2));
  EXPECT_EQ(lq2.ttl_ms, 500u);
  EXPECT_EQ(lq2.client, 42u);
  EXPECT_EQ(lq2.keys, lq.keys);
  EveryTruncationFails(EncodeLookupRequest(lq), [](std::string_view b) { LookupRequest m; return DecodeLookupRequest(b, true, m); });

  LookupReply lr;
  lr.matched = 3;
  lr.runs = {{1, 2, 0, 2}, {3, 4, 5, 1}};
  lr.pending = 1;
  lr.claimed = 1;
  lr.pending_ms = 77;
  LookupReply lr2;
  ASSERT_TRUE(DecodeLookupReply(EncodeLookupReply(lr, true), true, 5, lr2));
  EXPECT_EQ(lr2.runs.size(), 2u);
  EXPECT_EQ(lr2.pending_ms, 77u);
  EXPECT_FALSE(DecodeLookupReply(EncodeLookupReply(lr, true), true, 4, lr2));  // 3 + 1 + 1 > 4 keys asked
  lr.runs[1].count = 2;  // runs add up to 4, matched says 3
  EXPECT_FALSE(DecodeLookupReply(EncodeLookupReply(lr, true), true, 9, lr2));
  EveryTruncationFails(EncodeLookupReply(lr2, false), [](std::string_view b) { LookupReply m; return DecodeLookupReply(b, false, 9, m); });

  PutDataRequest p;
  p.keys = {K(1), K(2)};
  p.first = 4;
  p.block_bytes = 4096;
  p.slices = 2;
  p.cost_s = 0.5;
  p.src = net::RemoteRegion{0x1000, 8192, "rkey"};
  p.segments = {{0x1000, 4096}, {0x3000, 4096}};
  p.checksums = {1, 2, 3, 4};
  PutDataRequest p2;
  ASSERT_TRUE(DecodePutDataRequest(EncodePutDataRequest(p), 1 << 20, p2));
  EXPECT_EQ(p2.src.rkey, "rkey");
  EXPECT_EQ(p2.checksums, p.checksums);
  EXPECT_EQ(p2.segments[1].addr, 0x3000u);
  EveryTruncationFails(EncodePutDataRequest(p), [](std::string_view b) { PutDataRequest m; return DecodePutDataRequest(b, 1 << 20, m); });
  // Self-consistency: each broken in turn is refused.
  auto refused = [](PutDataRequest m, uint64_t max = 1 << 20) {
    PutDataRequest out;
    return !DecodePutDataRequest(EncodePutDataRequest(m), max, out);
  };
  {
    PutDataRequest m = p;
    m.keys.clear();
    m.checksums.clear();
    EXPECT_TRUE(refused(m));  // no blocks
  }
  {
    PutDataRequest m = p;
    m.checksums.pop_back();
    EXPECT_TRUE(refused(m));  // checksums != keys x slices
  }
  {
    PutDataRequest m = p;
    m.slices = 3;  // 4096 is not cut in 3
    m.checksums.resize(6);
    EXPECT_TRUE(refused(m));
  }
  {
    PutDataRequest m = p;
    m.segments[1].len = 4095;  // segments do not add up to the blocks
    EXPECT_TRUE(refused(m));
  }
  {
    PutDataRequest m = p;
    m.segments[1].len = 0;
    m.segments.push_back({0x9000, 4096});
    EXPECT_TRUE(refused(m));  // an empty segment
  }
  {
    PutDataRequest m = p;
    m.cost_s = -1;
    EXPECT_TRUE(refused(m));
  }
  EXPECT_TRUE(refused(p, 8191));  // larger than the server's memory

  AcquireRequest aq{1000, {{1, 2, 0, 4}, {3, 4, 1, 0}}};
  AcquireRequest aq2;
  ASSERT_TRUE(DecodeAcquireRequest(EncodeAcquireRequest(aq), aq2));
  EXPECT_EQ(aq2.runs[1].first, 1u);
  EveryTruncationFails(EncodeAcquireRequest(aq), [](std::string_view b) { AcquireRequest m; return DecodeAcquireRequest(b, m); });
  aq.lease_ms = 0;
  EXPECT_FALSE(DecodeAcquireRequest(EncodeAcquireRequest(aq), aq2));  // a lease of no time

  AcquireReply ar;
  ar.lease = 9;
  ar.runs.resize(2);
  ar.runs[0] = AcquiredRun{true, 2, 0x5000, 2, 4096, 2, {1, 2, 3, 4}};
  AcquireReply ar2;
  const std::string arb = EncodeAcquireReply(ar);
  ASSERT_TRUE(DecodeAcquireReply(arb, 2, ar2));
  EXPECT_EQ(ar2.lease, 9u);
  EXPECT_TRUE(ar2.runs[0].found);
  EXPECT_EQ(ar2.runs[0].tier, 2);
  EXPECT_EQ(ar2.runs[0].checksums, ar.runs[0].checksums);
  EXPECT_FALSE(ar2.runs[1].found);
  EXPECT_FALSE(DecodeAcquireReply(arb, 1, ar2));  // not one entry per run asked
  EveryTruncationFails(arb, [](std::string_view b) { AcquireReply m; return DecodeAcquireReply(b, 2, m); });
  ar.runs[0].slices = 3;  // slices that do not cut the block
  EXPECT_FALSE(DecodeAcquireReply(EncodeAcquireReply(ar), 2, ar2));

  PutCommitRequest pc{5, 6, {K(1)}};
  PutCommitRequest pc2;
  ASSERT_TRUE(DecodePutCommitRequest(EncodePutCommitRequest(pc), pc2));
  EXPECT_EQ(pc2.tensor, 6u);
  EveryTruncationFails(EncodePutCommitRequest(pc), [](std::string_view b) { PutCommitRequest m; return DecodePutCommitRequest(b, m); });
  UnclaimRequest uc{7, {K(3), K(4)}};
  UnclaimRequest uc2;
  ASSERT_TRUE(DecodeUnclaimRequest(EncodeUnclaimRequest(uc), uc2));
  EXPECT_EQ(uc2.keys, uc.keys);
  EveryTruncationFails(EncodeUnclaimRequest(uc), [](std::string_view b) { UnclaimRequest m; return DecodeUnclaimRequest(b, m); });
  std::vector<std::pair<uint64_t, uint64_t>> gone = {{1, 2}, {3, 4}}, gone2;
  ASSERT_TRUE(DecodeForgetRequest(EncodeForgetRequest(gone), gone2));
  EXPECT_EQ(gone2, gone);
  EveryTruncationFails(EncodeForgetRequest(gone), [](std::string_view b) { std::vector<std::pair<uint64_t, uint64_t>> m; return DecodeForgetRequest(b, m); });
  HelloReply h{11, {0x10, 20, "k"}, kProtocolVersion}, h2;
  ASSERT_TRUE(DecodeHelloReply(EncodeHelloReply(h), h2));
  EXPECT_EQ(h2.region.rkey, "k");
  EveryTruncationFails(EncodeHelloReply(h), [](std::string_view b) { HelloReply m; return DecodeHelloReply(b, m); });
  std::vector<std::string> members = {"a:1", "b:2"}, members2;
  ASSERT_TRUE(DecodeMembersReply(EncodeMembersReply(members), members2));
  EXPECT_EQ(members2, members);
  EveryTruncationFails(EncodeMembersReply(members), [](std::string_view b) { std::vector<std::string> m; return DecodeMembersReply(b, m); });
  StatsReply st, st2;
  st.memory_used = 1;
  st.ssd_reads = 10;
  st.peers = 17;
  ASSERT_TRUE(DecodeStatsReply(EncodeStatsReply(st), st2));
  EXPECT_EQ(st2.memory_used, 1u);
  EXPECT_EQ(st2.ssd_reads, 10u);
  EXPECT_EQ(st2.peers, 17u);
  EXPECT_EQ(st2.puts, 0u);
  EveryTruncationFails(EncodeStatsReply(st), [](std::string_view b) { StatsReply m; return DecodeStatsReply(b, m); });
  EXPECT_FALSE(DecodeStatsReply(EncodeStatsReply(st) + "x", st2));  // trailing bytes
}

// Counts are checked against what the body could hold before anything is allocated: a
// 16-byte body claiming 2^32-1 keys (or segments, or checksums) is refused at once.
TEST(StoreProtocolTest, HugeCountsAreRefusedBeforeAllocating) {
  net::WireWriter w;
  w.U32(0xFFFFFFFF);
  w.U64(0);
  w.U32(0);
  LookupRequest lq;
  EXPECT_FALSE(DecodeLookupRequest(w.Take(), false, lq));
  EXPECT_TRUE(lq.keys.empty());
  net::WireWriter a;
  a.U32(1000);
  a.U32(kMaxKeys);  // in range, but the body holds none of them
  AcquireRequest aq;
  EXPECT_FALSE(DecodeAcquireRequest(a.Take(), aq));
  EXPECT_TRUE(aq.runs.empty());
  net::WireWriter r;
  r.U64(1);
  r.U32(1);
  r.U8(1);
  r.U8(0);
  r.U64(0);
  r.U32(kMaxKeys);  // count x slices checksums promised, none sent
  r.U64(4096);
  r.U32(1);
  AcquireReply ar;
  EXPECT_FALSE(DecodeAcquireReply(r.Take(), 1, ar));
}

}  // namespace
}  // namespace trellis::store

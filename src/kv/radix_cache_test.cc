#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace trellis {
namespace {

using Tokens = std::vector<int32_t>;
constexpr uint64_t kNs = 0x1234;

std::unique_ptr<BlockPool> MakePool(int block_size, int32_t n_blocks) {
  auto pool = BlockPool::Create(KvLayout{1, 1, 32, block_size}, n_blocks);
  EXPECT_TRUE(pool.ok());
  return std::move(pool).value();
}

Tokens Concat(const Tokens& a, const Tokens& b) {
  Tokens out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Allocates whole blocks for `tokens`, inserts them, and drops the caller's references
// (what a session does when it finishes): afterwards only the tree holds the blocks.
RadixCache::InsertResult InsertAndRelease(RadixCache& cache, BlockPool& pool, uint64_t ns, const Tokens& tokens,
                                          std::vector<int32_t>* ids = nullptr) {
  const size_t n = tokens.size() / static_cast<size_t>(cache.block_size());
  std::vector<int32_t> mine(n), blocks(n);
  for (size_t i = 0; i < n; ++i) {
    mine[i] = pool.Allocate();
    EXPECT_NE(mine[i], BlockPool::kNoBlock);
    blocks[i] = mine[i];
  }
  auto r = cache.Insert(ns, tokens, blocks);
  for (int32_t b : mine) pool.Release(b);
  if (ids) *ids = blocks;
  return r;
}

std::vector<int32_t> Match(RadixCache& cache, uint64_t ns, const Tokens& tokens, NodeId* node = nullptr) {
  std::vector<int32_t> blocks;
  NodeId n = cache.MatchPrefix(ns, tokens, &blocks);
  if (node) *node = n;
  return blocks;
}

// ---- the brief's example ----------------------------------------------------------------

TEST(RadixCacheTest, SharedPrefixIsStoredOnce) {
  // Words as tokens, two tokens a block: "hello my" "name is " | "Al" "ice" / "Bo" "b".
  const Tokens prefix = {1, 2, 3, 4};
  const Tokens alice = Concat(prefix, {10, 11});
  const Tokens bob = Concat(prefix, {20, 21});
  auto pool = MakePool(2, 16);
  RadixCache cache(pool.get(), 2, 16);

  std::vector<int32_t> a_ids, b_ids;
  auto ra = InsertAndRelease(cache, *pool, kNs, alice, &a_ids);
  EXPECT_EQ(ra.n_existing, 0);
  auto rb = InsertAndRelease(cache, *pool, kNs, bob, &b_ids);
  EXPECT_EQ(rb.n_existing, 2);
  EXPECT_EQ(b_ids[0], a_ids[0]);
  EXPECT_EQ(b_ids[1], a_ids[1]);
  EXPECT_NE(b_ids[2], a_ids[2]);

  const RadixCacheStats s = cache.stats();
  EXPECT_EQ(s.n_nodes, 3);
  EXPECT_EQ(s.n_leaves, 2);
  EXPECT_EQ(s.n_cached_blocks, 4);  // 2 shared + 1 + 1
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(pool->n_used(), 4);
  EXPECT_EQ(Match(cache, kNs, alice), a_ids);
  EXPECT_EQ(Match(cache, kNs, bob), b_ids);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

// ---- Snapshot (the server's cache view) ----------------------------------------------------

TEST(RadixCacheTest, SnapshotListsParentsFirstWithTheirTokensAndLocks) {
  const Tokens prefix = {1, 2, 3, 4};
  auto pool = MakePool(2, 16);
  RadixCache cache(pool.get(), 2, 16);
  InsertAndRelease(cache, *pool, kNs, Concat(prefix, {10, 11}));
  InsertAndRelease(cache, *pool, kNs, Concat(prefix, {20, 21}));
  InsertAndRelease(cache, *pool, kNs + 1, {7, 7});  // another namespace
  NodeId bob = kNoNode;
  Match(cache, kNs, Concat(prefix, {20, 21}), &bob);
  cache.Lock(bob);  // a session holds Bob's sequence

  bool truncated = true;
  const std::vector<CacheNodeView> v = cache.Snapshot(100, 100, &truncated);
  EXPECT_FALSE(truncated);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].ns, kNs);  // namespaces in key order, each breadth first
  EXPECT_EQ(v[0].parent, kNoNode);
  EXPECT_EQ(v[0].tokens, prefix);
  EXPECT_EQ(v[0].n_blocks, 2);
  EXPECT_EQ(v[0].lock_ref, 1);  // Bob's session runs through the shared prefix
  EXPECT_EQ(v[0].hits, 1u);     // the match above passed through it
  for (size_t i : {1u, 2u}) {
    EXPECT_EQ(v[i].parent, v[0].id);
    EXPECT_EQ(v[i].depth_blocks, 3);
    EXPECT_EQ(v[i].lock_ref, v[i].tokens == Tokens({20, 21}) ? 1 : 0);
  }
  EXPECT_EQ(v[3].ns, kNs + 1);
  EXPECT_EQ(v[3].tokens, Tokens({7, 7}));
  // Bounds: nodes, and tokens per edge.
  const std::vector<CacheNodeView> cut = cache.Snapshot(2, 3, &truncated);
  EXPECT_TRUE(truncated);
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[0].tokens, Tokens({1, 2, 3}));
  cache.Unlock(bob);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

// ---- MatchPrefix ------------------------------------------------------------------------

TEST(RadixCacheTest, PartialBlockDoesNotMatchAndSplitHappensOnce) {
  RadixCache cache(nullptr, 4, 64);  // simulated: block ids are opaque
  const Tokens seq = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<int32_t> blocks = {7, 8, 9};
  auto r = cache.Insert(kNs, seq, blocks);
  EXPECT_EQ(r.n_existing, 0);
  EXPECT_EQ(cache.stats().n_nodes, 1);

  // One whole block plus three tokens of the second: only the first block counts.
  NodeId first = kNoNode;
  EXPECT_EQ(Match(cache, kNs, {1, 2, 3, 4, 5, 6, 7}, &first), (std::vector<int32_t>{7}));
  EXPECT_EQ(cache.stats().splits, 1);
  EXPECT_EQ(cache.stats().n_nodes, 2);
  EXPECT_NE(first, r.node);

  NodeId again = kNoNode;
  EXPECT_EQ(Match(cache, kNs, {1, 2, 3, 4, 5, 6, 7}, &again), (std::vector<int32_t>{7}));
  EXPECT_EQ(again, first);
  EXPECT_EQ(cache.stats().splits, 1);

  // The tail kept the original id: a handle to it is still the end of the full sequence.
  NodeId full = kNoNode;
  EXPECT_EQ(Match(cache, kNs, seq, &full), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(full, r.node);

  // Divergence inside the second block, and fewer tokens than a block.
  EXPECT_EQ(Match(cache, kNs, {1, 2, 3, 4, 5, 6, 0, 8}), (std::vector<int32_t>{7}));
  EXPECT_TRUE(Match(cache, kNs, {1, 2, 3}).empty());
  EXPECT_TRUE(Match(cache, kNs, {2, 2, 3, 4}).empty());
  EXPECT_EQ(cache.stats().splits, 1);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

// ---- MatchPartial: reuse to the token ----------------------------------------------------

TEST(RadixCacheTest, MatchPartialFindsTheLongestLeadingRunInTheNextBlock) {
  RadixCache cache(nullptr, 4, 64);
  const Tokens seq = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<int32_t> blocks = {7, 8, 9};
  cache.Insert(kNs, seq, blocks);
  // A partly filled block after the first: 1 2 3 4 | 5 6 20 pad.
  const Tokens tail = {1, 2, 3, 4, 5, 6, 20, RadixCache::kPad};
  std::vector<int32_t> tail_blocks = {7, 30};
  EXPECT_EQ(cache.Insert(kNs, tail, tail_blocks).n_existing, 1);
  EXPECT_EQ(cache.CheckInvariants(), "");

  NodeId node = kNoNode;
  const Tokens q = {1, 2, 3, 4, 5, 6, 7, 0};  // stops inside the full block 8
  EXPECT_EQ(Match(cache, kNs, q, &node), (std::vector<int32_t>{7}));
  auto pm = cache.MatchPartial(node, Tokens{5, 6, 7, 0});
  EXPECT_EQ(pm.block, 8);
  EXPECT_EQ(pm.n_tokens, 3);
  pm = cache.MatchPartial(node, Tokens{5, 6, 20, 21});  // the partly filled block, to its end
  EXPECT_EQ(pm.block, 30);
  EXPECT_EQ(pm.n_tokens, 3);
  pm = cache.MatchPartial(node, Tokens{5, 6});  // both agree on 2: either block serves
  EXPECT_EQ(pm.n_tokens, 2);
  pm = cache.MatchPartial(node, Tokens{9, 9, 9});
  EXPECT_EQ(pm.n_tokens, 0);
  EXPECT_EQ(pm.block, BlockPool::kNoBlock);
  // A padded block never matches as a whole block: MatchPrefix stops before it.
  EXPECT_EQ(Match(cache, kNs, Tokens{1, 2, 3, 4, 5, 6, 20, 21}), (std::vector<int32_t>{7}));
  // The same padded key again is the same cached block (no duplicate).
  std::vector<int32_t> again = {7, 31};
  EXPECT_EQ(cache.Insert(kNs, tail, again).n_existing, 2);
  EXPECT_EQ(again[1], 30);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, PartlyFilledLeavesAreEvictedLikeOthers) {
  auto pool = MakePool(4, 8);
  RadixCache cache(pool.get(), 4, 8);
  std::vector<int32_t> ids;
  InsertAndRelease(cache, *pool, kNs, {1, 2, 3, 4, 5, RadixCache::kPad, RadixCache::kPad, RadixCache::kPad}, &ids);
  EXPECT_EQ(pool->n_used(), 2);
  EXPECT_EQ(cache.CheckInvariants(), "");
  EXPECT_EQ(cache.Evict(8), 2);
  EXPECT_EQ(pool->n_used(), 0);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, MatchRefreshesAccessStatistics) {
  RadixCache cache(nullptr, 1, 16);
  std::vector<int32_t> blocks = {0, 1};
  cache.Insert(kNs, Tokens{5, 6}, blocks);
  EXPECT_EQ(Match(cache, kNs, {5, 6, 7}).size(), 2u);
  EXPECT_EQ(cache.stats().n_nodes, 1);  // the match ended at the node's end: no split
}

// ---- Insert -----------------------------------------------------------------------------

TEST(RadixCacheTest, InsertWritesBackCachedIdsWithoutExtraReferences) {
  auto pool = MakePool(2, 16);
  RadixCache cache(pool.get(), 2, 16);
  const Tokens seq = {1, 2, 3, 4, 5, 6};

  std::vector<int32_t> first = {pool->Allocate(), pool->Allocate(), pool->Allocate()};
  std::vector<int32_t> blocks = first;
  auto r1 = cache.Insert(kNs, seq, blocks);
  EXPECT_EQ(r1.n_existing, 0);
  EXPECT_EQ(blocks, first);
  for (int32_t b : first) EXPECT_EQ(pool->refcount(b), 2);  // the session's and the tree's
  for (int32_t b : first) pool->Release(b);

  // A second session computed the same blocks: the cached ones win.
  std::vector<int32_t> dup = {pool->Allocate(), pool->Allocate(), pool->Allocate()};
  blocks = dup;
  auto r2 = cache.Insert(kNs, seq, blocks);
  EXPECT_EQ(r2.n_existing, 3);
  EXPECT_EQ(r2.node, r1.node);
  EXPECT_EQ(blocks, first);
  for (int32_t b : first) EXPECT_EQ(pool->refcount(b), 1);
  for (int32_t b : dup) EXPECT_EQ(pool->refcount(b), 1);
  for (int32_t b : dup) pool->Release(b);
  EXPECT_EQ(pool->n_used(), 3);
  EXPECT_EQ(cache.stats().n_cached_blocks, 3);

  // Extending the sequence adds (and references) only the new block.
  std::vector<int32_t> ext = {pool->Allocate(), pool->Allocate(), pool->Allocate(), pool->Allocate()};
  blocks = ext;
  auto r3 = cache.Insert(kNs, Concat(seq, {7, 8}), blocks);
  EXPECT_EQ(r3.n_existing, 3);
  EXPECT_EQ(std::vector<int32_t>(blocks.begin(), blocks.begin() + 3), first);
  EXPECT_EQ(blocks[3], ext[3]);
  EXPECT_EQ(pool->refcount(ext[3]), 2);
  for (int32_t b : ext) pool->Release(b);
  EXPECT_EQ(pool->n_used(), 4);
  EXPECT_EQ(cache.stats().n_nodes, 2);

  // A shorter prefix of a cached edge splits it and returns the new middle node.
  std::vector<int32_t> two = {first[0], first[1]};
  auto r4 = cache.Insert(kNs, seq, std::span<int32_t>(two));
  EXPECT_EQ(r4.n_existing, 2);
  EXPECT_EQ(cache.stats().n_nodes, 3);
  NodeId node = kNoNode;
  Match(cache, kNs, {1, 2, 3, 4}, &node);
  EXPECT_EQ(node, r4.node);

  // Zero blocks: the namespace root, which equals an empty match.
  auto r0 = cache.Insert(kNs, seq, std::span<int32_t>());
  EXPECT_EQ(r0.n_existing, 0);
  Match(cache, kNs, {}, &node);
  EXPECT_EQ(node, r0.node);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

// ---- Lock, Unlock, Evict ----------------------------------------------------------------

TEST(RadixCacheTest, LockedPathsSurviveEvictionUntilUnlocked) {
  auto pool = MakePool(2, 16);
  RadixCache cache(pool.get(), 2, 16);
  const Tokens a = {1, 2, 3, 4, 5, 6};
  const Tokens b = {1, 2, 9, 9};
  auto ra = InsertAndRelease(cache, *pool, kNs, a);
  InsertAndRelease(cache, *pool, kNs, b);
  EXPECT_EQ(pool->n_used(), 4);

  cache.Lock(ra.node);
  cache.Lock(ra.node);  // counted
  EXPECT_EQ(cache.EvictableBlocks(), 1);  // only b's own block
  EXPECT_EQ(cache.Evict(16), 1);
  EXPECT_EQ(Match(cache, kNs, a).size(), 3u);
  EXPECT_EQ(Match(cache, kNs, b).size(), 1u);
  EXPECT_EQ(cache.CheckInvariants(), "");

  cache.Unlock(ra.node);
  EXPECT_EQ(cache.Evict(16), 0);
  cache.Unlock(ra.node);
  EXPECT_EQ(cache.EvictableBlocks(), 3);
  EXPECT_EQ(cache.Evict(16), 3);
  EXPECT_EQ(pool->n_free(), 16);
  EXPECT_EQ(cache.stats().n_nodes, 0);
  EXPECT_EQ(cache.stats().evicted_blocks, 4);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheDeathTest, UnlockBelowZeroIsABug) {
  RadixCache cache(nullptr, 1, 8);
  std::vector<int32_t> blocks = {0};
  auto r = cache.Insert(kNs, Tokens{1}, blocks);
  EXPECT_DEATH(cache.Unlock(r.node), "lock_ref");
}

TEST(RadixCacheTest, LruEvictsTheLeastRecentlyUsedBranch) {
  auto pool = MakePool(1, 8);
  RadixCache cache(pool.get(), 1, 8);
  InsertAndRelease(cache, *pool, kNs, {1, 2});  // older
  InsertAndRelease(cache, *pool, kNs, {1, 3});  // newer
  EXPECT_EQ(Match(cache, kNs, {1, 2}).size(), 2u);  // the older branch is now the recent one
  EXPECT_EQ(cache.Evict(pool->n_free() + 1), 1);
  EXPECT_EQ(Match(cache, kNs, {1, 3}).size(), 1u);
  EXPECT_EQ(Match(cache, kNs, {1, 2}).size(), 2u);
}

TEST(RadixCacheTest, LfuEvictsTheLeastFrequentlyUsedBranch) {
  for (bool lfu : {false, true}) {
    auto pool = MakePool(1, 8);
    RadixCache cache(pool.get(), 1, 8, lfu ? MakeLfuPolicy() : MakeLruPolicy());
    InsertAndRelease(cache, *pool, kNs, {1, 2});
    InsertAndRelease(cache, *pool, kNs, {1, 3});
    Match(cache, kNs, {1, 2});
    Match(cache, kNs, {1, 2});
    Match(cache, kNs, {1, 3});  // most recent, but fewer hits
    EXPECT_EQ(cache.Evict(pool->n_free() + 1), 1);
    const bool kept_frequent = Match(cache, kNs, {1, 2}).size() == 2u;
    EXPECT_EQ(kept_frequent, lfu) << (lfu ? "lfu" : "lru");
  }
}

TEST(RadixCacheTest, SplitKeepsTheHitCountForLfu) {
  RadixCache cache(nullptr, 1, 16, MakeLfuPolicy());
  std::vector<int32_t> x = {0, 1, 2}, w = {3};
  cache.Insert(kNs, Tokens{1, 2, 3}, x);
  for (int i = 0; i < 3; ++i) Match(cache, kNs, {1, 2, 3});  // x: 3 hits
  for (int i = 0; i < 3; ++i) Match(cache, kNs, {1, 2});     // split: prefix 3 + 3 hits, tail 3
  cache.Insert(kNs, Tokens{8}, w);
  for (int i = 0; i < 4; ++i) Match(cache, kNs, {8});        // w: 4 hits
  EXPECT_EQ(cache.Evict(1), 1);  // the tail (3 hits)
  EXPECT_EQ(cache.stats().n_nodes, 2);
  EXPECT_EQ(cache.Evict(1), 1);  // w (4 hits) before the prefix (6 hits)
  EXPECT_TRUE(Match(cache, kNs, {8}).empty());
  EXPECT_EQ(Match(cache, kNs, {1, 2}).size(), 2u);
}

TEST(RadixCacheTest, ParentIsEvictedAfterItsLastChild) {
  RadixCache cache(nullptr, 2, 16);  // simulated: Evict(n) drops at least n blocks
  std::vector<int32_t> x = {0, 1}, y = {0, 2};
  cache.Insert(kNs, Tokens{1, 1, 2, 2}, x);
  cache.Insert(kNs, Tokens{1, 1, 3, 3}, y);
  ASSERT_EQ(cache.stats().n_nodes, 3);
  EXPECT_EQ(cache.Evict(1), 1);
  EXPECT_EQ(cache.stats().n_nodes, 2);
  EXPECT_EQ(cache.stats().n_leaves, 1);
  EXPECT_EQ(cache.Evict(1), 1);
  EXPECT_EQ(cache.stats().n_nodes, 1);  // the shared prefix, now a leaf
  EXPECT_EQ(cache.stats().n_leaves, 1);
  EXPECT_EQ(Match(cache, kNs, {1, 1, 2, 2}), (std::vector<int32_t>{0}));
  EXPECT_EQ(cache.Evict(1), 1);
  EXPECT_EQ(cache.stats().n_nodes, 0);
  EXPECT_EQ(cache.stats().evicted_nodes, 3);
  EXPECT_EQ(cache.Evict(1), 0);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, SimulatedEvictDropsWholeNodes) {
  RadixCache cache(nullptr, 1, 16);
  std::vector<int32_t> a = {0, 1}, b = {2, 3};
  cache.Insert(kNs, Tokens{1, 2}, a);
  cache.Insert(kNs, Tokens{3, 4}, b);
  EXPECT_EQ(cache.Evict(3), 4);  // two 2-block leaves
  EXPECT_EQ(cache.Evict(0), 0);
}

TEST(RadixCacheTest, EvictStopsWhenThePoolHasWantFreeBlocks) {
  auto pool = MakePool(2, 8);
  RadixCache cache(pool.get(), 2, 8);
  for (int32_t t = 0; t < 4; ++t) InsertAndRelease(cache, *pool, kNs, {t, t});
  EXPECT_EQ(pool->n_free(), 4);
  EXPECT_EQ(cache.Evict(3), 0);
  EXPECT_EQ(cache.Evict(5), 1);
  EXPECT_EQ(pool->n_free(), 5);
  EXPECT_TRUE(Match(cache, kNs, {0, 0}).empty());  // the oldest went first
  EXPECT_EQ(Match(cache, kNs, {1, 1}).size(), 1u);
  EXPECT_EQ(cache.Evict(7), 2);
  EXPECT_EQ(pool->n_free(), 7);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, BlockHeldBySessionOutlivesEviction) {
  auto pool = MakePool(2, 4);
  RadixCache cache(pool.get(), 2, 4);
  std::vector<int32_t> ids;
  InsertAndRelease(cache, *pool, kNs, {1, 2, 3, 4}, &ids);
  pool->Acquire(ids[0]);  // a session still uses the first block
  EXPECT_EQ(cache.Evict(4), 2);  // tries its best: everything evictable goes
  EXPECT_EQ(cache.stats().n_cached_blocks, 0);
  EXPECT_EQ(pool->n_free(), 3);
  EXPECT_EQ(pool->refcount(ids[0]), 1);
  pool->Release(ids[0]);
  EXPECT_EQ(pool->n_free(), 4);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, DestructorReturnsTheTreesReferences) {
  auto pool = MakePool(1, 8);
  {
    RadixCache cache(pool.get(), 1, 8);
    InsertAndRelease(cache, *pool, kNs, {1, 2, 3});
    EXPECT_EQ(pool->n_free(), 5);
  }
  EXPECT_EQ(pool->n_free(), 8);
}

// ---- namespaces -------------------------------------------------------------------------

TEST(RadixCacheTest, NamespacesShareNothing) {
  auto pool = MakePool(2, 16);
  RadixCache cache(pool.get(), 2, 16);
  const uint64_t ns_a = RadixCache::NamespaceKey(42, 0);
  const uint64_t ns_b = RadixCache::NamespaceKey(42, 7);
  const Tokens seq = {1, 2, 3, 4};
  std::vector<int32_t> a_ids, b_ids;
  InsertAndRelease(cache, *pool, ns_a, seq, &a_ids);
  EXPECT_EQ(InsertAndRelease(cache, *pool, ns_b, seq, &b_ids).n_existing, 0);
  EXPECT_EQ(Match(cache, ns_a, seq), a_ids);
  EXPECT_EQ(Match(cache, ns_b, seq), b_ids);
  for (int32_t b : a_ids) EXPECT_EQ(std::count(b_ids.begin(), b_ids.end(), b), 0);
  EXPECT_EQ(cache.stats().n_namespaces, 2);
  EXPECT_EQ(pool->n_used(), 4);

  // An unknown namespace matches nothing, creates nothing, and its node can be locked.
  NodeId node = kNoNode;
  EXPECT_TRUE(Match(cache, RadixCache::NamespaceKey(43, 0), seq, &node).empty());
  EXPECT_EQ(cache.stats().n_namespaces, 2);
  cache.Lock(node);
  cache.Unlock(node);
  EXPECT_EQ(cache.CheckInvariants(), "");
}

TEST(RadixCacheTest, NamespaceKeyDependsOnFingerprintAndSalt) {
  std::set<uint64_t> keys;
  for (uint64_t fp : {0ull, 1ull, 2ull, 0xDEADBEEFull}) {
    for (uint64_t salt : {0ull, 1ull, 2ull, 0xDEADBEEFull}) keys.insert(RadixCache::NamespaceKey(fp, salt));
  }
  EXPECT_EQ(keys.size(), 16u);
  EXPECT_EQ(RadixCache::NamespaceKey(5, 6), RadixCache::NamespaceKey(5, 6));
}

// ---- randomized property test against a naive model -------------------------------------

// The model: for each namespace, every cached whole-block prefix (its tokens) -> the block
// id of its last block. The tree is correct when MatchPrefix returns exactly the ids of the
// longest prefix present, and the model has one entry per cached block.
class RandomizedTest {
 public:
  RandomizedTest(int block_size, uint32_t seed)
      : bs_(block_size), rng_(seed), pool_(MakePool(block_size, kBlocks)),
        cache_(pool_.get(), block_size, kBlocks, seed % 2 ? MakeLfuPolicy() : MakeLruPolicy()) {
    for (auto& stem : stems_) {
      stem.resize(static_cast<size_t>(kStemBlocks * bs_));
      for (auto& t : stem) t = Rand(3);
    }
  }

  void Run(int n_ops) {
    for (int op = 0; op < n_ops; ++op) {
      const int kind = Rand(100);
      if (kind < 40) {
        DoInsert();
      } else if (kind < 65) {
        DoMatch(Gen(), RandNs(/*unknown_ok=*/true));
      } else if (kind < 76) {
        DoLock();
      } else if (kind < 87) {
        DoUnlock();
      } else if (kind < 94) {
        DoEvict(Rand(kBlocks + 1));
      } else {
        DoHold();
      }
      ASSERT_EQ(cache_.CheckInvariants(), "") << "op " << op;
      DoMatch(Gen(), RandNs(true));  // a probe after every op
      ASSERT_EQ(ModelBlocks(), cache_.stats().n_cached_blocks) << "op " << op;
      if (::testing::Test::HasFailure()) return;
    }
    // Let go of everything: nothing may leak.
    for (const auto& l : locks_) cache_.Unlock(l.node);
    locks_.clear();
    for (int32_t b : held_) pool_->Release(b);
    held_.clear();
    DoEvict(kBlocks);
    EXPECT_EQ(pool_->n_free(), kBlocks);
    EXPECT_EQ(cache_.stats().n_nodes, 0);
    EXPECT_EQ(cache_.stats().n_cached_blocks, 0);
    EXPECT_EQ(cache_.CheckInvariants(), "");
  }

 private:
  static constexpr int32_t kBlocks = 48;
  static constexpr int kStemBlocks = 10;
  struct Held {
    uint64_t ns;
    Tokens prefix;
    NodeId node;
  };

  int32_t Rand(int n) { return static_cast<int32_t>(rng_() % static_cast<uint32_t>(n)); }
  uint64_t RandNs(bool unknown_ok) { return kNamespaces[Rand(unknown_ok ? 4 : 3)]; }

  // A stem prefix (cut anywhere), perhaps one changed token, perhaps a random tail.
  Tokens Gen() {
    const Tokens& stem = stems_[static_cast<size_t>(Rand(static_cast<int>(stems_.size())))];
    Tokens t(stem.begin(), stem.begin() + Rand(static_cast<int>(stem.size()) + 1));
    if (!t.empty() && Rand(4) == 0) {
      // Two draws in one statement would leave their order to the compiler (it differed
      // between the x86-64 and aarch64 builds): one statement each.
      const size_t at = static_cast<size_t>(Rand(static_cast<int>(t.size())));
      t[at] = Rand(3);
    }
    const int tail = Rand(4) == 0 ? Rand(3 * bs_ + 1) : 0;
    for (int i = 0; i < tail; ++i) t.push_back(Rand(2));
    return t;
  }

  std::vector<int32_t> Expected(uint64_t ns, const Tokens& tokens) const {
    std::vector<int32_t> ids;
    auto m = model_.find(ns);
    if (m == model_.end()) return ids;
    for (size_t n = static_cast<size_t>(bs_); n <= tokens.size(); n += static_cast<size_t>(bs_)) {
      auto it = m->second.find(Tokens(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n)));
      if (it == m->second.end()) break;
      ids.push_back(it->second);
    }
    return ids;
  }

  int32_t ModelBlocks() const {
    size_t n = 0;
    for (const auto& [ns, prefixes] : model_) n += prefixes.size();
    return static_cast<int32_t>(n);
  }

  NodeId DoMatch(const Tokens& tokens, uint64_t ns) {
    std::vector<int32_t> got;
    const NodeId node = cache_.MatchPrefix(ns, tokens, &got);
    EXPECT_EQ(got, Expected(ns, tokens));
    return node;
  }

  void DoInsert() {
    const uint64_t ns = RandNs(false);
    const Tokens tokens = Gen();
    const int32_t n = static_cast<int32_t>(tokens.size()) / bs_ - (Rand(3) == 0 ? 1 : 0);
    if (n < 0) return;
    if (pool_->n_free() < n) DoEvict(n);
    if (pool_->n_free() < n) return;
    std::vector<int32_t> mine(static_cast<size_t>(n));
    for (auto& b : mine) b = pool_->Allocate();
    std::vector<int32_t> blocks = mine;
    std::vector<int32_t> expected = Expected(ns, tokens);
    if (expected.size() > static_cast<size_t>(n)) expected.resize(static_cast<size_t>(n));

    const auto r = cache_.Insert(ns, tokens, blocks);
    ASSERT_EQ(r.n_existing, static_cast<int32_t>(expected.size()));
    for (int32_t i = 0; i < n; ++i) {
      const size_t si = static_cast<size_t>(i);
      if (i < r.n_existing) {
        EXPECT_EQ(blocks[si], expected[si]);
      } else {
        EXPECT_EQ(blocks[si], mine[si]);
        model_[ns][Tokens(tokens.begin(), tokens.begin() + (i + 1) * bs_)] = mine[si];
      }
    }
    for (int32_t b : mine) pool_->Release(b);
    // The returned node is the end of the inserted path.
    const NodeId end = DoMatch(Tokens(tokens.begin(), tokens.begin() + n * bs_), ns);
    EXPECT_EQ(end, r.node);
  }

  void DoLock() {
    const uint64_t ns = RandNs(true);
    const Tokens tokens = Gen();
    const size_t matched = Expected(ns, tokens).size();
    const NodeId node = DoMatch(tokens, ns);
    cache_.Lock(node);
    locks_.push_back({ns, Tokens(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(matched * bs_)), node});
  }

  void DoUnlock() {
    if (locks_.empty()) return;
    const size_t i = static_cast<size_t>(Rand(static_cast<int>(locks_.size())));
    cache_.Unlock(locks_[i].node);
    locks_.erase(locks_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // A session keeps an extra reference on a cached block, or lets one go.
  void DoHold() {
    if (!held_.empty() && Rand(2) == 0) {
      pool_->Release(held_.back());
      held_.pop_back();
      return;
    }
    std::vector<int32_t> ids;
    cache_.MatchPrefix(RandNs(false), Gen(), &ids);
    if (ids.empty()) return;
    const int32_t b = ids[static_cast<size_t>(Rand(static_cast<int>(ids.size())))];
    pool_->Acquire(b);
    held_.push_back(b);
  }

  void DoEvict(int32_t want_free) {
    const RadixCacheStats before = cache_.stats();
    const int32_t dropped = cache_.Evict(want_free);
    const RadixCacheStats after = cache_.stats();
    EXPECT_EQ(dropped, before.n_cached_blocks - after.n_cached_blocks);
    EXPECT_EQ(after.evicted_blocks - before.evicted_blocks, dropped);
    if (pool_->n_free() < want_free) {
      EXPECT_EQ(cache_.EvictableBlocks(), 0);
    }
    if (dropped > 0 && before.n_cached_blocks > 0) {
      // Dropping must not overshoot by more than one node's worth of blocks.
      EXPECT_LE(pool_->n_free() - want_free, kStemBlocks + 3);
    }
    Rederive();
    // Locked paths are intact, and their handles still name the end of the locked prefix.
    // (A lock on an empty match holds a root: the shared one of namespaces with nothing
    // cached, which the namespace's own root replaces once something is inserted in it.
    // Whether a run gets there depends on its random ops.)
    for (const auto& l : locks_) {
      std::vector<int32_t> ids;
      const NodeId node = cache_.MatchPrefix(l.ns, l.prefix, &ids);
      if (!l.prefix.empty()) {
        EXPECT_EQ(node, l.node);
      }
      EXPECT_EQ(ids.size() * static_cast<size_t>(bs_), l.prefix.size());
    }
  }

  // After an eviction, keep the model entries whose whole prefix is still cached (with the
  // same ids), so later matches are checked against what is really left.
  void Rederive() {
    for (auto& [ns, prefixes] : model_) {
      std::map<Tokens, int32_t> kept;
      for (const auto& [tokens, id] : prefixes) {
        std::vector<int32_t> ids;
        cache_.MatchPrefix(ns, tokens, &ids);
        const std::vector<int32_t> want = Expected(ns, tokens);
        ASSERT_LE(ids.size(), want.size());
        EXPECT_TRUE(std::equal(ids.begin(), ids.end(), want.begin()));
        if (ids.size() == want.size()) kept.emplace(tokens, id);
      }
      prefixes = std::move(kept);
    }
  }

  static constexpr uint64_t kNamespaces[4] = {11, 22, 33, 44};  // 44 is never inserted into
  const int bs_;
  std::mt19937 rng_;
  std::unique_ptr<BlockPool> pool_;
  RadixCache cache_;
  std::array<Tokens, 6> stems_;
  std::map<uint64_t, std::map<Tokens, int32_t>> model_;
  std::vector<Held> locks_;
  std::vector<int32_t> held_;
};

TEST(RadixCacheTest, RandomizedAgainstNaiveModel) {
  for (int bs : {1, 2, 4, 16}) {
    for (uint32_t seed : {1u, 2u}) {
      SCOPED_TRACE(::testing::Message() << "block_size " << bs << " seed " << seed);
      RandomizedTest t(bs, seed);
      t.Run(1500);
    }
  }
}

}  // namespace
}  // namespace trellis

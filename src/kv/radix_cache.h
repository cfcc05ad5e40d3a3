// RadixCache: a radix tree over token ids at block granularity that maps cached
// prefixes to KV block ids (after SGLang's radix cache).
//
// The tree stores block ids, never K/V data. Every edge holds a whole number of blocks;
// a node's key is the tokens of its blocks (block_size tokens each). Children are keyed
// by the tokens of their first block. Five operations carry the design:
//   MatchPrefix  longest cached whole-block prefix; splits a node once when the match
//                ends inside it; refreshes access statistics along the path. MatchPartial
//                then extends it into one more block, to the token (copy-on-write).
//   Insert       adds the whole blocks of a sequence; where its tokens are already cached
//                the cached blocks win and are reported back, so a caller that computed a
//                duplicate can swap its block for the shared one.
//   Lock/Unlock  reference-count a node and all its ancestors; locked nodes are never
//                evicted. The root is always locked.
//   Evict        frees unlocked leaves in the policy's order (LRU by default), pushing a
//                parent when it becomes an unlocked leaf, until enough pool blocks are free.
//
// Namespaces: the tree has one root per namespace key (a hash of the model fingerprint
// and an optional per-tenant cache salt). Sequences in different namespaces never share
// blocks, so one tenant cannot probe another's cache by timing.
//
// Reference counting: the cache holds one pool reference on every block in the tree
// (BlockPool::Acquire on insert, Release on eviction). Sessions hold their own references
// on the blocks in their block tables. A block returns to the pool's free list only when
// both let go. With pool == nullptr the tree is "simulated": block ids are opaque and no
// references are taken (tests, benchmarks of the tree alone).
//
// Allocation: nodes come from an arena sized at construction (one node per pool block
// plus the roots is always enough, since every non-root node holds at least one block),
// and per-block token keys live in an arena indexed by block id. After construction the
// tree allocates only when a new namespace is first seen.
//
// Thread safety: not thread-safe. Owned by the engine thread, like the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/block_pool.h"

namespace trellis {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;

// Access statistics an eviction policy ranks leaves by.
struct NodeStats {
  uint64_t last_access = 0;  // logical clock of the last match or insert touching the node
  uint64_t hits = 0;         // number of matches that passed through the node
  int32_t n_blocks = 0;      // blocks on the node's edge
  int32_t depth_blocks = 0;  // blocks from the root to the node's end
};

// Ranks evictable leaves: the leaf with the LOWEST priority is evicted first.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual double Priority(const NodeStats& s) const = 0;
  virtual const char* name() const = 0;
};
std::unique_ptr<EvictionPolicy> MakeLruPolicy();  // least recently used first (default)
std::unique_ptr<EvictionPolicy> MakeLfuPolicy();  // fewest hits first, then least recent

struct RadixCacheStats {
  int32_t n_nodes = 0;           // excluding roots
  int32_t n_leaves = 0;          // nodes without children (excluding roots)
  int32_t n_cached_blocks = 0;   // blocks held by the tree
  int32_t n_locked_nodes = 0;    // nodes with lock_ref > 0 (excluding roots)
  int32_t n_namespaces = 0;
  int64_t evicted_blocks = 0;    // blocks the tree let go of, since construction
  int64_t evicted_nodes = 0;
  int64_t splits = 0;
};

// One node of a snapshot (RadixCache::Snapshot): its edge and statistics.
struct CacheNodeView {
  NodeId id = kNoNode;
  NodeId parent = kNoNode;   // kNoNode: a child of its namespace's root
  uint64_t ns = 0;           // namespace key
  int32_t n_blocks = 0, depth_blocks = 0;
  int32_t lock_ref = 0;      // sessions whose sequence runs through the node
  uint64_t hits = 0;
  uint64_t age = 0;          // logical clock ticks since its last match or insert
  std::vector<int32_t> tokens;  // the edge's first tokens (at most the snapshot's max_edge_tokens)
};

class RadixCache {
 public:
  // REQUIRES: block_size >= 1, max_blocks >= 1. pool may be null (simulated tree); if not,
  // its layout's block_size must equal block_size and max_blocks its n_blocks().
  RadixCache(BlockPool* pool, int block_size, int32_t max_blocks,
             std::unique_ptr<EvictionPolicy> policy = MakeLruPolicy());
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Namespace key of a model fingerprint and a cache salt (0 = no salt).
  static uint64_t NamespaceKey(uint64_t model_fingerprint, uint64_t salt);

  // Longest cached prefix of `tokens` made of whole blocks. Appends the matched block ids
  // (in order) to *blocks without taking references. Returns the deepest node of the match
  // (the namespace root when nothing matched); lock it to keep the match from eviction.
  NodeId MatchPrefix(uint64_t ns, std::span<const int32_t> tokens, std::vector<int32_t>* blocks);

  // Key value of the unfilled slots of a partly filled block (a session's last block,
  // cached when it finishes): no token id equals it, so such a block never matches as a
  // whole block, only through MatchPartial.
  static constexpr int32_t kPad = -1;

  // Reuse to the token. After MatchPrefix returned `node`, `rest` are the tokens that
  // follow the matched whole blocks: the cached block directly under `node` (a full one,
  // or a partly filled one whose key ends in kPad) whose leading tokens agree longest
  // with `rest`. The caller copies that block's first n_tokens slots into a block of its
  // own (copy-on-write: cached blocks are never written). n_tokens is 0 when nothing
  // agrees; it is < block_size whenever rest has a whole block (MatchPrefix took those).
  // Refreshes the matched child's access statistics; takes no reference.
  struct PartialMatch {
    int32_t block = BlockPool::kNoBlock;
    int32_t n_tokens = 0;
  };
  PartialMatch MatchPartial(NodeId node, std::span<const int32_t> rest);

  // How many whole blocks of `tokens` MatchPrefix would return, without splitting or
  // touching access statistics.
  int32_t Peek(uint64_t ns, std::span<const int32_t> tokens) const;

  struct InsertResult {
    NodeId node = kNoNode;       // node at the end of the inserted path (lock it to protect it)
    int32_t n_existing = 0;      // leading blocks that were already cached
  };
  // Inserts the first blocks.size() whole blocks of `tokens`:
  // REQUIRES: tokens.size() >= blocks.size() * block_size.
  // A partly filled last block is inserted with its key padded with kPad to a whole
  // block; it must be the last block of `blocks` and is never written after.
  // For the leading positions already cached, the cached block id is written back into
  // `blocks` (so the caller can release its own duplicate and acquire the cached one);
  // the rest are added to the tree, which takes one pool reference on each.
  InsertResult Insert(uint64_t ns, std::span<const int32_t> tokens, std::span<int32_t> blocks);

  // Lock a node and its ancestors against eviction (counted; Unlock once per Lock).
  void Lock(NodeId node);
  void Unlock(NodeId node);

  // Evicts unlocked leaves until the pool has at least `want_free` free blocks or nothing
  // evictable is left (simulated tree: until `want_free` blocks have been dropped from the
  // tree). Returns the number of blocks the tree dropped.
  int32_t Evict(int32_t want_free);

  // Blocks that Evict could drop right now (held by unlocked subtrees).
  int32_t EvictableBlocks() const;
  RadixCacheStats stats() const;
  // The tree breadth first, shallowest first, namespace by namespace: at most max_nodes
  // nodes (a parent always before its children), each with its edge's first
  // max_edge_tokens tokens. *truncated: whether nodes were left out. O(nodes returned).
  std::vector<CacheNodeView> Snapshot(size_t max_nodes, size_t max_edge_tokens, bool* truncated = nullptr) const;
  int block_size() const { return block_size_; }

  // Test hook: checks every structural invariant (parent/child links, block counts, lock
  // counts, leaf set, pool references); returns a description of the first violation or "".
  std::string CheckInvariants() const;

 private:
  struct Node;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int block_size_;
};

}  // namespace trellis

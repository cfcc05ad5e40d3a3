// RadixCache implementation. Design notes: docs/radix_cache.md.
//
// Storage (all sized at construction; see Impl):
//   nodes_       arena of Node, max_blocks + kRootReserve entries, free list of ids.
//   keys_        [max_blocks][block_size] token ids of each block held by the tree.
//   next_block_  [max_blocks] next block on the same edge, kNoBlock at the edge's end.
//   owner_       [max_blocks] node holding the block, kNoNode when not in the tree.
//   heap_        Evict's scratch, capacity max_blocks (at most one entry per node).
#include "kv/radix_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "util/status.h"

namespace trellis {
namespace {

constexpr int32_t kNoBlock = BlockPool::kNoBlock;
// Arena slots reserved for roots: the shared empty root plus a few namespaces. More
// namespaces grow the arena (the only allocation after construction).
constexpr int32_t kRootReserve = 8;

class LruPolicy final : public EvictionPolicy {
 public:
  double Priority(const NodeStats& s) const override { return static_cast<double>(s.last_access); }
  const char* name() const override { return "lru"; }
};

// hits in the high part, last_access in the low 32 bits: exact while hits < 2^21 and the
// clock < 2^32; past that, ties among equally frequent nodes fall back to node id order.
class LfuPolicy final : public EvictionPolicy {
 public:
  double Priority(const NodeStats& s) const override {
    const uint64_t recency = std::min<uint64_t>(s.last_access, 0xFFFFFFFFull);
    return std::ldexp(static_cast<double>(s.hits), 32) + static_cast<double>(recency);
  }
  const char* name() const override { return "lfu"; }
};

// splitmix64 finalizer: a bijection on uint64.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<EvictionPolicy> MakeLfuPolicy() { return std::make_unique<LfuPolicy>(); }

struct RadixCache::Node {
  enum class State : uint8_t { kFree, kRoot, kInner };

  NodeId parent = kNoNode;
  NodeId first_child = kNoNode;   // children: intrusive doubly linked sibling list
  NodeId next_sibling = kNoNode;
  NodeId prev_sibling = kNoNode;
  NodeId leaf_prev = kNoNode;     // evictable-leaf list (lock_ref 0, no children)
  NodeId leaf_next = kNoNode;
  int32_t first_block = kNoBlock;  // head of the edge's block chain (next_block_)
  int32_t lock_ref = 0;            // locks on this node or any descendant; roots: 1
  NodeStats stats;
  State state = State::kFree;
  bool in_leaf_list = false;
};

struct RadixCache::Impl {
  using Node = RadixCache::Node;
  using State = Node::State;

  Impl(BlockPool* pool, int block_size, int32_t max_blocks, std::unique_ptr<EvictionPolicy> policy);

  // ---- arena --------------------------------------------------------------------------
  NodeId NewNode(State state);
  void FreeNode(NodeId id);
  bool IsRoot(NodeId id) const { return nodes_[static_cast<size_t>(id)].state == State::kRoot; }
  bool Valid(NodeId id) const {
    return id >= 0 && static_cast<size_t>(id) < nodes_.size() && N(id).state != State::kFree;
  }
  Node& N(NodeId id) { return nodes_[static_cast<size_t>(id)]; }
  const Node& N(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }

  // ---- namespaces ---------------------------------------------------------------------
  NodeId FindRoot(uint64_t ns) const {
    auto it = roots_.find(ns);
    return it == roots_.end() ? kNoNode : it->second;
  }
  NodeId FindOrCreateRoot(uint64_t ns);

  // ---- keys and children --------------------------------------------------------------
  const int32_t* Key(int32_t block) const { return keys_.data() + static_cast<size_t>(block) * block_size_; }
  bool BlockMatches(int32_t block, const int32_t* tokens) const {
    return std::memcmp(Key(block), tokens, static_cast<size_t>(block_size_) * sizeof(int32_t)) == 0;
  }
  int32_t& Next(int32_t block) { return next_block_[static_cast<size_t>(block)]; }
  int32_t Next(int32_t block) const { return next_block_[static_cast<size_t>(block)]; }
  NodeId& Owner(int32_t block) { return owner_[static_cast<size_t>(block)]; }
  NodeId FindChild(NodeId parent, const int32_t* tokens) const;
  void LinkChild(NodeId parent, NodeId child);
  void UnlinkChild(NodeId child);

  // ---- the evictable-leaf set ---------------------------------------------------------
  bool IsEvictableLeaf(NodeId id) const {
    const Node& n = N(id);
    return n.state == State::kInner && n.lock_ref == 0 && n.first_child == kNoNode;
  }
  void UpdateLeafStatus(NodeId id) { SetInLeafList(id, IsEvictableLeaf(id)); }
  void SetInLeafList(NodeId id, bool want);

  // ---- structure ----------------------------------------------------------------------
  // Walks from `root` over whole blocks of tokens[0, n_blocks * block_size), splitting the
  // last node when the walk ends inside its edge. Calls on_block(i, block) for every
  // matched block i. Returns the deepest node reached and the number of blocks matched.
  template <typename OnBlock>
  std::pair<NodeId, int32_t> Walk(NodeId root, const int32_t* tokens, int32_t n_blocks, bool hit,
                                  OnBlock&& on_block);
  NodeId Split(NodeId child, int32_t k);
  NodeId AddLeaf(NodeId parent, const int32_t* tokens, std::span<const int32_t> blocks);
  void RemoveLeaf(NodeId id);
  void Touch(NodeId id, bool hit) {
    Node& n = N(id);
    n.stats.last_access = ++clock_;
    if (hit) ++n.stats.hits;
  }

  std::string CheckInvariants() const;
  std::string CheckSubtree(NodeId root, std::vector<uint8_t>* seen_node, std::vector<uint8_t>* seen_block,
                           RadixCacheStats* counted, int32_t* evictable) const;

  BlockPool* pool_;  // borrowed; outlives the cache; null = simulated tree
  const int block_size_;
  const int32_t max_blocks_;
  std::unique_ptr<EvictionPolicy> policy_;

  std::vector<Node> nodes_;          // [max_blocks + kRootReserve], grows only for roots
  std::vector<NodeId> free_nodes_;   // stack of free arena slots
  std::vector<int32_t> keys_;        // [max_blocks * block_size]
  std::vector<int32_t> next_block_;  // [max_blocks]
  std::vector<NodeId> owner_;        // [max_blocks]
  std::unordered_map<uint64_t, NodeId> roots_;
  NodeId empty_root_ = kNoNode;  // returned by MatchPrefix for unknown namespaces
  NodeId leaf_head_ = kNoNode;   // evictable-leaf list
  int32_t n_evictable_leaves_ = 0;
  int32_t evictable_blocks_ = 0;  // blocks on nodes with lock_ref == 0
  uint64_t clock_ = 0;
  RadixCacheStats stats_;

  struct HeapEntry {
    double priority;
    NodeId node;
  };
  std::vector<HeapEntry> heap_;  // Evict scratch, capacity max_blocks
};

RadixCache::Impl::Impl(BlockPool* pool, int block_size, int32_t max_blocks,
                       std::unique_ptr<EvictionPolicy> policy)
    : pool_(pool), block_size_(block_size), max_blocks_(max_blocks), policy_(std::move(policy)) {
  const size_t n_nodes = static_cast<size_t>(max_blocks) + kRootReserve;
  nodes_.resize(n_nodes);
  free_nodes_.reserve(n_nodes);
  for (size_t i = n_nodes; i-- > 0;) free_nodes_.push_back(static_cast<NodeId>(i));
  keys_.assign(static_cast<size_t>(max_blocks) * static_cast<size_t>(block_size), 0);
  next_block_.assign(static_cast<size_t>(max_blocks), kNoBlock);
  owner_.assign(static_cast<size_t>(max_blocks), kNoNode);
  heap_.reserve(static_cast<size_t>(max_blocks));
  roots_.reserve(kRootReserve);
  empty_root_ = NewNode(State::kRoot);
}

NodeId RadixCache::Impl::NewNode(State state) {
  NodeId id;
  if (!free_nodes_.empty()) {
    id = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    // Every inner node holds at least one distinct block, so only roots can get here.
    TRELLIS_CHECK(state == State::kRoot);
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  Node& n = N(id);
  n = Node{};
  n.state = state;
  if (state == State::kRoot) n.lock_ref = 1;
  return id;
}

void RadixCache::Impl::FreeNode(NodeId id) {
  N(id) = Node{};
  free_nodes_.push_back(id);  // capacity reserved: never more free slots than the initial arena
}

NodeId RadixCache::Impl::FindOrCreateRoot(uint64_t ns) {
  NodeId root = FindRoot(ns);
  if (root != kNoNode) return root;
  root = NewNode(State::kRoot);
  roots_.emplace(ns, root);
  ++stats_.n_namespaces;
  return root;
}

NodeId RadixCache::Impl::FindChild(NodeId parent, const int32_t* tokens) const {
  for (NodeId c = N(parent).first_child; c != kNoNode; c = N(c).next_sibling) {
    if (BlockMatches(N(c).first_block, tokens)) return c;
  }
  return kNoNode;
}

void RadixCache::Impl::LinkChild(NodeId parent, NodeId child) {
  Node& p = N(parent);
  Node& c = N(child);
  c.parent = parent;
  c.prev_sibling = kNoNode;
  c.next_sibling = p.first_child;
  if (p.first_child != kNoNode) N(p.first_child).prev_sibling = child;
  p.first_child = child;
}

void RadixCache::Impl::UnlinkChild(NodeId child) {
  Node& c = N(child);
  if (c.prev_sibling != kNoNode) {
    N(c.prev_sibling).next_sibling = c.next_sibling;
  } else {
    N(c.parent).first_child = c.next_sibling;
  }
  if (c.next_sibling != kNoNode) N(c.next_sibling).prev_sibling = c.prev_sibling;
  c.parent = c.prev_sibling = c.next_sibling = kNoNode;
}

void RadixCache::Impl::SetInLeafList(NodeId id, bool want) {
  Node& n = N(id);
  if (want == n.in_leaf_list) return;
  if (want) {
    n.leaf_prev = kNoNode;
    n.leaf_next = leaf_head_;
    if (leaf_head_ != kNoNode) N(leaf_head_).leaf_prev = id;
    leaf_head_ = id;
    ++n_evictable_leaves_;
  } else {
    if (n.leaf_prev != kNoNode) {
      N(n.leaf_prev).leaf_next = n.leaf_next;
    } else {
      leaf_head_ = n.leaf_next;
    }
    if (n.leaf_next != kNoNode) N(n.leaf_next).leaf_prev = n.leaf_prev;
    n.leaf_prev = n.leaf_next = kNoNode;
    --n_evictable_leaves_;
  }
  n.in_leaf_list = want;
}

template <typename OnBlock>
std::pair<NodeId, int32_t> RadixCache::Impl::Walk(NodeId root, const int32_t* tokens, int32_t n_blocks,
                                                  bool hit, OnBlock&& on_block) {
  const size_t bs = static_cast<size_t>(block_size_);
  NodeId node = root;
  int32_t i = 0;
  while (i < n_blocks) {
    NodeId child = FindChild(node, tokens + static_cast<size_t>(i) * bs);
    if (child == kNoNode) break;
    const int32_t edge = N(child).stats.n_blocks;
    int32_t k = 0;
    for (int32_t b = N(child).first_block;
         b != kNoBlock && i + k < n_blocks && BlockMatches(b, tokens + static_cast<size_t>(i + k) * bs);
         b = Next(b), ++k) {
      on_block(i + k, b);
    }
    // k >= 1: FindChild matched the first block.
    if (k < edge) child = Split(child, k);
    Touch(child, hit);
    node = child;
    i += k;
    if (k < edge) break;  // diverged (or ran out) inside the edge
  }
  return {node, i};
}

// Splits `child` after its first k blocks (0 < k < n_blocks). A new node takes the prefix
// and child's place under its parent; `child` keeps the tail and its id, so handles held
// by sessions stay valid. The new node copies lock_ref (every lock below child is below
// it too) and the access statistics. O(k), no allocation.
NodeId RadixCache::Impl::Split(NodeId child, int32_t k) {
  const NodeId mid = NewNode(State::kInner);
  Node& c = N(child);
  Node& m = N(mid);
  TRELLIS_CHECK(k > 0 && k < c.stats.n_blocks);

  // m replaces c in the parent's sibling list.
  m.parent = c.parent;
  m.prev_sibling = c.prev_sibling;
  m.next_sibling = c.next_sibling;
  if (m.prev_sibling != kNoNode) {
    N(m.prev_sibling).next_sibling = mid;
  } else {
    N(m.parent).first_child = mid;
  }
  if (m.next_sibling != kNoNode) N(m.next_sibling).prev_sibling = mid;
  m.first_child = child;
  c.parent = mid;
  c.prev_sibling = c.next_sibling = kNoNode;

  // The first k blocks of the chain move to m.
  m.first_block = c.first_block;
  int32_t last = c.first_block;
  Owner(last) = mid;
  for (int32_t j = 1; j < k; ++j) {
    last = Next(last);
    Owner(last) = mid;
  }
  c.first_block = Next(last);
  Next(last) = kNoBlock;

  m.lock_ref = c.lock_ref;
  m.stats = c.stats;
  m.stats.n_blocks = k;
  m.stats.depth_blocks = c.stats.depth_blocks - c.stats.n_blocks + k;
  c.stats.n_blocks -= k;

  ++stats_.n_nodes;
  ++stats_.splits;
  if (m.lock_ref > 0) ++stats_.n_locked_nodes;
  // Leaf set: m has a child, c is unchanged; evictable_blocks_ is unchanged.
  return mid;
}

NodeId RadixCache::Impl::AddLeaf(NodeId parent, const int32_t* tokens, std::span<const int32_t> blocks) {
  const NodeId id = NewNode(State::kInner);
  const bool parent_was_leaf = !IsRoot(parent) && N(parent).first_child == kNoNode;
  LinkChild(parent, id);
  const size_t bs = static_cast<size_t>(block_size_);
  int32_t prev = kNoBlock;
  for (size_t j = 0; j < blocks.size(); ++j) {
    const int32_t b = blocks[j];
    TRELLIS_CHECK(b >= 0 && b < max_blocks_);
    TRELLIS_CHECK(Owner(b) == kNoNode);  // a block belongs to at most one node
    Owner(b) = id;
    std::memcpy(keys_.data() + static_cast<size_t>(b) * bs, tokens + j * bs, bs * sizeof(int32_t));
    Next(b) = kNoBlock;
    if (prev == kNoBlock) {
      N(id).first_block = b;
    } else {
      Next(prev) = b;
    }
    prev = b;
    if (pool_) pool_->Acquire(b);
  }
  Node& n = N(id);
  const int32_t m = static_cast<int32_t>(blocks.size());
  n.stats.n_blocks = m;
  n.stats.depth_blocks = N(parent).stats.depth_blocks + m;
  n.stats.last_access = ++clock_;

  ++stats_.n_nodes;
  if (!parent_was_leaf) ++stats_.n_leaves;
  stats_.n_cached_blocks += m;
  evictable_blocks_ += m;
  UpdateLeafStatus(parent);
  UpdateLeafStatus(id);
  return id;
}

void RadixCache::Impl::RemoveLeaf(NodeId id) {
  Node& n = N(id);
  TRELLIS_CHECK(IsEvictableLeaf(id));
  for (int32_t b = n.first_block; b != kNoBlock;) {
    const int32_t next = Next(b);
    Owner(b) = kNoNode;
    Next(b) = kNoBlock;
    if (pool_) pool_->Release(b);
    b = next;
  }
  const int32_t m = n.stats.n_blocks;
  const NodeId parent = n.parent;
  SetInLeafList(id, false);
  UnlinkChild(id);
  FreeNode(id);

  --stats_.n_nodes;
  if (IsRoot(parent) || N(parent).first_child != kNoNode) --stats_.n_leaves;  // else parent is the new leaf
  stats_.n_cached_blocks -= m;
  stats_.evicted_blocks += m;
  ++stats_.evicted_nodes;
  evictable_blocks_ -= m;
  UpdateLeafStatus(parent);
}

// ---- RadixCache -----------------------------------------------------------------------

RadixCache::RadixCache(BlockPool* pool, int block_size, int32_t max_blocks,
                       std::unique_ptr<EvictionPolicy> policy)
    : block_size_(block_size) {
  TRELLIS_CHECK(block_size >= 1 && max_blocks >= 1 && policy != nullptr);
  if (pool) TRELLIS_CHECK(pool->layout().block_size == block_size && pool->n_blocks() == max_blocks);
  impl_ = std::make_unique<Impl>(pool, block_size, max_blocks, std::move(policy));
}

RadixCache::~RadixCache() {
  if (!impl_->pool_) return;
  // The tree's references go back to the pool; sessions keep theirs.
  for (int32_t b = 0; b < impl_->max_blocks_; ++b) {
    if (impl_->Owner(b) != kNoNode) impl_->pool_->Release(b);
  }
}

uint64_t RadixCache::NamespaceKey(uint64_t model_fingerprint, uint64_t salt) {
  // Each step is a bijection, so keys differ whenever exactly one input differs.
  return Mix64(Mix64(model_fingerprint ^ 0x243F6A8885A308D3ull) ^ salt);
}

NodeId RadixCache::MatchPrefix(uint64_t ns, std::span<const int32_t> tokens, std::vector<int32_t>* blocks) {
  Impl& im = *impl_;
  const NodeId root = im.FindRoot(ns);
  if (root == kNoNode) return im.empty_root_;
  const int32_t n_blocks = static_cast<int32_t>(tokens.size() / static_cast<size_t>(block_size_));
  return im.Walk(root, tokens.data(), n_blocks, /*hit=*/true,
                 [blocks](int32_t, int32_t b) { blocks->push_back(b); })
      .first;
}

RadixCache::PartialMatch RadixCache::MatchPartial(NodeId node, std::span<const int32_t> rest) {
  Impl& im = *impl_;
  PartialMatch best;
  if (!im.Valid(node) || rest.empty()) return best;
  const size_t limit = std::min(rest.size(), static_cast<size_t>(block_size_));
  NodeId best_child = kNoNode;
  for (NodeId c = im.N(node).first_child; c != kNoNode; c = im.N(c).next_sibling) {
    const int32_t* key = im.Key(im.N(c).first_block);
    size_t j = 0;
    while (j < limit && key[j] == rest[j]) ++j;  // kPad never equals a token id
    if (static_cast<int32_t>(j) > best.n_tokens) {
      best.n_tokens = static_cast<int32_t>(j);
      best.block = im.N(c).first_block;
      best_child = c;
    }
  }
  if (best_child != kNoNode) im.Touch(best_child, /*hit=*/true);
  return best;
}

int32_t RadixCache::Peek(uint64_t ns, std::span<const int32_t> tokens) const {
  const Impl& im = *impl_;
  const NodeId root = im.FindRoot(ns);
  if (root == kNoNode) return 0;
  const size_t bs = static_cast<size_t>(block_size_);
  const int32_t n_blocks = static_cast<int32_t>(tokens.size() / bs);
  NodeId node = root;
  int32_t i = 0;
  while (i < n_blocks) {
    const NodeId child = im.FindChild(node, tokens.data() + static_cast<size_t>(i) * bs);
    if (child == kNoNode) break;
    int32_t k = 0;
    for (int32_t b = im.N(child).first_block;
         b != kNoBlock && i + k < n_blocks && im.BlockMatches(b, tokens.data() + static_cast<size_t>(i + k) * bs);
         b = im.Next(b), ++k) {
    }
    i += k;
    if (k < im.N(child).stats.n_blocks) break;
    node = child;
  }
  return i;
}

RadixCache::InsertResult RadixCache::Insert(uint64_t ns, std::span<const int32_t> tokens,
                                            std::span<int32_t> blocks) {
  Impl& im = *impl_;
  TRELLIS_CHECK(tokens.size() >= blocks.size() * static_cast<size_t>(block_size_));
  const NodeId root = im.FindOrCreateRoot(ns);
  const int32_t n_blocks = static_cast<int32_t>(blocks.size());
  auto [node, n_existing] =
      im.Walk(root, tokens.data(), n_blocks, /*hit=*/false,
              [blocks](int32_t i, int32_t b) { blocks[static_cast<size_t>(i)] = b; });
  if (n_existing < n_blocks) {
    const size_t off = static_cast<size_t>(n_existing);
    node = im.AddLeaf(node, tokens.data() + off * static_cast<size_t>(block_size_), blocks.subspan(off));
  }
  return InsertResult{node, n_existing};
}

void RadixCache::Lock(NodeId node) {
  Impl& im = *impl_;
  TRELLIS_CHECK(im.Valid(node));
  for (NodeId id = node; !im.IsRoot(id); id = im.N(id).parent) {
    Node& n = im.N(id);
    if (n.lock_ref++ == 0) {
      im.evictable_blocks_ -= n.stats.n_blocks;
      ++im.stats_.n_locked_nodes;
      im.UpdateLeafStatus(id);
    }
  }
}

void RadixCache::Unlock(NodeId node) {
  Impl& im = *impl_;
  TRELLIS_CHECK(im.Valid(node));
  for (NodeId id = node; !im.IsRoot(id); id = im.N(id).parent) {
    Node& n = im.N(id);
    TRELLIS_CHECK(n.lock_ref > 0);  // more Unlocks than Locks
    if (--n.lock_ref == 0) {
      im.evictable_blocks_ += n.stats.n_blocks;
      --im.stats_.n_locked_nodes;
      im.UpdateLeafStatus(id);
    }
  }
}

int32_t RadixCache::Evict(int32_t want_free) {
  Impl& im = *impl_;
  int32_t dropped = 0;
  auto done = [&] { return im.pool_ ? im.pool_->n_free() >= want_free : dropped >= want_free; };
  if (done()) return 0;

  // Min-heap on (priority, node id) over the current unlocked leaves.
  auto later = [](const Impl::HeapEntry& a, const Impl::HeapEntry& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.node > b.node;
  };
  im.heap_.clear();
  for (NodeId id = im.leaf_head_; id != kNoNode; id = im.N(id).leaf_next) {
    im.heap_.push_back({im.policy_->Priority(im.N(id).stats), id});
  }
  std::make_heap(im.heap_.begin(), im.heap_.end(), later);

  while (!done() && !im.heap_.empty()) {
    std::pop_heap(im.heap_.begin(), im.heap_.end(), later);
    const NodeId victim = im.heap_.back().node;
    im.heap_.pop_back();
    const NodeId parent = im.N(victim).parent;
    dropped += im.N(victim).stats.n_blocks;
    im.RemoveLeaf(victim);
    if (im.IsEvictableLeaf(parent)) {
      im.heap_.push_back({im.policy_->Priority(im.N(parent).stats), parent});
      std::push_heap(im.heap_.begin(), im.heap_.end(), later);
    }
  }
  return dropped;
}

int32_t RadixCache::EvictableBlocks() const { return impl_->evictable_blocks_; }

RadixCacheStats RadixCache::stats() const { return impl_->stats_; }

std::vector<CacheNodeView> RadixCache::Snapshot(size_t max_nodes, size_t max_edge_tokens, bool* truncated) const {
  const Impl& m = *impl_;
  std::vector<CacheNodeView> out;
  if (truncated) *truncated = false;
  // Namespaces in key order, so that successive snapshots list them alike.
  std::vector<std::pair<uint64_t, NodeId>> roots(m.roots_.begin(), m.roots_.end());
  std::sort(roots.begin(), roots.end());
  for (const auto& [ns, root] : roots) {
    std::vector<NodeId> level;
    for (NodeId c = m.N(root).first_child; c != kNoNode; c = m.N(c).next_sibling) level.push_back(c);
    while (!level.empty()) {
      std::vector<NodeId> next;
      for (NodeId id : level) {
        if (out.size() >= max_nodes) {
          if (truncated) *truncated = true;
          return out;
        }
        const Node& n = m.N(id);
        CacheNodeView v;
        v.id = id;
        v.parent = m.IsRoot(n.parent) ? kNoNode : n.parent;
        v.ns = ns;
        v.n_blocks = n.stats.n_blocks;
        v.depth_blocks = n.stats.depth_blocks;
        v.lock_ref = n.lock_ref;
        v.hits = n.stats.hits;
        v.age = m.clock_ - n.stats.last_access;
        int32_t walked = 0;
        for (int32_t b = n.first_block; b != kNoBlock && walked < n.stats.n_blocks && v.tokens.size() < max_edge_tokens;
             b = m.Next(b), ++walked) {
          const int32_t* key = m.Key(b);
          const size_t take = std::min(static_cast<size_t>(block_size_), max_edge_tokens - v.tokens.size());
          v.tokens.insert(v.tokens.end(), key, key + take);
        }
        out.push_back(std::move(v));
        for (NodeId c = n.first_child; c != kNoNode; c = m.N(c).next_sibling) next.push_back(c);
      }
      level.swap(next);
    }
  }
  return out;
}

std::string RadixCache::CheckInvariants() const { return impl_->CheckInvariants(); }

// ---- invariants (test hook; may allocate) ----------------------------------------------

std::string RadixCache::Impl::CheckSubtree(NodeId root, std::vector<uint8_t>* seen_node,
                                           std::vector<uint8_t>* seen_block, RadixCacheStats* counted,
                                           int32_t* evictable) const {
  std::vector<NodeId> stack{root};
  std::vector<const int32_t*> child_keys;
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    const Node& n = N(id);
    if ((*seen_node)[static_cast<size_t>(id)]) return fmt::format("node {} reached twice", id);
    (*seen_node)[static_cast<size_t>(id)] = 1;
    const bool root_node = n.state == State::kRoot;
    if (root_node != (id == root)) return fmt::format("node {} has the wrong state", id);

    // The edge: its block chain.
    int32_t chain = 0;
    for (int32_t b = n.first_block; b != kNoBlock; b = next_block_[static_cast<size_t>(b)], ++chain) {
      if (b < 0 || b >= max_blocks_) return fmt::format("node {} holds bad block id {}", id, b);
      if ((*seen_block)[static_cast<size_t>(b)]) return fmt::format("block {} is on two edges", b);
      (*seen_block)[static_cast<size_t>(b)] = 1;
      if (owner_[static_cast<size_t>(b)] != id) return fmt::format("block {} owner is not node {}", b, id);
      if (pool_ && pool_->refcount(b) < 1) return fmt::format("tree block {} has refcount 0", b);
    }
    if (chain != n.stats.n_blocks) return fmt::format("node {}: n_blocks {} but chain {}", id, n.stats.n_blocks, chain);
    // A partly filled block (key padded with kPad) ends its edge and its node is a leaf;
    // its key is tokens then padding, never a pad in the middle.
    for (int32_t b = n.first_block; b != kNoBlock; b = next_block_[static_cast<size_t>(b)]) {
      const int32_t* key = Key(b);
      int32_t filled = 0;
      while (filled < block_size_ && key[filled] != kPad) ++filled;
      for (int32_t t = filled; t < block_size_; ++t) {
        if (key[t] != kPad) return fmt::format("block {}: a token after the padding", b);
      }
      if (filled == 0) return fmt::format("block {} holds no token", b);
      if (filled < block_size_ && (next_block_[static_cast<size_t>(b)] != kNoBlock || n.first_child != kNoNode)) {
        return fmt::format("partly filled block {} is not the end of a leaf edge", b);
      }
    }
    if (root_node) {
      if (chain != 0 || n.lock_ref != 1 || n.parent != kNoNode) return fmt::format("root {} malformed", id);
    } else {
      const Node& p = N(n.parent);
      if (chain < 1) return fmt::format("node {} has an empty edge", id);
      if (n.stats.depth_blocks != p.stats.depth_blocks + chain) return fmt::format("node {} depth wrong", id);
      if (n.lock_ref < 0) return fmt::format("node {} lock_ref {} < 0", id, n.lock_ref);
      if (n.stats.last_access > clock_) return fmt::format("node {} last_access ahead of clock", id);
      ++counted->n_nodes;
      counted->n_cached_blocks += chain;
      if (n.lock_ref > 0) ++counted->n_locked_nodes;
      if (n.lock_ref == 0) *evictable += chain;
      if (n.first_child == kNoNode) ++counted->n_leaves;
    }
    if (n.in_leaf_list != IsEvictableLeaf(id)) return fmt::format("node {} leaf-set membership wrong", id);

    // Children: back links, sibling links, distinct first blocks, lock counts.
    int64_t child_locks = 0;
    child_keys.clear();
    NodeId prev = kNoNode;
    for (NodeId c = n.first_child; c != kNoNode; prev = c, c = N(c).next_sibling) {
      if (!Valid(c) || N(c).state != State::kInner) return fmt::format("node {} has a bad child {}", id, c);
      if (N(c).parent != id) return fmt::format("child {} does not point back to {}", c, id);
      if (N(c).prev_sibling != prev) return fmt::format("child {} prev_sibling wrong", c);
      if (N(c).first_block == kNoBlock) return fmt::format("child {} has no blocks", c);
      const int32_t* key = Key(N(c).first_block);
      for (const int32_t* other : child_keys) {
        if (std::memcmp(key, other, static_cast<size_t>(block_size_) * sizeof(int32_t)) == 0) {
          return fmt::format("node {} has two children with the same first block", id);
        }
      }
      child_keys.push_back(key);
      child_locks += N(c).lock_ref;
      stack.push_back(c);
    }
    if (!root_node && n.lock_ref < child_locks) {
      return fmt::format("node {} lock_ref {} < children's {}", id, n.lock_ref, child_locks);
    }
  }
  return "";
}

std::string RadixCache::Impl::CheckInvariants() const {
  std::vector<uint8_t> seen_node(nodes_.size(), 0);
  std::vector<uint8_t> seen_block(static_cast<size_t>(max_blocks_), 0);
  RadixCacheStats counted;
  int32_t evictable = 0;
  if (N(empty_root_).first_child != kNoNode) return "the empty root has children";
  std::string err = CheckSubtree(empty_root_, &seen_node, &seen_block, &counted, &evictable);
  if (!err.empty()) return err;
  for (const auto& [ns, root] : roots_) {
    if (!Valid(root) || !IsRoot(root)) return fmt::format("namespace {:x} has a bad root {}", ns, root);
    err = CheckSubtree(root, &seen_node, &seen_block, &counted, &evictable);
    if (!err.empty()) return err;
  }
  size_t n_free = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const bool free = nodes_[i].state == State::kFree;
    n_free += free;
    if (!free && !seen_node[i]) return fmt::format("node {} is in use but unreachable", i);
  }
  if (n_free != free_nodes_.size()) return fmt::format("{} free nodes but free list has {}", n_free, free_nodes_.size());
  for (int32_t b = 0; b < max_blocks_; ++b) {
    if (owner_[static_cast<size_t>(b)] != kNoNode && !seen_block[static_cast<size_t>(b)]) {
      return fmt::format("block {} has an owner but is on no edge", b);
    }
  }
  int32_t listed = 0;
  for (NodeId id = leaf_head_; id != kNoNode; id = N(id).leaf_next, ++listed) {
    if (!IsEvictableLeaf(id)) return fmt::format("leaf list holds non-evictable node {}", id);
    if (listed > static_cast<int32_t>(nodes_.size())) return "leaf list has a cycle";
  }
  if (listed != n_evictable_leaves_) return fmt::format("leaf list has {} entries, count {}", listed, n_evictable_leaves_);
  const RadixCacheStats& s = stats_;
  if (counted.n_nodes != s.n_nodes || counted.n_leaves != s.n_leaves || counted.n_cached_blocks != s.n_cached_blocks ||
      counted.n_locked_nodes != s.n_locked_nodes || static_cast<int32_t>(roots_.size()) != s.n_namespaces) {
    return fmt::format("stats drifted: nodes {}/{} leaves {}/{} blocks {}/{} locked {}/{} namespaces {}/{}",
                       counted.n_nodes, s.n_nodes, counted.n_leaves, s.n_leaves, counted.n_cached_blocks,
                       s.n_cached_blocks, counted.n_locked_nodes, s.n_locked_nodes, roots_.size(), s.n_namespaces);
  }
  if (evictable != evictable_blocks_) return fmt::format("evictable blocks {} but counted {}", evictable_blocks_, evictable);
  return "";
}

}  // namespace trellis

// The scheduler and the prefix store (docs/store.md, "Engines on the store"): a session
// admitted with more of its prompt possibly stored starts a fetch into its own blocks;
// the fetch lands (ApplyFetch) between steps; finished prompts are published; a session
// whose blocks another engine is computing may wait for them (ShouldDefer).
#include <algorithm>

#include <fmt/core.h>

#include "engine/kv_layout.h"
#include "engine/scheduler_session.h"
#include "util/clock.h"
#include "util/log.h"

namespace trellis {

StoreNamespace Scheduler::StoreNs(const Session& s) const {
  StoreNamespace ns;
  ns.model_fingerprint = model_.KvFingerprint(opts_.n_ctx);
  ns.block_tokens = static_cast<uint32_t>(opts_.block_size);
  ns.kv_dtype = KvLayoutFor(model_.config(), opts_.block_size, opts_.kv_type_k, opts_.kv_type_v).TypeCode();
  ns.layout_version = 1;
  ns.salt = s.req.cache_salt;
  return ns;
}

// What the store sees of a block (all layers) and what of it this process's pool holds
// (a grid head: its own layers, the first ones).
void Scheduler::SetBlockGeometry(uint64_t& block_bytes, uint32_t& slices, LocalSlice& local) const {
  const KvLayout whole = KvLayoutFor(model_.config(), opts_.block_size, opts_.kv_type_k, opts_.kv_type_v);
  block_bytes = whole.BlockBytes();
  slices = static_cast<uint32_t>(model_.config().n_layer);
  local.offset = block_bytes / slices * static_cast<uint64_t>(model_.part().first_layer);
  local.bytes = block_bytes / slices * static_cast<uint64_t>(model_.n_local_layers());
}

void Scheduler::StartFetch(Session& s, int32_t first_block, int32_t n_blocks) {
  const int B = opts_.block_size;
  StoreFetch f;
  f.id = static_cast<uint64_t>(s.id);
  f.ns = StoreNs(s);
  f.tokens.assign(s.tokens.begin(), s.tokens.begin() + static_cast<int64_t>(first_block + n_blocks) * B);
  f.first_block = first_block;
  for (int32_t i = 0; i < n_blocks; ++i) {
    const int32_t b = s.table[static_cast<size_t>(first_block + i)];
    f.dst.push_back(pool_->BlockData(b));
    f.dst_blocks.push_back(b);
  }
  SetBlockGeometry(f.block_bytes, f.slices, f.local);
  f.epoch = epoch_;
  s.fetch_epoch = epoch_;
  f.compute_seconds_per_block = prefill_s_per_token_ * B;
  s.fetching = true;
  s.fetch_first = first_block;
  s.fetch_want = n_blocks;
  s.fetched_upto = std::max(s.fetched_upto, first_block + n_blocks);
  ++fetching_;
  opts_.store->StartFetch(std::move(f));
}

void Scheduler::ApplyFetch(StoreFetchDone d) {
  Session* sp = nullptr;
  for (auto& r : running_) {
    if (r->fetching && static_cast<uint64_t>(r->id) == d.id) sp = r.get();
  }
  if (!sp) return;  // cannot happen: a fetching session is never released
  Session& s = *sp;
  const int B = opts_.block_size;
  s.fetching = false;
  --fetching_;
  CacheReceipt& c = s.result.cache;
  const bool first_admission = !s.result.n_preempted;
  if (s.fetch_epoch != epoch_ && d.blocks > 0) {
    // A grid node lost its K/V while the blocks were read: what it read is gone there.
    d.blocks = 0;
    d.miss = StoreMiss::kDown;
  }
  if (d.blocks > 0) {
    // The fetched blocks cover any slots copied from a partial match into the first.
    const int32_t upto = (s.fetch_first + d.blocks) * B;
    const int32_t copied = s.n_computed - s.fetch_first * B;
    s.n_computed = std::max(s.n_computed, upto);
    s.n_launched = s.n_computed;
    s.reused_blocks = s.fetch_first + d.blocks;
    c.local -= copied;
    c.store = d.blocks * B;
    c.store_memory = d.from_memory * B;
    c.store_replica = d.from_replica * B;
    c.store_ssd = d.from_ssd * B;
    c.store_remote = d.from_remote * B;
    c.waited_for = d.waited * B;
    s.result.n_cached = s.n_computed;
    if (first_admission) {
      m_.cached_tokens += c.store - copied;
      m_.partial_tokens -= copied;
      m_.store_tokens += c.store;
      m_.store_waited_tokens += c.waited_for;
      m_.store_tier_tokens[0] += c.store_memory;
      m_.store_tier_tokens[1] += c.store_replica;
      m_.store_tier_tokens[2] += c.store_ssd;
      m_.store_tier_tokens[3] += c.store_remote;
    }
    InsertFullBlocks(s);
  } else if (s.n_computed > s.fetch_first * B) {
    // The read wrote into the fetch's first block, over the slots copied from a partial
    // match, and failed: those slots hold whatever landed (a corrupt or half-landed
    // block), so they are computed again rather than trusted.
    const int32_t copied = s.n_computed - s.fetch_first * B;
    s.n_computed = s.n_launched = s.fetch_first * B;
    s.result.n_cached = s.n_computed;
    c.local -= copied;
    if (first_admission) {
      m_.cached_tokens -= copied;
      m_.partial_tokens -= copied;
    }
  }
  if (d.miss != StoreMiss::kNone) {
    const int missed = (s.fetch_want - d.blocks) * B;
    c.misses[static_cast<int>(d.miss)] += missed;
    if (first_admission) m_.store_miss_tokens[static_cast<int>(d.miss)] += missed;
  }
  ++m_.store_fetches;
  m_.store_fetch_seconds += d.seconds;
  if (!s.fail_pending.ok()) {
    Finish(s, FinishReason::kError, s.fail_pending);
  } else if (s.cancel_pending) {
    Finish(s, FinishReason::kCancelled);
  }
}

// Publishes the session's full blocks when it computed some of them itself: the store
// keeps only what it does not hold yet (the increment past the longest stored prefix).
// The blocks are pinned until the store has read them.
void Scheduler::Publish(Session& s) {
  if (!opts_.store) return;
  const int B = opts_.block_size;
  const int32_t full = std::min<int32_t>(s.n_computed / B, static_cast<int32_t>(s.table.size()));
  if (full <= s.reused_blocks) return;
  StorePublish p;
  p.id = ++publish_seq_;
  p.ns = StoreNs(s);
  p.tokens.assign(s.tokens.begin(), s.tokens.begin() + static_cast<int64_t>(full) * B);
  std::vector<int32_t> pinned(s.table.begin(), s.table.begin() + full);
  for (int32_t b : pinned) {
    pool_->Acquire(b);
    p.blocks.push_back(pool_->BlockData(b));
  }
  p.block_ids = pinned;
  SetBlockGeometry(p.block_bytes, p.slices, p.local);
  p.epoch = epoch_;
  p.cost_seconds = prefill_s_per_token_ * (full - s.reused_blocks) * B;
  s.reused_blocks = full;  // published: not again
  pins_.emplace_back(p.id, std::move(pinned));
  opts_.store->StartPublish(std::move(p));
}

void Scheduler::PollStore(std::chrono::microseconds wait) {
  if (!opts_.store) return;
  fetch_done_.clear();
  publish_done_.clear();
  opts_.store->Poll(&fetch_done_, &publish_done_, wait);
  for (const StoreFetchDone& d : fetch_done_) ApplyFetch(d);
  for (const StorePublishDone& d : publish_done_) {
    if (d.status.ok()) {
      m_.store_published_blocks += d.stored;
    } else {
      ++m_.store_publish_failures;
    }
    for (size_t i = 0; i < pins_.size(); ++i) {
      if (pins_[i].first != d.id) continue;
      for (int32_t b : pins_[i].second) pool_->Release(b);
      pins_.erase(pins_.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
  }
  if (!fetch_done_.empty()) std::erase_if(running_, [](const auto& s) { return s->done; });
}

bool Scheduler::ShouldDefer(const Session& s) {
  const int B = opts_.block_size;
  const size_t limit = s.tokens.size() - 1;  // the last position is always computed
  // Blocks the tree can already give this request.
  const size_t cached = std::min(static_cast<size_t>(cache_->Peek(Namespace(s), s.tokens)), limit / B);
  for (const auto& r : running_) {
    if (r->done || r->preempted || r->req.cache_salt != s.req.cache_salt) continue;
    if (r->n_tree_blocks * B >= static_cast<int32_t>(r->tokens.size()) - B) continue;  // r has inserted all it will
    size_t common = 0;
    const size_t n = std::min(limit, r->tokens.size());
    while (common < n && r->tokens[common] == s.tokens[common]) ++common;
    if (common / B > cached) return true;
  }
  return false;
}

}  // namespace trellis

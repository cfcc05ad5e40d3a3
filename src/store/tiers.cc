#include "store/tiers.h"

#include <algorithm>

#include "util/log.h"

namespace trellis::store {

Tiers::Tiers(Arena& arena, SsdTier* ssd, std::function<void(uint64_t)> on_drop)
    : arena_(arena), ssd_(ssd), on_drop_(std::move(on_drop)) {}

Tensor* Tiers::Find(uint64_t id) {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t Tiers::ReplicaOf(uint64_t owner, uint64_t tensor) const {
  auto it = replica_of_.find({owner, tensor});
  return it == replica_of_.end() ? 0 : it->second;
}

double Tiers::Gdsf(const Tensor& tn) const {
  return clock_ + static_cast<double>(tn.reads) * std::max(tn.cost_s, 1e-6) / static_cast<double>(std::max<uint64_t>(tn.bytes, 1));
}

SsdTensor Tiers::SsdMeta(uint64_t id, const Tensor& tn) const {
  return SsdTensor{id, tn.n_blocks, tn.block_bytes, tn.slices, tn.cost_s, tn.reads, tn.checksums};
}

void Tiers::Pin(uint64_t id, Tensor& tn) {
  by_priority_.erase({tn.priority, id});
  replicas_evictable_.erase({tn.priority, id});
}

void Tiers::Unpin(uint64_t id, Tensor& tn) {
  if (tn.ready && tn.in_mem && tn.leases == 0) (tn.replica ? replicas_evictable_ : by_priority_).insert({tn.priority, id});
}

void Tiers::SetPriority(uint64_t id, Tensor& tn, double p) {
  Pin(id, tn);
  tn.priority = p;
  Unpin(id, tn);
}

Tensor* Tiers::AddInMemory(uint64_t id, uint64_t bytes) {
  const auto off = Allocate(bytes);
  if (!off) return nullptr;
  Tensor& tn = tensors_[id];
  tn.offset = *off;
  tn.bytes = bytes;
  tn.in_mem = true;
  tn.leases = 1;  // pinned while its bytes land
  return &tn;
}

Tensor* Tiers::AddReplica(uint64_t id, uint64_t bytes, uint64_t budget, uint64_t owner, uint64_t tensor) {
  if (bytes > budget) return nullptr;
  // Within the replicas' share, and only at the expense of other replicas: a copy never
  // pushes out a tensor this node owns.
  std::optional<uint64_t> off;
  for (;;) {
    if (replica_bytes_ + bytes <= budget && (off = arena_.Take(bytes))) break;
    if (replicas_evictable_.empty()) return nullptr;
    const uint64_t victim = replicas_evictable_.begin()->second;
    clock_ = std::max(clock_, replicas_evictable_.begin()->first);
    Drop(victim);
    ++c_.replicas_dropped;
  }
  Tensor& tn = tensors_[id];
  tn.offset = *off;
  tn.bytes = bytes;
  tn.in_mem = true;
  tn.leases = 1;  // pinned while the copy lands
  tn.replica = true;
  tn.origin_owner = owner;
  tn.origin_tensor = tensor;
  replica_bytes_ += bytes;
  replica_of_[{owner, tensor}] = id;
  return &tn;
}

void Tiers::RestoreFromSsd() {
  if (!ssd_) return;
  for (const auto& [id, m] : ssd_->restored()) {
    Tensor& tn = tensors_[id];
    tn.bytes = m.bytes();
    tn.n_blocks = m.n_blocks;
    tn.block_bytes = m.block_bytes;
    tn.slices = m.slices;
    tn.checksums = m.checksums;
    tn.cost_s = m.cost_s;
    tn.reads = std::max<uint64_t>(m.reads, 1);
    tn.ready = true;
    tn.on_ssd = true;
    tn.priority = Gdsf(tn);
    ssd_only_.insert({tn.priority, id});
  }
}

void Tiers::MarkReady(uint64_t id, Tensor& tn) {
  tn.leases = 0;
  tn.ready = true;
  SetPriority(id, tn, Gdsf(tn));
}

void Tiers::Lease(uint64_t id, Tensor& tn) {
  ++tn.reads;
  if (tn.leases++ == 0) Pin(id, tn);
  tn.priority = Gdsf(tn);
}

void Tiers::EndLease(uint64_t id, Tensor& tn) {
  if (tn.leases > 0 && --tn.leases == 0) Unpin(id, tn);
}

std::optional<uint64_t> Tiers::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > arena_.capacity()) return std::nullopt;
  for (;;) {
    if (auto off = arena_.Take(bytes)) return off;
    if (!EvictOne()) return std::nullopt;
  }
}

bool Tiers::EvictOne() {
  if (!replicas_evictable_.empty()) {  // replicas go first: they can be fetched again
    const auto [p, id] = *replicas_evictable_.begin();
    clock_ = std::max(clock_, p);
    const uint64_t bytes = tensors_[id].bytes;
    Drop(id);
    ++c_.evictions;
    ++c_.replicas_dropped;
    c_.evicted_bytes += bytes;
    return true;
  }
  if (by_priority_.empty()) return false;
  const auto [p, id] = *by_priority_.begin();
  by_priority_.erase(by_priority_.begin());
  clock_ = std::max(clock_, p);  // GDSF: the clock rises to each evicted priority
  Tensor& tn = tensors_[id];
  const uint64_t bytes = tn.bytes;
  // An owned tensor leaving memory goes to the SSD tier rather than away, unless the
  // tier is full of tensors of higher priority (one priority orders both tiers).
  if (ssd_ && !tn.on_ssd && MakeSsdRoom(tn.bytes, tn.priority)) {
    const Status w = ssd_->Write(SsdMeta(id, tn), At(tn));
    if (w.ok()) {
      tn.on_ssd = true;
      ++c_.ssd_flushes;
    } else {
      TRELLIS_LOG_WARN("store: flushing tensor {} to SSD: {}", id, w.ToString());
    }
  }
  if (tn.on_ssd) {
    arena_.Free(tn.offset, tn.bytes);
    tn.in_mem = false;
    ssd_only_.insert({tn.priority, id});
  } else {
    Drop(id);
  }
  ++c_.evictions;
  c_.evicted_bytes += bytes;
  return true;
}

// Frees SSD space for `bytes` by dropping SSD-only tensors of priority below `below`.
bool Tiers::MakeSsdRoom(uint64_t bytes, double below) {
  if (bytes > ssd_->capacity()) return false;
  while (ssd_->used() + bytes > ssd_->capacity()) {
    if (ssd_only_.empty() || ssd_only_.begin()->first > below) return false;
    const uint64_t victim = ssd_only_.begin()->second;
    clock_ = std::max(clock_, ssd_only_.begin()->first);
    Drop(victim);
    ++c_.ssd_evictions;
  }
  return true;
}

Status Tiers::LoadFromSsd(uint64_t id, Tensor& tn) {
  ssd_only_.erase({tn.priority, id});  // not a victim while it is being brought back
  const auto off = Allocate(tn.bytes);
  if (!off) {
    ssd_only_.insert({tn.priority, id});
    return ResourceExhausted("no memory to bring a tensor back from SSD");
  }
  const Status r = ssd_->Read(SsdMeta(id, tn), arena_.data() + *off);
  if (!r.ok()) {
    arena_.Free(*off, tn.bytes);
    if (r.code() == StatusCode::kCorrupt) ++c_.ssd_checksum_failures;
    tn.on_ssd = ssd_->Has(id);
    Drop(id);
    return r;
  }
  tn.offset = *off;
  tn.in_mem = true;
  ++c_.ssd_reads;
  return Status::Ok();
}

void Tiers::Drop(uint64_t id) {
  auto it = tensors_.find(id);
  if (it == tensors_.end()) return;
  Tensor& tn = it->second;
  Pin(id, tn);
  ssd_only_.erase({tn.priority, id});
  if (tn.replica) {
    replica_of_.erase({tn.origin_owner, tn.origin_tensor});
    replica_bytes_ -= tn.bytes;
  }
  if (tn.in_mem) arena_.Free(tn.offset, tn.bytes);
  if (tn.on_ssd && ssd_) ssd_->Remove(id);
  tensors_.erase(it);
  if (on_drop_) on_drop_(id);
}

void Tiers::FlushAllToSsd() {
  if (!ssd_) return;
  std::vector<std::pair<double, uint64_t>> order;
  for (auto& [id, tn] : tensors_) {
    if (tn.ready && tn.in_mem && !tn.on_ssd && !tn.replica) order.emplace_back(tn.priority, id);
  }
  std::sort(order.rbegin(), order.rend());
  for (auto [p, id] : order) {
    Tensor& tn = tensors_[id];
    if (!MakeSsdRoom(tn.bytes, p)) continue;
    if (ssd_->Write(SsdMeta(id, tn), At(tn)).ok()) tn.on_ssd = true;
  }
}

}  // namespace trellis::store

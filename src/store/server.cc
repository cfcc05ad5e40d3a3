#include "store/server.h"

#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <condition_variable>
#include <thread>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "net/wire.h"
#include "store/keys.h"
#include "store/etcd.h"
#include "store/protocol.h"
#include "store/ssd.h"
#include "util/checksum.h"
#include "util/log.h"

namespace trellis::store {

using net::ConnId;
using net::WireReader;
using net::WireWriter;

uint64_t NodeId(const std::string& address) { return XXH3_64bits(address.data(), address.size()); }

namespace {

Key ReadKey(WireReader& r) {
  Key k;
  k.lo = r.U64();
  k.hi = r.U64();
  return k;
}

struct Tensor {
  uint64_t offset = 0, bytes = 0;
  uint32_t n_blocks = 0;
  uint64_t block_bytes = 0;
  uint32_t slices = 1;              // checksummed parts of each block
  std::vector<uint64_t> checksums;  // n_blocks x slices, block-major
  double cost_s = 0;                // recompute time the tensor saves
  uint64_t reads = 1;
  double priority = 0;
  uint32_t leases = 0;
  bool ready = false;   // bytes landed and checked
  bool in_mem = false;  // at `offset` in the arena
  bool on_ssd = false;  // in the SSD tier (a tensor read back keeps its file)
  bool replica = false;  // a copy of (origin_owner, origin_tensor), held for local readers
  uint64_t origin_owner = 0, origin_tensor = 0;
};

struct Peer {
  std::string address;
  net::ConnId conn = 0;
  net::RemoteRegion region;
  bool ready = false;
};

struct Lease {
  std::vector<uint64_t> tensors;
  uint64_t timer = 0;
};

struct IndexEntry {
  uint64_t owner = 0, tensor = 0;
  uint32_t index = 0;
};

}  // namespace

struct StoreServer::Impl {
  ServerOptions opt;
  uint64_t node = 0;
  uint16_t port = 0;
  uint8_t* arena = nullptr;
  net::Registration reg;

  std::map<uint64_t, uint64_t> free_list;  // offset -> length
  std::unordered_map<uint64_t, Tensor> tensors;
  std::set<std::pair<double, uint64_t>> by_priority;  // (priority, tensor) in memory, evictable
  std::set<std::pair<double, uint64_t>> ssd_only;     // (priority, tensor) on SSD, not in memory
  std::set<std::pair<double, uint64_t>> replicas_evictable;  // (priority, tensor): replicas go first
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> replica_of;  // (owner, tensor) -> local replica id
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> remote_reads;  // reads asked here of tensors held elsewhere
  std::set<std::pair<uint64_t, uint64_t>> replicating;              // copies in flight
  uint64_t replica_bytes = 0;
  std::map<uint64_t, Peer> peers;  // node id -> peer store server
  std::unique_ptr<SsdTier> ssd;
  double clock = 0;
  uint64_t next_tensor = 1;
  std::unordered_map<uint64_t, Lease> leases;
  uint64_t next_lease = 1;

  std::unordered_map<Key, IndexEntry, KeyHash> index;
  // Single-flight: keys a client is computing now (kLookupClaim), until committed or
  // expired.
  struct Claim {
    uint64_t client;
    net::Clock::time_point until;
  };
  std::unordered_map<Key, Claim, KeyHash> claims;
  void SweepClaims(net::Clock::time_point now) {
    std::erase_if(claims, [now](const auto& kv) { return kv.second.until <= now; });
  }
  std::map<std::pair<uint64_t, uint64_t>, std::vector<Key>> keys_of;  // (owner, tensor) -> its keys here

  mutable std::mutex stats_mu;
  ServerStats st;

  // etcd membership: a thread renews this server's lease and polls the members.
  std::optional<Etcd> etcd;
  std::string advertised;
  std::thread etcd_thread;
  std::mutex etcd_mu;
  std::condition_variable etcd_cv;
  bool etcd_stop = false;
  int64_t lease = 0;
  bool etcd_reachable = true;  // the last keep-alive or registration worked (etcd_thread only)

  std::unique_ptr<net::Transport> t;  // last: destroyed (loop joined) before the state above

  void EtcdLoop();
  void ApplyPeers(const std::vector<std::string>& live) {  // loop thread
    std::set<uint64_t> now;
    for (const std::string& a : live) {
      const uint64_t id = NodeId(a);
      if (id == node) continue;
      now.insert(id);
      if (!peers.count(id)) peers[id].address = a;
    }
    for (auto it = peers.begin(); it != peers.end();) {
      it = now.count(it->first) ? std::next(it) : peers.erase(it);
    }
  }

  ~Impl() {
    if (etcd_thread.joinable()) {
      {
        std::lock_guard<std::mutex> lock(etcd_mu);
        etcd_stop = true;
      }
      etcd_cv.notify_all();
      etcd_thread.join();
      if (lease) (void)etcd->Revoke(lease);  // leave the membership at once, not after the TTL
    }
    // Stopped before it is destroyed: a handler still running on the loop reaches the
    // transport through `t`, which reset() would clear first.
    if (t) t->Stop();
    t.reset();  // the loop has stopped: the state is this thread's now
    FlushAllToSsd();
    if (arena) munmap(arena, opt.mem_bytes);
  }
  // A clean stop writes what is only in memory to the SSD tier, highest priority first,
  // so a restart with the same --ssd-dir serves it.
  void FlushAllToSsd() {
    if (!ssd) return;
    std::vector<std::pair<double, uint64_t>> order;
    for (auto& [id, tn] : tensors) {
      if (tn.ready && tn.in_mem && !tn.on_ssd && !tn.replica) order.emplace_back(tn.priority, id);
    }
    std::sort(order.rbegin(), order.rend());
    for (auto [p, id] : order) {
      Tensor& tn = tensors[id];
      if (!MakeSsdRoom(tn.bytes, p)) continue;
      if (ssd->Write(SsdMeta(id, tn), arena + tn.offset).ok()) tn.on_ssd = true;
    }
  }

  void Handle(ConnId c, uint16_t type, uint64_t rid, std::string_view body);
  void Refuse(ConnId c, uint64_t rid, const char* what) {
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      ++st.refused_requests;
    }
    t->ReplyError(c, rid, InvalidArgument(std::string("malformed ") + what + " request"));
  }

  // --- memory ---
  std::optional<uint64_t> TakeHole(uint64_t bytes);
  std::optional<uint64_t> Allocate(uint64_t bytes);
  void FreeRange(uint64_t off, uint64_t len);
  bool EvictOne();
  // Evictable: ready, in memory and not leased; replicas and owned tensors in their own
  // sets, since replicas are evicted first.
  void Pin(uint64_t id, Tensor& tn) {
    by_priority.erase({tn.priority, id});
    replicas_evictable.erase({tn.priority, id});
  }
  void Unpin(uint64_t id, Tensor& tn) {
    if (tn.ready && tn.in_mem && tn.leases == 0) (tn.replica ? replicas_evictable : by_priority).insert({tn.priority, id});
  }
  void SetPriority(uint64_t id, Tensor& tn, double p) {
    Pin(id, tn);
    tn.priority = p;
    Unpin(id, tn);
  }
  void NoteRemoteRead(uint64_t owner, uint64_t tensor);
  void Replicate(uint64_t owner, uint64_t tensor);
  void WithPeer(uint64_t node, std::function<void(Peer*)> then);
  std::optional<uint64_t> AllocateReplica(uint64_t bytes);
  bool MakeSsdRoom(uint64_t bytes, double below);
  Status LoadFromSsd(uint64_t id, Tensor& tn);
  SsdTensor SsdMeta(uint64_t id, const Tensor& tn) const {
    return SsdTensor{id, tn.n_blocks, tn.block_bytes, tn.slices, tn.cost_s, tn.reads, tn.checksums};
  }
  double Gdsf(const Tensor& tn) const {
    return clock + static_cast<double>(tn.reads) * std::max(tn.cost_s, 1e-6) / static_cast<double>(std::max<uint64_t>(tn.bytes, 1));
  }
  void DropTensor(uint64_t id);
  void ForgetLocal(uint64_t owner, uint64_t tensor);

  void OnHello(ConnId c, uint64_t rid);
  void OnLookup(ConnId c, uint64_t rid, WireReader& r, bool claim);
  void OnPutData(ConnId c, uint64_t rid, WireReader& r);
  void OnPutCommit(ConnId c, uint64_t rid, WireReader& r);
  void OnAcquire(ConnId c, uint64_t rid, WireReader& r);
  void OnRelease(ConnId c, uint64_t rid, WireReader& r);
  void OnForget(ConnId c, uint64_t rid, WireReader& r);
  void EndLease(uint64_t lease, bool expired);
  void UpdateGauges() {
    std::lock_guard<std::mutex> lock(stats_mu);
    st.index_keys = index.size();
    st.peers = peers.size();
    st.leases_active = leases.size();
    const auto now = net::Clock::now();
    st.claims_active = static_cast<uint64_t>(
        std::count_if(claims.begin(), claims.end(), [now](const auto& kv) { return kv.second.until > now; }));
    uint64_t used = 0, on_ssd = 0, in_mem = 0, replicas = 0;
    for (auto& [id, tn] : tensors) {
      used += tn.in_mem ? tn.bytes : 0;
      in_mem += tn.in_mem && !tn.replica;
      on_ssd += tn.on_ssd;
      replicas += tn.replica;
    }
    st.tensors = in_mem;
    st.replicas = replicas;
    st.replica_bytes = replica_bytes;
    st.bytes_used = used;
    st.ssd_tensors = on_ssd;
    st.ssd_bytes_used = ssd ? ssd->used() : 0;
    st.ssd_bytes_capacity = ssd ? ssd->capacity() : 0;
    st.ssd_log_compactions = ssd ? ssd->log_compactions() : 0;
    st.ssd_write_failures = ssd ? ssd->write_failures() : 0;
    st.ssd_read_failures = ssd ? ssd->read_failures() : 0;
    st.ssd_log_write_failures = ssd ? ssd->log_write_failures() : 0;
  }
};

// First fit in the free list, without evicting anything.
std::optional<uint64_t> StoreServer::Impl::TakeHole(uint64_t bytes) {
  for (auto it = free_list.begin(); it != free_list.end(); ++it) {
    if (it->second >= bytes) {
      const uint64_t off = it->first, len = it->second;
      free_list.erase(it);
      if (len > bytes) free_list[off + bytes] = len - bytes;
      return off;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> StoreServer::Impl::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > opt.mem_bytes) return std::nullopt;
  for (;;) {
    if (auto off = TakeHole(bytes)) return off;
    if (!EvictOne()) return std::nullopt;
  }
}

void StoreServer::Impl::FreeRange(uint64_t off, uint64_t len) {
  auto it = free_list.emplace(off, len).first;
  if (auto next = std::next(it); next != free_list.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_list.erase(next);
  }
  if (it != free_list.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_list.erase(it);
    }
  }
}

bool StoreServer::Impl::EvictOne() {
  if (!replicas_evictable.empty()) {  // replicas go first: they can be fetched again
    const auto [p, id] = *replicas_evictable.begin();
    clock = std::max(clock, p);
    const uint64_t bytes = tensors[id].bytes;
    DropTensor(id);
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.evictions;
    ++st.replicas_dropped;
    st.evicted_bytes += bytes;
    return true;
  }
  if (by_priority.empty()) return false;
  const auto [p, id] = *by_priority.begin();
  by_priority.erase(by_priority.begin());
  clock = std::max(clock, p);  // GDSF: the clock rises to each evicted priority
  Tensor& tn = tensors[id];
  const uint64_t bytes = tn.bytes;
  // An owned tensor leaving memory goes to the SSD tier rather than away, unless the
  // tier is full of tensors of higher priority (one priority orders both tiers).
  if (ssd && !tn.on_ssd && MakeSsdRoom(tn.bytes, tn.priority)) {
    const Status w = ssd->Write(SsdMeta(id, tn), arena + tn.offset);
    if (w.ok()) {
      tn.on_ssd = true;
      std::lock_guard<std::mutex> lock(stats_mu);
      ++st.ssd_flushes;
    } else {
      TRELLIS_LOG_WARN("store: flushing tensor {} to SSD: {}", id, w.ToString());
    }
  }
  if (tn.on_ssd) {
    FreeRange(tn.offset, tn.bytes);
    tn.in_mem = false;
    ssd_only.insert({tn.priority, id});
  } else {
    DropTensor(id);
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  ++st.evictions;
  st.evicted_bytes += bytes;
  return true;
}

// Frees SSD space for `bytes` by dropping SSD-only tensors of priority below `below`.
bool StoreServer::Impl::MakeSsdRoom(uint64_t bytes, double below) {
  if (bytes > ssd->capacity()) return false;
  while (ssd->used() + bytes > ssd->capacity()) {
    if (ssd_only.empty() || ssd_only.begin()->first > below) return false;
    const uint64_t victim = ssd_only.begin()->second;
    clock = std::max(clock, ssd_only.begin()->first);
    DropTensor(victim);
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.ssd_evictions;
  }
  return true;
}

Status StoreServer::Impl::LoadFromSsd(uint64_t id, Tensor& tn) {
  ssd_only.erase({tn.priority, id});  // not a victim while it is being brought back
  const auto off = Allocate(tn.bytes);
  if (!off) {
    ssd_only.insert({tn.priority, id});
    return ResourceExhausted("no memory to bring a tensor back from SSD");
  }
  const Status r = ssd->Read(SsdMeta(id, tn), arena + *off);
  if (!r.ok()) {
    FreeRange(*off, tn.bytes);
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      if (r.code() == StatusCode::kCorrupt) ++st.ssd_checksum_failures;
    }
    tn.on_ssd = ssd->Has(id);
    DropTensor(id);
    return r;
  }
  tn.offset = *off;
  tn.in_mem = true;
  std::lock_guard<std::mutex> lock(stats_mu);
  ++st.ssd_reads;
  return Status::Ok();
}

void StoreServer::Impl::DropTensor(uint64_t id) {
  auto it = tensors.find(id);
  if (it == tensors.end()) return;
  Tensor& tn = it->second;
  Pin(id, tn);
  ssd_only.erase({tn.priority, id});
  if (tn.replica) {
    replica_of.erase({tn.origin_owner, tn.origin_tensor});
    replica_bytes -= tn.bytes;
  }
  if (tn.in_mem) FreeRange(tn.offset, tn.bytes);
  if (tn.on_ssd && ssd) ssd->Remove(id);
  tensors.erase(it);
  ForgetLocal(node, id);  // index entries kept here; other indexes learn lazily (kForget)
}

void StoreServer::Impl::ForgetLocal(uint64_t owner, uint64_t tensor) {
  auto it = keys_of.find({owner, tensor});
  if (it == keys_of.end()) return;
  uint64_t n = 0;
  for (const Key& k : it->second) {
    auto e = index.find(k);
    if (e != index.end() && e->second.owner == owner && e->second.tensor == tensor) {
      index.erase(e);
      ++n;
    }
  }
  keys_of.erase(it);
  if (ssd && n > 0) ssd->LogForget(owner, tensor);
  std::lock_guard<std::mutex> lock(stats_mu);
  st.forgotten += n;
}

void StoreServer::Impl::Handle(ConnId c, uint16_t type, uint64_t rid, std::string_view body) {
  WireReader r(body);
  switch (type) {
    case kHello: return OnHello(c, rid);
    case kLookup: return OnLookup(c, rid, r, false);
    case kLookupClaim: return OnLookup(c, rid, r, true);
    case kPutData: return OnPutData(c, rid, r);
    case kPutCommit: return OnPutCommit(c, rid, r);
    case kAcquire: return OnAcquire(c, rid, r);
    case kRelease: return OnRelease(c, rid, r);
    case kForget: return OnForget(c, rid, r);
    case kUnclaim: {
      const uint64_t client = r.U64();
      const uint32_t n = r.Count(kMaxKeys, 16);
      std::vector<Key> keys(r.ok() ? n : 0);
      for (Key& k : keys) k = ReadKey(r);
      if (!r.Done()) return Refuse(c, rid, "unclaim");
      uint32_t released = 0;
      for (const Key& k : keys) {
        auto it = claims.find(k);
        if (it != claims.end() && it->second.client == client) {
          claims.erase(it);
          ++released;
        }
      }
      WireWriter w;
      w.U32(released);
      return t->Reply(c, rid, w.Take());
    }
    case kMembers: {
      WireWriter w;
      w.U32(static_cast<uint32_t>(1 + peers.size()));
      w.Str(advertised);
      for (const auto& [id, p] : peers) w.Str(p.address);
      return t->Reply(c, rid, w.Take());
    }
    case kStats: {
      UpdateGauges();
      return t->Reply(c, rid, "");  // the text is served by MetricsText; the call proves liveness
    }
    default: return t->ReplyError(c, rid, Unsupported("unknown store message type " + std::to_string(type)));
  }
}

void StoreServer::Impl::EtcdLoop() {
  const auto period = std::chrono::milliseconds(std::max(200, opt.etcd_ttl_s * 1000 / 3));
  std::unique_lock<std::mutex> lock(etcd_mu);
  while (!etcd_cv.wait_for(lock, period, [this] { return etcd_stop; })) {
    lock.unlock();
    Status s = lease ? etcd->KeepAlive(lease) : NotFound("no lease");
    if (!s.ok()) {  // expired (etcd restarted, or we were cut off too long): register again
      auto l = etcd->Register(advertised, opt.etcd_ttl_s);
      if (l.ok()) lease = *l;
      s = l.status();
    }
    // Said once when etcd goes away and once when it is back, not three times a second.
    if (!s.ok() && etcd_reachable) TRELLIS_LOG_WARN("store: etcd: {}; serving on, the last membership kept", s.ToString());
    if (s.ok() && !etcd_reachable) TRELLIS_LOG_INFO("store: etcd is back; registered as {}", advertised);
    etcd_reachable = s.ok();
    if (auto live = etcd->Members(); live.ok()) t->Post([this, v = *live] { ApplyPeers(v); });
    lock.lock();
  }
}

void StoreServer::Impl::OnHello(ConnId c, uint64_t rid) {
  WireWriter w;
  w.U64(node);
  w.U64(reg.base);
  w.U64(reg.length);
  w.Str(reg.rkey);
  w.U32(kProtocolVersion);
  t->Reply(c, rid, w.Take());
}

void StoreServer::Impl::OnLookup(ConnId c, uint64_t rid, WireReader& r, bool claim) {
  uint32_t ttl_ms = 0;
  uint64_t client = 0;
  if (claim) {
    ttl_ms = std::min(r.U32(), kMaxClaimMs);
    client = r.U64();
  }
  const uint32_t n = r.Count(kMaxKeys, 16);
  std::vector<Key> rest;  // the keys past the stored prefix (claims)
  struct Run {
    uint64_t owner, tensor;
    uint32_t first, count;
  };
  std::vector<Run> runs;
  uint32_t matched = 0;
  bool walking = true;
  for (uint32_t i = 0; i < n; ++i) {
    const Key k = ReadKey(r);
    if (!walking) {
      if (claim) rest.push_back(k);
      continue;
    }
    auto it = index.find(k);
    if (it == index.end()) {
      walking = false;
      if (claim) rest.push_back(k);
      continue;
    }
    const IndexEntry& e = it->second;
    if (!runs.empty() && runs.back().owner == e.owner && runs.back().tensor == e.tensor &&
        runs.back().first + runs.back().count == e.index) {
      ++runs.back().count;
    } else {
      runs.push_back({e.owner, e.tensor, e.index, 1});
    }
    ++matched;
  }
  if (!r.Done()) return Refuse(c, rid, "lookup");
  WireWriter w;
  w.U32(matched);
  w.U32(static_cast<uint32_t>(runs.size()));
  for (const Run& x : runs) {
    w.U64(x.owner);
    w.U64(x.tensor);
    w.U32(x.first);
    w.U32(x.count);
  }
  if (claim) {
    // Single-flight: keys someone else is computing, then keys this client takes.
    const auto now = net::Clock::now();
    uint32_t pending = 0, claimed = 0;
    int64_t pending_ms = 0;
    size_t i = 0;
    for (; i < rest.size(); ++i) {
      auto it = claims.find(rest[i]);
      if (it == claims.end() || it->second.until <= now || it->second.client == client) break;
      pending_ms = std::max<int64_t>(pending_ms, std::chrono::duration_cast<std::chrono::milliseconds>(it->second.until - now).count());
      ++pending;
    }
    if (claims.size() + (rest.size() - i) > kMaxClaims) SweepClaims(now);
    for (; i < rest.size() && ttl_ms > 0 && claims.size() < kMaxClaims; ++i) {
      auto it = claims.find(rest[i]);
      if (it != claims.end() && it->second.until > now && it->second.client != client) break;
      claims[rest[i]] = Claim{client, now + std::chrono::milliseconds(ttl_ms)};
      ++claimed;
    }
    w.U32(pending);
    w.U32(static_cast<uint32_t>(pending_ms));
    w.U32(claimed);
    std::lock_guard<std::mutex> lock(stats_mu);
    st.claims += claimed;
    st.claim_waits += pending > 0;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.lookups;
    st.lookup_blocks_matched += matched;
  }
  t->Reply(c, rid, w.Take());
}

void StoreServer::Impl::OnPutData(ConnId c, uint64_t rid, WireReader& r) {
  const uint32_t n = r.Count(kMaxKeys, 16);
  std::vector<Key> keys(n);
  for (Key& k : keys) k = ReadKey(r);
  r.U32();  // first: the chain index of keys[0] (kept by the index, not needed here)
  const uint64_t block_bytes = r.U64();
  const uint32_t slices = r.U32();
  const double cost_s = r.F64();
  net::RemoteRegion src;
  src.base = r.U64();
  src.length = r.U64();
  src.rkey = std::string(r.Str(kMaxRkeyBytes));
  const uint32_t nseg = r.Count(kMaxSegments, 16);
  std::vector<std::pair<uint64_t, uint64_t>> segs(nseg);
  uint64_t total = 0;
  bool sane = true;
  for (auto& [addr, len] : segs) {
    addr = r.U64();
    len = r.U64();
    if (len == 0 || len > opt.mem_bytes) sane = false;
    total += sane ? len : 0;
  }
  const uint32_t nsums = r.Count(kMaxChecksums, 8);
  std::vector<uint64_t> writer_sums(nsums);
  for (uint64_t& x : writer_sums) x = r.U64();
  if (!r.Done() || nsums != uint64_t{n} * slices || n == 0 || !sane || block_bytes == 0 || !ValidSlices(block_bytes, slices) || uint64_t{n} * slices > kMaxChecksums || !(cost_s >= 0 && cost_s < 1e9) ||
      block_bytes > opt.mem_bytes / n || total != block_bytes * n) {
    return Refuse(c, rid, "put");
  }
  const auto off = Allocate(total);
  if (!off) {
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      ++st.full_refusals;
    }
    return t->ReplyError(c, rid, ResourceExhausted(fmt::format("store full: {} bytes do not fit in {} (all leased or larger than memory)", total, opt.mem_bytes)));
  }
  const uint64_t id = next_tensor++;
  Tensor& tn = tensors[id];
  tn.offset = *off;
  tn.in_mem = true;
  tn.bytes = total;
  tn.n_blocks = n;
  tn.block_bytes = block_bytes;
  tn.slices = slices;
  tn.cost_s = cost_s;
  tn.leases = 1;  // pinned while its bytes land
  tn.checksums = std::move(writer_sums);
  std::vector<net::Segment> gets;
  uint64_t at = *off;
  for (auto& [addr, len] : segs) {
    gets.push_back({addr, arena + at, len});
    at += len;
  }
  // The client's memory is read straight into the tensor's place in the arena.
  t->Get(c, src, std::move(gets), net::After(std::chrono::milliseconds(opt.max_lease_ms)), [this, c, rid, id](Status s) {
    auto it = tensors.find(id);
    if (it == tensors.end()) return;
    Tensor& tn = it->second;
    tn.leases = 0;
    if (!s.ok()) {
      DropTensor(id);
      {
        std::lock_guard<std::mutex> lock(stats_mu);
        ++st.put_failures;
      }
      return t->ReplyError(c, rid, s.WithContext("reading the put's bytes from the client"));
    }
    // The bytes as they landed, against the writer's checksums: what is indexed and later
    // served as verified is what the writer had.
    std::vector<uint64_t> landed(tn.slices);
    for (uint32_t b = 0; b < tn.n_blocks; ++b) {
      SliceChecksums(arena + tn.offset + b * tn.block_bytes, tn.block_bytes, tn.slices, landed.data());
      if (!std::equal(landed.begin(), landed.end(), tn.checksums.begin() + static_cast<ptrdiff_t>(size_t{b} * tn.slices))) {
        DropTensor(id);
        {
          std::lock_guard<std::mutex> lock(stats_mu);
          ++st.put_failures;
          ++st.put_checksum_failures;
        }
        return t->ReplyError(c, rid, Corrupt(fmt::format("the put's block {} landed with other bytes than the writer "
                                                          "checksummed (changed on the way); not stored", b)));
      }
    }
    tn.ready = true;
    SetPriority(id, tn, Gdsf(tn));
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      ++st.puts;
      st.put_bytes += tn.bytes;
    }
    WireWriter w;
    w.U64(id);
    t->Reply(c, rid, w.Take());
  });
}

void StoreServer::Impl::OnPutCommit(ConnId c, uint64_t rid, WireReader& r) {
  const uint64_t owner = r.U64();
  const uint64_t tensor = r.U64();
  const uint32_t n = r.Count(kMaxKeys, 16);
  std::vector<Key> keys(n);
  for (Key& k : keys) k = ReadKey(r);
  if (!r.Done()) return Refuse(c, rid, "commit");
  // A tensor of this node that is gone already (evicted before the commit) is not indexed.
  if (owner == node && !tensors.count(tensor)) {
    return t->ReplyError(c, rid, NotFound("tensor " + std::to_string(tensor) + " is no longer stored"));
  }
  uint32_t stored = 0;
  auto& mine = keys_of[{owner, tensor}];
  for (uint32_t i = 0; i < n; ++i) {
    claims.erase(keys[i]);  // computed: nobody waits on a claim of it any more
    if (index.emplace(keys[i], IndexEntry{owner, tensor, i}).second) {  // first writer wins
      mine.push_back(keys[i]);
      ++stored;
      if (ssd) ssd->LogAdd(IndexRecord{keys[i], owner, tensor, i});
    }
  }
  if (mine.empty()) keys_of.erase({owner, tensor});
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.commits;
  }
  WireWriter w;
  w.U32(stored);
  t->Reply(c, rid, w.Take());
}

void StoreServer::Impl::OnAcquire(ConnId c, uint64_t rid, WireReader& r) {
  const uint32_t lease_ms = r.U32();
  const uint32_t n = r.Count(kMaxKeys, 24);
  struct Want {
    uint64_t owner, tensor;
    uint32_t first, count;
  };
  std::vector<Want> want(n);
  for (Want& x : want) {
    x.owner = r.U64();
    x.tensor = r.U64();
    x.first = r.U32();
    x.count = r.U32();
  }
  if (!r.Done() || lease_ms == 0) return Refuse(c, rid, "acquire");
  const uint64_t lease = next_lease++;
  Lease& L = leases[lease];
  WireWriter w;
  w.U64(lease);
  w.U32(n);
  uint64_t hits = 0, misses = 0, replica_hits = 0;
  for (const Want& x : want) {
    // This node's own tensor, or its replica of another node's.
    uint64_t id = x.tensor;
    if (x.owner != node) {
      auto rp = replica_of.find({x.owner, x.tensor});
      id = rp == replica_of.end() ? 0 : rp->second;
      if (id == 0) NoteRemoteRead(x.owner, x.tensor);
    }
    auto it = id ? tensors.find(id) : tensors.end();
    // Every range is checked against the tensor before its address is handed out: UCX
    // would serve any address of the arena. count 0: to the tensor's end.
    bool ok = it != tensors.end() && it->second.ready && x.first < it->second.n_blocks &&
              x.count <= it->second.n_blocks - x.first;
    uint8_t tier = 0;  // 0 memory, 1 replica, 2 read back from SSD
    if (ok && it->second.replica) tier = 1;
    // A tensor on SSD only is read back into memory first (its file checked again).
    if (ok && !it->second.in_mem) {
      tier = 2;
      const Status back = LoadFromSsd(id, it->second);
      if (!back.ok()) {
        TRELLIS_LOG_WARN("store: tensor {}: {}", id, back.ToString());
        ok = false;
      }
    }
    w.U8(ok ? 1 : 0);
    if (!ok) {
      ++misses;
      w.U8(0);
      w.U64(0);
      w.U32(0);
      w.U64(0);
      w.U32(0);
      continue;
    }
    Tensor& tn = it->second;
    const uint32_t count = x.count == 0 ? tn.n_blocks - x.first : x.count;
    w.U8(tier);
    w.U64(reg.base + tn.offset + x.first * tn.block_bytes);
    w.U32(count);
    w.U64(tn.block_bytes);
    w.U32(tn.slices);
    for (size_t k = size_t{x.first} * tn.slices; k < (size_t{x.first} + count) * tn.slices; ++k) w.U64(tn.checksums[k]);
    ++tn.reads;
    if (tn.leases++ == 0) Pin(id, tn);
    tn.priority = Gdsf(tn);
    L.tensors.push_back(id);
    ++hits;
    replica_hits += tier == 1;
  }
  const uint32_t ms = std::min(lease_ms, opt.max_lease_ms);
  L.timer = t->AddTimer(net::After(std::chrono::milliseconds(ms)), [this, lease] { EndLease(lease, true); });
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.acquires;
    st.acquire_hits += hits;
    st.acquire_misses += misses;
    st.replica_hits += replica_hits;
  }
  t->Reply(c, rid, w.Take());
}

// A local reader asked for a tensor that another node owns: count it, and copy the
// tensor here once its reads pass the threshold (and a peer link to its owner exists).
void StoreServer::Impl::NoteRemoteRead(uint64_t owner, uint64_t tensor) {
  if (opt.replica_share <= 0) return;
  if (remote_reads.size() >= 65536) remote_reads.clear();  // bounded: interest is re-learned
  const uint32_t reads = ++remote_reads[{owner, tensor}];
  // Counted even before the owner is a known peer (etcd may not have told us yet).
  if (reads >= opt.replica_after_reads && peers.count(owner) && !replicating.count({owner, tensor})) {
    Replicate(owner, tensor);
  }
}

void StoreServer::Impl::WithPeer(uint64_t node_id, std::function<void(Peer*)> then) {
  auto it = peers.find(node_id);
  if (it == peers.end()) return then(nullptr);
  Peer& p = it->second;
  if (p.ready && t->IsConnected(p.conn)) return then(&p);
  p.ready = false;
  const size_t colon = p.address.rfind(':');
  auto c = t->Connect(p.address.substr(0, colon), static_cast<uint16_t>(std::atoi(p.address.c_str() + colon + 1)));
  if (!c.ok()) return then(nullptr);
  p.conn = *c;
  t->Call(p.conn, kHello, "", net::After(std::chrono::milliseconds(2000)), [this, node_id, then](Result<std::string> r) {
    auto it = peers.find(node_id);
    if (!r.ok() || it == peers.end()) return then(nullptr);
    HelloReply h;
    if (!DecodeHello(*r, h) || h.node != node_id || h.version != kProtocolVersion) return then(nullptr);
    it->second.region = h.region;
    it->second.ready = true;
    then(&it->second);
  });
}

std::optional<uint64_t> StoreServer::Impl::AllocateReplica(uint64_t bytes) {
  const auto budget = static_cast<uint64_t>(opt.replica_share * static_cast<double>(opt.mem_bytes));
  if (bytes > budget) return std::nullopt;
  // Within the replicas' share, and only at the expense of other replicas: a copy never
  // pushes out a tensor this node owns.
  for (;;) {
    if (replica_bytes + bytes <= budget) {
      if (auto off = TakeHole(bytes)) return off;
    }
    if (replicas_evictable.empty()) return std::nullopt;
    const uint64_t victim = replicas_evictable.begin()->second;
    clock = std::max(clock, replicas_evictable.begin()->first);
    DropTensor(victim);
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.replicas_dropped;
  }
}

void StoreServer::Impl::Replicate(uint64_t owner, uint64_t tensor) {
  replicating.insert({owner, tensor});
  auto fail = [this, owner, tensor](const std::string& why) {
    replicating.erase({owner, tensor});
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.replication_failures;
    TRELLIS_LOG_DEBUG("store: no replica of {}/{}: {}", owner, tensor, why);
  };
  WithPeer(owner, [this, owner, tensor, fail](Peer* p) {
    if (!p) return fail("owner unreachable");
    WireWriter w;
    w.U32(opt.max_lease_ms);
    w.U32(1);
    w.U64(owner);
    w.U64(tensor);
    w.U32(0);
    w.U32(0);  // the whole tensor
    const net::ConnId conn = p->conn;
    const net::RemoteRegion region = p->region;
    t->Call(conn, kAcquire, w.Take(), net::After(std::chrono::milliseconds(5000)),
            [this, owner, tensor, fail, conn, region](Result<std::string> r) {
      if (!r.ok()) return fail(r.status().ToString());
      WireReader rd(*r);
      const uint64_t lease = rd.U64();
      const uint32_t n = rd.U32();
      const bool found = rd.U8() == 1;
      rd.U8();
      const uint64_t addr = rd.U64();
      const uint32_t count = rd.U32();
      const uint64_t block_bytes = rd.U64();
      const uint32_t slices = rd.U32();
      std::vector<uint64_t> sums;
      if (rd.ok() && found && count <= kMaxKeys && slices <= kMaxSlices && uint64_t{count} * slices <= rd.remaining() / 8) {
        sums.resize(size_t{count} * slices);
        for (uint64_t& x : sums) x = rd.U64();
      }
      auto release = [this, conn, lease] {
        if (!t->IsConnected(conn)) return;
        WireWriter rw;
        rw.U64(lease);
        t->Call(conn, kRelease, rw.Take(), net::After(std::chrono::milliseconds(2000)), [](Result<std::string>) {});
      };
      if (!rd.Done() || n != 1 || !found || count == 0 || block_bytes == 0 || block_bytes > opt.mem_bytes / count ||
          !ValidSlices(block_bytes, slices)) {
        release();
        return fail("owner no longer holds it");
      }
      const uint64_t bytes = count * block_bytes;
      const auto off = AllocateReplica(bytes);
      if (!off) {
        release();
        return fail("no room in the replicas' share");
      }
      const uint64_t id = next_tensor++;
      Tensor& tn = tensors[id];
      tn.offset = *off;
      tn.in_mem = true;
      tn.bytes = bytes;
      tn.n_blocks = count;
      tn.block_bytes = block_bytes;
      tn.slices = slices;
      tn.checksums = std::move(sums);
      tn.replica = true;
      tn.origin_owner = owner;
      tn.origin_tensor = tensor;
      tn.leases = 1;  // pinned while the copy lands
      replica_bytes += bytes;
      replica_of[{owner, tensor}] = id;
      t->Get(conn, region, {{addr, arena + *off, bytes}}, net::After(std::chrono::milliseconds(opt.max_lease_ms)),
             [this, id, owner, tensor, release, fail](Status s) {
        release();
        replicating.erase({owner, tensor});
        auto it = tensors.find(id);
        if (it == tensors.end()) return;
        Tensor& tn = it->second;
        tn.leases = 0;
        bool good = s.ok();
        std::vector<uint64_t> sums(tn.slices);
        for (uint32_t b = 0; good && b < tn.n_blocks; ++b) {
          SliceChecksums(arena + tn.offset + b * tn.block_bytes, tn.block_bytes, tn.slices, sums.data());
          good = std::equal(sums.begin(), sums.end(), tn.checksums.begin() + static_cast<ptrdiff_t>(size_t{b} * tn.slices));
        }
        if (!good) {
          DropTensor(id);
          return fail(s.ok() ? "a copied block failed its checksum" : s.ToString());
        }
        tn.ready = true;
        tn.reads = remote_reads[{owner, tensor}];
        remote_reads.erase({owner, tensor});
        tn.cost_s = 1.0;
        SetPriority(id, tn, Gdsf(tn));
        std::lock_guard<std::mutex> lock(stats_mu);
        ++st.replicas_made;
      });
    });
  });
}

void StoreServer::Impl::EndLease(uint64_t lease, bool expired) {
  auto it = leases.find(lease);
  if (it == leases.end()) return;
  for (uint64_t id : it->second.tensors) {
    auto tt = tensors.find(id);
    if (tt == tensors.end()) continue;
    Tensor& tn = tt->second;
    if (tn.leases > 0 && --tn.leases == 0) Unpin(id, tn);
  }
  if (!expired) t->CancelTimer(it->second.timer);
  leases.erase(it);
  if (expired) {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++st.lease_expiries;
  }
}

void StoreServer::Impl::OnRelease(ConnId c, uint64_t rid, WireReader& r) {
  const uint64_t lease = r.U64();
  if (!r.Done()) return Refuse(c, rid, "release");
  EndLease(lease, false);
  t->Reply(c, rid, "");
}

void StoreServer::Impl::OnForget(ConnId c, uint64_t rid, WireReader& r) {
  const uint32_t n = r.Count(kMaxKeys, 16);
  std::vector<std::pair<uint64_t, uint64_t>> gone(n);
  for (auto& [owner, tensor] : gone) {
    owner = r.U64();
    tensor = r.U64();
  }
  if (!r.Done()) return Refuse(c, rid, "forget");
  uint32_t dropped = 0;
  for (auto& [owner, tensor] : gone) {
    // Only a tensor this node cannot vouch for is forgotten: its own live tensors stay.
    if (owner == node && tensors.count(tensor)) continue;
    const size_t before = index.size();
    ForgetLocal(owner, tensor);
    dropped += static_cast<uint32_t>(before - index.size());
  }
  WireWriter w;
  w.U32(dropped);
  t->Reply(c, rid, w.Take());
}

// --- StoreServer ---

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;

Result<std::unique_ptr<StoreServer>> StoreServer::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  if (options.mem_bytes < 4096) return InvalidArgument("--mem must be at least 4K");
  void* p = mmap(nullptr, options.mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return ResourceExhausted(fmt::format("cannot map {} bytes for the store", options.mem_bytes));
  // Huge pages where the kernel offers them on request (THP "madvise" mode): a 90 MB
  // publish otherwise takes ~22k first-touch page faults on the loop thread. Advisory;
  // failure changes nothing but speed.
  madvise(p, options.mem_bytes, MADV_HUGEPAGE);
  impl->arena = static_cast<uint8_t*>(p);
  impl->free_list[0] = options.mem_bytes;
  // Tensor ids carry a random epoch: a restarted server never hands out an id that an
  // index elsewhere still maps to its previous life's data.
  impl->next_tensor = (static_cast<uint64_t>(std::random_device{}()) << 32) | 1;
  if (!options.ssd_dir.empty()) {
    if (options.ssd_bytes == 0) return InvalidArgument("--ssd-dir needs --ssd-size");
    TRELLIS_ASSIGN_OR_RETURN(impl->ssd, SsdTier::Open(options.ssd_dir, options.ssd_bytes, 4096,
                                                           options.ssd_env ? options.ssd_env : Env::Default()));
    // What the SSD held before a restart is served again, from SSD, after its check.
    for (const auto& [id, m] : impl->ssd->restored()) {
      Tensor& tn = impl->tensors[id];
      tn.bytes = m.bytes();
      tn.n_blocks = m.n_blocks;
      tn.block_bytes = m.block_bytes;
      tn.slices = m.slices;
      tn.checksums = m.checksums;
      tn.cost_s = m.cost_s;
      tn.reads = std::max<uint64_t>(m.reads, 1);
      tn.ready = true;
      tn.on_ssd = true;
      tn.priority = impl->Gdsf(tn);
      impl->ssd_only.insert({tn.priority, id});
    }
    impl->st.ssd_restored = impl->ssd->restored().size();
    impl->st.ssd_rejected = impl->ssd->files_rejected();
  }
  TRELLIS_ASSIGN_OR_RETURN(impl->t, net::Transport::Create(options.transport));
  Impl* raw = impl.get();
  Status s = raw->t->Sync([raw]() -> Status {
    auto r = raw->t->Register(raw->arena, raw->opt.mem_bytes);
    if (!r.ok()) return r.status();
    raw->reg = *r;
    raw->t->SetRequestHandler(
        [raw](ConnId c, uint16_t type, uint64_t rid, std::string_view body) { raw->Handle(c, type, rid, body); });
    auto port = raw->t->Listen(raw->opt.host, raw->opt.port);
    if (!port.ok()) return port.status();
    raw->port = *port;
    raw->advertised = raw->opt.advertise.empty() ? raw->opt.host + ":" + std::to_string(*port) : raw->opt.advertise;
    raw->node = NodeId(raw->advertised);
    return Status::Ok();
  });
  TRELLIS_RETURN_IF_ERROR(s);
  if (raw->ssd) {
    // The index as the log left it, less the entries of this server's own tensors that
    // did not survive (in memory only when it stopped, or a file that failed its check):
    // served, they would be hits that fail at the read.
    raw->t->Sync([raw] {
      std::set<std::pair<uint64_t, uint64_t>> gone;
      for (const IndexRecord& r : raw->ssd->LiveIndex()) {
        if (r.owner == raw->node && !raw->tensors.count(r.tensor)) {
          gone.insert({r.owner, r.tensor});
        } else if (raw->index.emplace(r.key, IndexEntry{r.owner, r.tensor, r.index}).second) {
          raw->keys_of[{r.owner, r.tensor}].push_back(r.key);
        }
      }
      for (const auto& [owner, tensor] : gone) raw->ssd->DropEntries(owner, tensor);
      std::lock_guard<std::mutex> lock(raw->stats_mu);
      raw->st.ssd_entries_dropped = gone.size();
      raw->st.ssd_log_records_skipped = raw->ssd->log_records_skipped();
      raw->st.ssd_temp_files_removed = raw->ssd->temp_files_removed();
    });
  }
  if (!(options.replica_share >= 0 && options.replica_share <= 1)) return InvalidArgument("--replica-share must be in [0, 1]");
  raw->t->Sync([raw] {
    for (const std::string& a : raw->opt.peers) {
      const uint64_t id = NodeId(a);
      if (id != raw->node && a.rfind(':') != std::string::npos) raw->peers[id].address = a;
    }
  });
  {
    std::lock_guard<std::mutex> lock(raw->stats_mu);
    raw->st.bytes_capacity = options.mem_bytes;
  }
  if (!options.etcd.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(Etcd e, Etcd::Parse(options.etcd));
    raw->etcd = e;
    if (raw->advertised.rfind("0.0.0.0:", 0) == 0) {
      return InvalidArgument("listening on 0.0.0.0: give the address others reach this server at (--advertise)");
    }
    // etcd down at start is not fatal: this server serves (peers from --peers or none),
    // and the membership thread registers it as soon as etcd answers. A store restarted
    // after a crash must come back even if etcd is down at that moment.
    auto lease = e.Register(raw->advertised, options.etcd_ttl_s);
    if (lease.ok()) {
      raw->lease = *lease;
    } else if (lease.status().code() == StatusCode::kUnavailable || lease.status().code() == StatusCode::kDeadlineExceeded) {
      TRELLIS_LOG_WARN("store: etcd: {}; serving unregistered, joining when it answers", lease.status().ToString());
      raw->etcd_reachable = false;
    } else {
      return lease.status();
    }
    if (auto live = e.Members(); live.ok()) raw->t->Sync([raw, &live] { raw->ApplyPeers(*live); });
    raw->etcd_thread = std::thread([raw] { raw->EtcdLoop(); });
  }
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

uint16_t StoreServer::port() const { return impl_->port; }
uint64_t StoreServer::node_id() const { return impl_->node; }

ServerStats StoreServer::stats() const {
  impl_->t->Sync([this] { impl_->UpdateGauges(); });
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->st;
}

std::vector<uint64_t> StoreServer::TensorIdsForTesting() const {
  return impl_->t->Sync([&] {
    std::vector<uint64_t> ids;
    for (const auto& [id, tn] : impl_->tensors) ids.push_back(id);
    return ids;
  });
}

void StoreServer::CorruptLandingsForTesting(int count) {
  impl_->t->Sync([&] {
    auto left = std::make_shared<int>(count);
    impl_->t->SetLandedHookForTesting([left](void* local, uint64_t length) {
      if (*left <= 0 || length == 0) return;
      --*left;
      static_cast<uint8_t*>(local)[length / 2] ^= 0x01;
    });
  });
}

bool StoreServer::CorruptByteForTesting(uint64_t tensor, uint64_t byte) {
  return impl_->t->Sync([&] {
    auto it = impl_->tensors.find(tensor);
    if (it == impl_->tensors.end() || byte >= it->second.bytes) return false;
    impl_->arena[it->second.offset + byte] ^= 0x40;
    return true;
  });
}

std::string StoreServer::MetricsText() const {
  const ServerStats s = stats();
  const net::TransportStats n = impl_->t->stats();
  std::string out;
  auto m = [&](const char* name, const char* type, const char* help, uint64_t v) {
    out += fmt::format("# HELP trellis_store_{0} {2}\n# TYPE trellis_store_{0} {1}\ntrellis_store_{0} {3}\n", name, type, help, v);
  };
  m("tensors", "gauge", "Owned tensors held in memory.", s.tensors);
  m("peers", "gauge", "Peer store servers known (--peers or etcd).", s.peers);
  m("replicas", "gauge", "Replicas of other nodes' tensors held in memory.", s.replicas);
  m("replica_bytes", "gauge", "Bytes of replicas in memory.", s.replica_bytes);
  m("replica_hits_total", "counter", "Tensor ranges served from a replica.", s.replica_hits);
  m("replicas_made_total", "counter", "Replicas copied from their owners.", s.replicas_made);
  m("replicas_dropped_total", "counter", "Replicas evicted.", s.replicas_dropped);
  m("replication_failures_total", "counter", "Replications that did not complete.", s.replication_failures);
  m("memory_bytes_used", "gauge", "Bytes of tensors in memory.", s.bytes_used);
  m("memory_bytes_capacity", "gauge", "Size of the memory tier.", s.bytes_capacity);
  m("index_keys", "gauge", "Chain keys indexed on this node.", s.index_keys);
  m("puts_total", "counter", "Tensors stored.", s.puts);
  m("put_bytes_total", "counter", "Bytes stored.", s.put_bytes);
  m("put_failures_total", "counter", "Puts whose bytes could not be read from the client.", s.put_failures);
  m("lookups_total", "counter", "Longest-prefix lookups served.", s.lookups);
  m("lookup_blocks_matched_total", "counter", "Blocks matched by lookups.", s.lookup_blocks_matched);
  m("claimed_keys_total", "counter", "Keys claimed by a computing client (single-flight).", s.claims);
  m("claim_waits_total", "counter", "Lookups told another client is computing what they need.", s.claim_waits);
  m("acquire_hits_total", "counter", "Tensor ranges leased for reading.", s.acquire_hits);
  m("acquire_misses_total", "counter", "Tensor ranges asked for and not held.", s.acquire_misses);
  m("evictions_total", "counter", "Tensors evicted from memory.", s.evictions);
  m("evicted_bytes_total", "counter", "Bytes evicted from memory.", s.evicted_bytes);
  m("full_refusals_total", "counter", "Puts refused because memory was full of leased tensors.", s.full_refusals);
  m("leases_active", "gauge", "Leases held by readers.", s.leases_active);
  m("claims_active", "gauge", "Keys claimed by a computing client and not yet stored, unclaimed or expired.", s.claims_active);
  m("lease_expiries_total", "counter", "Leases that expired unreleased.", s.lease_expiries);
  m("refused_requests_total", "counter", "Malformed requests refused.", s.refused_requests);
  m("ssd_tensors", "gauge", "Tensors in the SSD tier.", s.ssd_tensors);
  m("ssd_bytes_used", "gauge", "Bytes of tensors in the SSD tier.", s.ssd_bytes_used);
  m("ssd_bytes_capacity", "gauge", "Size of the SSD tier.", s.ssd_bytes_capacity);
  m("ssd_flushes_total", "counter", "Tensors written to SSD as they left memory.", s.ssd_flushes);
  m("ssd_reads_total", "counter", "Tensors read back from SSD.", s.ssd_reads);
  m("ssd_evictions_total", "counter", "Tensors dropped from SSD for room.", s.ssd_evictions);
  m("put_checksum_failures_total", "counter", "Puts whose bytes landed unlike the writer's checksums (refused, not indexed).", s.put_checksum_failures);
  m("checksum_failures_total", "counter", "SSD reads whose blocks failed their checksums (discarded).", s.ssd_checksum_failures);
  m("ssd_restored_total", "counter", "Tensors found intact on SSD at start.", s.ssd_restored);
  m("ssd_entries_dropped_total", "counter", "Tensors of this server the index log named at start that had not survived (their entries dropped).", s.ssd_entries_dropped);
  m("ssd_log_records_skipped_total", "counter", "Bad index log records skipped at start.", s.ssd_log_records_skipped);
  m("ssd_log_compactions_total", "counter", "Index log rewrites with the live entries alone.", s.ssd_log_compactions);
  m("ssd_write_failures_total", "counter", "Tensor writes to SSD the file system refused (ENOSPC, EIO); the tensor left memory unsaved.", s.ssd_write_failures);
  m("ssd_read_failures_total", "counter", "Tensor reads from SSD the file system refused (EIO); each a miss.", s.ssd_read_failures);
  m("ssd_log_write_failures_total", "counter", "Index log appends or compactions the file system refused.", s.ssd_log_write_failures);
  m("ssd_rejected_total", "counter", "Tensor files found bad at start (deleted).", s.ssd_rejected);
  m("get_bytes_total", "counter", "Bytes this node read from peers by bulk reads (puts, replicas).", n.get_bytes);
  m("messages_refused_total", "counter", "Messages refused by the transport.", n.messages_refused);
  if (n.faults_injected > 0 || impl_->opt.transport.fault_flip_landed_every > 0) {
    m("faults_injected_total", "counter", "Bytes flipped in landed segments by --fault-flip-landed (chaos runs).", n.faults_injected);
  }
  return out;
}

}  // namespace trellis::store

#include "store/server.h"

#include <algorithm>
#include <random>

#include <fmt/format.h>
#include <xxhash.h>

#include "store/server_impl.h"
#include "util/checksum.h"
#include "util/log.h"

namespace trellis::store {

using net::ConnId;

uint64_t NodeId(const std::string& address) { return XXH3_64bits(address.data(), address.size()); }

StoreServer::Impl::~Impl() {
  membership.reset();  // stops its thread (which posts to the loop) and leaves etcd at once
  // Stopped before it is destroyed: a handler still running on the loop reaches the
  // transport through `t`, which reset() would clear first.
  if (t) t->Stop();
  t.reset();  // the loop has stopped: the state is this thread's now
  // A clean stop writes what is only in memory to the SSD tier, so a restart with the
  // same --ssd-dir serves it.
  if (tiers) tiers->FlushAllToSsd();
}

void StoreServer::Impl::Count(const std::function<void(ServerStats&)>& f) {
  std::lock_guard<std::mutex> lock(stats_mu);
  f(st);
}

void StoreServer::Impl::Refuse(ConnId c, uint64_t rid, const char* what) {
  Count([](ServerStats& s) { ++s.refused_requests; });
  t->ReplyError(c, rid, InvalidArgument(std::string("malformed ") + what + " request"));
}

void StoreServer::Impl::OnTensorDropped(uint64_t id) {
  const uint64_t n = index.Forget(node, id);
  if (ssd && n > 0) ssd->LogForget(node, id);
  Count([n](ServerStats& s) { s.forgotten += n; });
}

void StoreServer::Impl::Handle(ConnId c, uint16_t type, uint64_t rid, std::string_view body) {
  switch (type) {
    case kHello: return OnHello(c, rid);
    case kLookup: return OnLookup(c, rid, body, false);
    case kLookupClaim: return OnLookup(c, rid, body, true);
    case kPutData: return OnPutData(c, rid, body);
    case kPutCommit: return OnPutCommit(c, rid, body);
    case kAcquire: return OnAcquire(c, rid, body);
    case kRelease: return OnRelease(c, rid, body);
    case kForget: return OnForget(c, rid, body);
    case kUnclaim: return OnUnclaim(c, rid, body);
    case kMembers: {
      std::vector<std::string> all{advertised};
      for (const auto& [id, p] : peers) all.push_back(p.address);
      return t->Reply(c, rid, EncodeMembersReply(all));
    }
    case kStats: return t->Reply(c, rid, EncodeStatsReply(StatsForWire()));
    default: return t->ReplyError(c, rid, Unsupported("unknown store message type " + std::to_string(type)));
  }
}

void StoreServer::Impl::OnHello(ConnId c, uint64_t rid) {
  t->Reply(c, rid, EncodeHelloReply(HelloReply{node, net::RemoteRegion{reg.base, reg.length, reg.rkey}, kProtocolVersion}));
}

void StoreServer::Impl::OnLookup(ConnId c, uint64_t rid, std::string_view body, bool claim) {
  LookupRequest m;
  if (!DecodeLookupRequest(body, claim, m)) return Refuse(c, rid, "lookup");
  std::vector<Key> rest;  // the keys past the stored prefix (claims)
  LookupReply out = index.Lookup(m.keys, claim ? &rest : nullptr);
  if (claim) {
    // Single-flight: keys someone else is computing, then keys this client takes.
    index.Claim(rest, m.client, std::min(m.ttl_ms, kMaxClaimMs), net::Clock::now(), out);
  }
  Count([&](ServerStats& s) {
    s.claims += out.claimed;
    s.claim_waits += out.pending > 0;
    ++s.lookups;
    s.lookup_blocks_matched += out.matched;
  });
  t->Reply(c, rid, EncodeLookupReply(out, claim));
}

void StoreServer::Impl::OnUnclaim(ConnId c, uint64_t rid, std::string_view body) {
  UnclaimRequest m;
  if (!DecodeUnclaimRequest(body, m)) return Refuse(c, rid, "unclaim");
  t->Reply(c, rid, EncodeU32(index.Unclaim(m.client, m.keys)));
}

void StoreServer::Impl::OnPutData(ConnId c, uint64_t rid, std::string_view body) {
  PutDataRequest m;
  if (!DecodePutDataRequest(body, opt.mem_bytes, m)) return Refuse(c, rid, "put");
  const uint64_t total = m.block_bytes * m.keys.size();
  const uint64_t id = next_tensor;
  Tensor* tn = tiers->AddInMemory(id, total);
  if (!tn) {
    Count([](ServerStats& s) { ++s.full_refusals; });
    return t->ReplyError(c, rid, ResourceExhausted(fmt::format("store full: {} bytes do not fit in {} (all leased or larger than memory)", total, opt.mem_bytes)));
  }
  ++next_tensor;
  tn->n_blocks = static_cast<uint32_t>(m.keys.size());
  tn->block_bytes = m.block_bytes;
  tn->slices = m.slices;
  tn->cost_s = m.cost_s;
  tn->checksums = std::move(m.checksums);
  std::vector<net::Segment> gets;
  uint64_t at = tn->offset;
  for (const Segment& s : m.segments) {
    gets.push_back({s.addr, arena->data() + at, s.len});
    at += s.len;
  }
  // The client's memory is read straight into the tensor's place in the arena.
  t->Get(c, m.src, std::move(gets), net::After(std::chrono::milliseconds(opt.max_lease_ms)),
         [this, c, rid, id](Status s) { OnPutLanded(c, rid, id, std::move(s)); });
}

bool StoreServer::Impl::Landed(const Tensor& tn, uint32_t* bad) const {
  std::vector<uint64_t> sums(tn.slices);
  for (uint32_t b = 0; b < tn.n_blocks; ++b) {
    SliceChecksums(arena->data() + tn.offset + b * tn.block_bytes, tn.block_bytes, tn.slices, sums.data());
    if (!std::equal(sums.begin(), sums.end(), tn.checksums.begin() + static_cast<ptrdiff_t>(size_t{b} * tn.slices))) {
      if (bad) *bad = b;
      return false;
    }
  }
  return true;
}

void StoreServer::Impl::OnPutLanded(ConnId c, uint64_t rid, uint64_t id, Status s) {
  Tensor* tn = tiers->Find(id);
  if (!tn) return;
  if (!s.ok()) {
    tiers->Drop(id);
    Count([](ServerStats& st) { ++st.put_failures; });
    return t->ReplyError(c, rid, s.WithContext("reading the put's bytes from the client"));
  }
  // The bytes as they landed, against the writer's checksums: what is indexed and later
  // served as verified is what the writer had.
  uint32_t bad = 0;
  if (!Landed(*tn, &bad)) {
    tiers->Drop(id);
    Count([](ServerStats& st) {
      ++st.put_failures;
      ++st.put_checksum_failures;
    });
    return t->ReplyError(c, rid, Corrupt(fmt::format("the put's block {} landed with other bytes than the writer "
                                                      "checksummed (changed on the way); not stored", bad)));
  }
  tiers->MarkReady(id, *tn);
  const uint64_t bytes = tn->bytes;
  Count([bytes](ServerStats& st) {
    ++st.puts;
    st.put_bytes += bytes;
  });
  t->Reply(c, rid, EncodeU64(id));
}

void StoreServer::Impl::OnPutCommit(ConnId c, uint64_t rid, std::string_view body) {
  PutCommitRequest m;
  if (!DecodePutCommitRequest(body, m)) return Refuse(c, rid, "commit");
  // A tensor of this node that is gone already (evicted before the commit) is not indexed.
  if (m.owner == node && !tiers->Find(m.tensor)) {
    return t->ReplyError(c, rid, NotFound("tensor " + std::to_string(m.tensor) + " is no longer stored"));
  }
  const uint32_t stored = index.Commit(m.owner, m.tensor, m.keys, [&](const Key& k, uint32_t i) {
    if (ssd) ssd->LogAdd(IndexRecord{k, m.owner, m.tensor, i});
  });
  Count([](ServerStats& s) { ++s.commits; });
  t->Reply(c, rid, EncodeU32(stored));
}

void StoreServer::Impl::OnAcquire(ConnId c, uint64_t rid, std::string_view body) {
  AcquireRequest m;
  if (!DecodeAcquireRequest(body, m)) return Refuse(c, rid, "acquire");
  const uint64_t lease_id = next_lease++;
  Lease& L = leases[lease_id];
  AcquireReply out;
  out.lease = lease_id;
  out.runs.resize(m.runs.size());
  uint64_t hits = 0, misses = 0, replica_hits = 0;
  for (size_t i = 0; i < m.runs.size(); ++i) {
    const Run& x = m.runs[i];
    AcquiredRun& a = out.runs[i];
    // This node's own tensor, or its replica of another node's.
    uint64_t id = x.tensor;
    if (x.owner != node) {
      id = tiers->ReplicaOf(x.owner, x.tensor);
      if (id == 0) NoteRemoteRead(x.owner, x.tensor);
    }
    Tensor* tn = id ? tiers->Find(id) : nullptr;
    // Every range is checked against the tensor before its address is handed out: UCX
    // would serve any address of the arena. count 0: to the tensor's end.
    bool ok = tn && tn->ready && x.first < tn->n_blocks && x.count <= tn->n_blocks - x.first;
    uint8_t tier = ok && tn->replica ? 1 : 0;  // 0 memory, 1 replica, 2 read back from SSD
    // A tensor on SSD only is read back into memory first (its file checked again).
    if (ok && !tn->in_mem) {
      tier = 2;
      const Status back = tiers->LoadFromSsd(id, *tn);
      if (!back.ok()) {
        TRELLIS_LOG_WARN("store: tensor {}: {}", id, back.ToString());
        ok = false;
      }
    }
    if (!ok) {
      ++misses;
      continue;
    }
    a.found = true;
    a.tier = tier;
    a.count = x.count == 0 ? tn->n_blocks - x.first : x.count;
    a.addr = reg.base + tn->offset + x.first * tn->block_bytes;
    a.block_bytes = tn->block_bytes;
    a.slices = tn->slices;
    a.checksums.assign(tn->checksums.begin() + static_cast<ptrdiff_t>(size_t{x.first} * tn->slices),
                       tn->checksums.begin() + static_cast<ptrdiff_t>((size_t{x.first} + a.count) * tn->slices));
    tiers->Lease(id, *tn);
    L.tensors.push_back(id);
    ++hits;
    replica_hits += tier == 1;
  }
  const uint32_t ms = std::min(m.lease_ms, opt.max_lease_ms);
  L.timer = t->AddTimer(net::After(std::chrono::milliseconds(ms)), [this, lease_id] { EndLease(lease_id, true); });
  Count([&](ServerStats& s) {
    ++s.acquires;
    s.acquire_hits += hits;
    s.acquire_misses += misses;
    s.replica_hits += replica_hits;
  });
  t->Reply(c, rid, EncodeAcquireReply(out));
}

void StoreServer::Impl::EndLease(uint64_t lease_id, bool expired) {
  auto it = leases.find(lease_id);
  if (it == leases.end()) return;
  for (uint64_t id : it->second.tensors) {
    if (Tensor* tn = tiers->Find(id)) tiers->EndLease(id, *tn);
  }
  if (!expired) t->CancelTimer(it->second.timer);
  leases.erase(it);
  if (expired) Count([](ServerStats& s) { ++s.lease_expiries; });
}

void StoreServer::Impl::OnRelease(ConnId c, uint64_t rid, std::string_view body) {
  uint64_t lease_id = 0;
  if (!DecodeRelease(body, lease_id)) return Refuse(c, rid, "release");
  EndLease(lease_id, false);
  t->Reply(c, rid, "");
}

void StoreServer::Impl::OnForget(ConnId c, uint64_t rid, std::string_view body) {
  std::vector<std::pair<uint64_t, uint64_t>> gone;
  if (!DecodeForgetRequest(body, gone)) return Refuse(c, rid, "forget");
  uint64_t dropped = 0;
  for (auto& [owner, tensor] : gone) {
    // Only a tensor this node cannot vouch for is forgotten: its own live tensors stay.
    if (owner == node && tiers->Find(tensor)) continue;
    const uint64_t n = index.Forget(owner, tensor);
    if (ssd && n > 0) ssd->LogForget(owner, tensor);
    dropped += n;
  }
  Count([dropped](ServerStats& s) { s.forgotten += dropped; });
  t->Reply(c, rid, EncodeU32(static_cast<uint32_t>(dropped)));
}

// The index as the SSD tier's log left it, less the entries of this server's own tensors
// that did not survive (in memory only when it stopped, or a file that failed its check):
// served, they would be hits that fail at the read. Loop thread.
void StoreServer::Impl::RestoreIndex() {
  std::set<std::pair<uint64_t, uint64_t>> gone;
  for (const IndexRecord& r : ssd->LiveIndex()) {
    if (r.owner == node && !tiers->Find(r.tensor)) {
      gone.insert({r.owner, r.tensor});
    } else {
      index.Restore(r.key, IndexEntry{r.owner, r.tensor, r.index});
    }
  }
  for (const auto& [owner, tensor] : gone) ssd->DropEntries(owner, tensor);
  std::lock_guard<std::mutex> lock(stats_mu);
  st.ssd_entries_dropped = gone.size();
  st.ssd_log_records_skipped = ssd->log_records_skipped();
  st.ssd_temp_files_removed = ssd->temp_files_removed();
}

// Registers with etcd and starts the membership thread. etcd down at start is not fatal:
// this server serves (peers from --peers or none), and the thread registers it as soon
// as etcd answers; a store restarted after a crash must come back even if etcd is down.
Status StoreServer::Impl::JoinEtcd() {
  TRELLIS_ASSIGN_OR_RETURN(Etcd e, Etcd::Parse(opt.etcd));
  if (advertised.rfind("0.0.0.0:", 0) == 0) {
    return InvalidArgument("listening on 0.0.0.0: give the address others reach this server at (--advertise)");
  }
  EtcdMembership::Options m(e);
  m.period = std::chrono::milliseconds(std::max(200, opt.etcd_ttl_s * 1000 / 3));
  m.address = advertised;
  m.ttl_s = opt.etcd_ttl_s;
  auto registered = e.Register(advertised, opt.etcd_ttl_s);
  if (registered.ok()) {
    m.lease = *registered;
  } else if (registered.status().code() == StatusCode::kUnavailable ||
             registered.status().code() == StatusCode::kDeadlineExceeded) {
    TRELLIS_LOG_WARN("store: etcd: {}; serving unregistered, joining when it answers", registered.status().ToString());
    m.reachable = false;
  } else {
    return registered.status();
  }
  if (auto live = e.Members(); live.ok()) t->Sync([this, &live] { ApplyPeers(*live); });
  membership = std::make_unique<EtcdMembership>(std::move(m), [this](std::vector<std::string> live) {
    t->Post([this, v = std::move(live)] { ApplyPeers(v); });
  });
  return Status::Ok();
}

// --- StoreServer ---

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;

Result<std::unique_ptr<StoreServer>> StoreServer::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl* raw = impl.get();
  raw->opt = options;
  TRELLIS_ASSIGN_OR_RETURN(raw->arena, Arena::Map(options.mem_bytes));
  // Tensor ids carry a random epoch: a restarted server never hands out an id that an
  // index elsewhere still maps to its previous life's data.
  raw->next_tensor = (static_cast<uint64_t>(std::random_device{}()) << 32) | 1;
  if (!options.ssd_dir.empty()) {
    if (options.ssd_bytes == 0) return InvalidArgument("--ssd-dir needs --ssd-size");
    TRELLIS_ASSIGN_OR_RETURN(raw->ssd, SsdTier::Open(options.ssd_dir, options.ssd_bytes, 4096,
                                                     options.ssd_env ? options.ssd_env : Env::Default()));
  }
  raw->tiers = std::make_unique<Tiers>(*raw->arena, raw->ssd.get(), [raw](uint64_t id) { raw->OnTensorDropped(id); });
  if (raw->ssd) {
    // What the SSD held before a restart is served again, from SSD, after its check.
    raw->tiers->RestoreFromSsd();
    raw->st.ssd_restored = raw->ssd->restored().size();
    raw->st.ssd_rejected = raw->ssd->files_rejected();
  }
  TRELLIS_ASSIGN_OR_RETURN(raw->t, net::Transport::Create(options.transport));
  Status s = raw->t->Sync([raw]() -> Status {
    auto r = raw->t->Register(raw->arena->data(), raw->arena->capacity());
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
  if (raw->ssd) raw->t->Sync([raw] { raw->RestoreIndex(); });
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
  if (!options.etcd.empty()) TRELLIS_RETURN_IF_ERROR(raw->JoinEtcd());
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

uint16_t StoreServer::port() const { return impl_->port; }
uint64_t StoreServer::node_id() const { return impl_->node; }

std::vector<uint64_t> StoreServer::TensorIdsForTesting() const {
  return impl_->t->Sync([&] {
    std::vector<uint64_t> ids;
    for (const auto& [id, tn] : impl_->tiers->all()) ids.push_back(id);
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
    Tensor* tn = impl_->tiers->Find(tensor);
    if (!tn || byte >= tn->bytes || !tn->in_mem) return false;
    impl_->tiers->At(*tn)[byte] ^= 0x40;
    return true;
  });
}

}  // namespace trellis::store

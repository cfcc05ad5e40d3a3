// The store server's peers: membership (--peers, or etcd: membership.h keeps this
// server registered and reads the members), and replicas: a tensor a peer owns that
// local readers keep asking for is copied here, within --replica-share of memory.
#include <algorithm>

#include "store/server_impl.h"
#include "util/log.h"

namespace trellis::store {

void StoreServer::Impl::ApplyPeers(const std::vector<std::string>& live) {  // loop thread
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
    if (!DecodeHelloReply(*r, h) || h.node != node_id || h.version != kProtocolVersion) return then(nullptr);
    it->second.region = h.region;
    it->second.ready = true;
    then(&it->second);
  });
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

void StoreServer::Impl::Replicate(uint64_t owner, uint64_t tensor) {
  replicating.insert({owner, tensor});
  WithPeer(owner, [this, owner, tensor](Peer* p) {
    if (!p) {
      replicating.erase({owner, tensor});
      Count([](ServerStats& s) { ++s.replication_failures; });
      TRELLIS_LOG_DEBUG("store: no replica of {}/{}: owner unreachable", owner, tensor);
      return;
    }
    AcquireRequest m;
    m.lease_ms = opt.max_lease_ms;
    m.runs.push_back(Run{owner, tensor, 0, 0});  // the whole tensor
    const net::ConnId conn = p->conn;
    const net::RemoteRegion region = p->region;
    t->Call(conn, kAcquire, EncodeAcquireRequest(m), net::After(std::chrono::milliseconds(5000)),
            [this, owner, tensor, conn, region](Result<std::string> r) {
      OnReplicaAcquired(owner, tensor, conn, region, std::move(r));
    });
  });
}

// The owner's answer to the replica's Acquire: lease the whole tensor, read it into the
// replicas' share, check every block, release the lease.
void StoreServer::Impl::OnReplicaAcquired(uint64_t owner, uint64_t tensor, net::ConnId conn,
                                          const net::RemoteRegion& region, Result<std::string> reply) {
  auto fail = [this, owner, tensor](const std::string& why) {
    replicating.erase({owner, tensor});
    Count([](ServerStats& s) { ++s.replication_failures; });
    TRELLIS_LOG_DEBUG("store: no replica of {}/{}: {}", owner, tensor, why);
  };
  if (!reply.ok()) return fail(reply.status().ToString());
  AcquireReply a;
  const bool decoded = DecodeAcquireReply(*reply, 1, a);
  auto release = [this, conn, lease = a.lease] {
    if (!t->IsConnected(conn) || lease == 0) return;
    t->Call(conn, kRelease, EncodeRelease(lease), net::After(std::chrono::milliseconds(2000)), [](Result<std::string>) {});
  };
  const AcquiredRun* run = decoded ? &a.runs[0] : nullptr;
  if (!run || !run->found || run->count == 0 || run->block_bytes == 0 || run->block_bytes > opt.mem_bytes / run->count) {
    release();
    return fail("owner no longer holds it");
  }
  const uint64_t bytes = run->count * run->block_bytes;
  const uint64_t id = next_tensor;
  const auto budget = static_cast<uint64_t>(opt.replica_share * static_cast<double>(opt.mem_bytes));
  Tensor* tn = tiers->AddReplica(id, bytes, budget, owner, tensor);
  if (!tn) {
    release();
    return fail("no room in the replicas' share");
  }
  ++next_tensor;
  tn->n_blocks = run->count;
  tn->block_bytes = run->block_bytes;
  tn->slices = run->slices;
  tn->checksums = run->checksums;
  t->Get(conn, region, {{run->addr, tiers->At(*tn), bytes}}, net::After(std::chrono::milliseconds(opt.max_lease_ms)),
         [this, id, owner, tensor, release, fail](Status s) {
    release();
    replicating.erase({owner, tensor});
    Tensor* tn = tiers->Find(id);
    if (!tn) return;
    if (!s.ok() || !Landed(*tn, nullptr)) {
      tiers->Drop(id);
      return fail(s.ok() ? "a copied block failed its checksum" : s.ToString());
    }
    tn->reads = remote_reads[{owner, tensor}];
    remote_reads.erase({owner, tensor});
    tn->cost_s = 1.0;
    tiers->MarkReady(id, *tn);
    Count([](ServerStats& st) { ++st.replicas_made; });
  });
}

}  // namespace trellis::store

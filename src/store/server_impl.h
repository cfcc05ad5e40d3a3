// StoreServer's state and handlers, internal to the store server's files:
//   server.cc          start, stop, the message dispatch and the handlers of the index,
//                      puts and leases
//   server_peers.cc    membership (--peers, etcd) and replicas of peers' hot tensors
//   server_metrics.cc  stats and the Prometheus text
// The rooms it is built from have their own headers: arena.h (memory), tiers.h (tensors,
// GDSF, SSD), chain_index.h (keys and claims), ssd.h, protocol.h (the messages).
// Everything here lives on the transport's loop thread, except the stats (under
// stats_mu) and the membership thread's own (membership.h).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net/transport.h"
#include "store/arena.h"
#include "store/chain_index.h"
#include "store/etcd.h"
#include "store/membership.h"
#include "store/protocol.h"
#include "store/server.h"
#include "store/ssd.h"
#include "store/tiers.h"

namespace trellis::store {

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

struct StoreServer::Impl {
  ServerOptions opt;
  uint64_t node = 0;
  uint16_t port = 0;
  std::unique_ptr<Arena> arena;
  net::Registration reg;
  std::unique_ptr<SsdTier> ssd;
  std::unique_ptr<Tiers> tiers;
  ChainIndex index;
  uint64_t next_tensor = 1;
  std::unordered_map<uint64_t, Lease> leases;
  uint64_t next_lease = 1;

  // Replicas (server_peers.cc).
  std::map<uint64_t, Peer> peers;  // node id -> peer store server
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> remote_reads;  // reads asked here of tensors held elsewhere
  std::set<std::pair<uint64_t, uint64_t>> replicating;              // copies in flight

  mutable std::mutex stats_mu;
  ServerStats st;

  std::string advertised;  // the address others reach this server at
  // etcd: this server's registration kept and the members read, on a thread of its own.
  std::unique_ptr<EtcdMembership> membership;

  std::unique_ptr<net::Transport> t;  // last: destroyed (loop joined) before the state above

  ~Impl();

  // server.cc
  void Handle(net::ConnId c, uint16_t type, uint64_t rid, std::string_view body);
  void Refuse(net::ConnId c, uint64_t rid, const char* what);
  void OnHello(net::ConnId c, uint64_t rid);
  void OnLookup(net::ConnId c, uint64_t rid, std::string_view body, bool claim);
  void OnUnclaim(net::ConnId c, uint64_t rid, std::string_view body);
  void OnPutData(net::ConnId c, uint64_t rid, std::string_view body);
  void OnPutLanded(net::ConnId c, uint64_t rid, uint64_t id, Status s);
  void OnPutCommit(net::ConnId c, uint64_t rid, std::string_view body);
  void OnAcquire(net::ConnId c, uint64_t rid, std::string_view body);
  void OnRelease(net::ConnId c, uint64_t rid, std::string_view body);
  void OnForget(net::ConnId c, uint64_t rid, std::string_view body);
  void EndLease(uint64_t lease, bool expired);
  // A tensor of this node is gone from every tier: its index entries here go too (other
  // indexes learn lazily, by kForget).
  void OnTensorDropped(uint64_t id);
  void RestoreIndex();  // at start, from the SSD tier's log
  Status JoinEtcd();    // at start, with --etcd
  // Whether the checksums of tensor tn's landed bytes are the writer's; the first block
  // that differs in *bad.
  bool Landed(const Tensor& tn, uint32_t* bad) const;
  void Count(const std::function<void(ServerStats&)>& f);

  // server_peers.cc
  void ApplyPeers(const std::vector<std::string>& live);
  void WithPeer(uint64_t node, std::function<void(Peer*)> then);
  void NoteRemoteRead(uint64_t owner, uint64_t tensor);
  void Replicate(uint64_t owner, uint64_t tensor);
  void OnReplicaAcquired(uint64_t owner, uint64_t tensor, net::ConnId conn, const net::RemoteRegion& region,
                         Result<std::string> reply);

  // server_metrics.cc
  void UpdateGauges();
  // (Loop thread.) Stats' reply, gauges brought up to date.
  StatsReply StatsForWire();
};

}  // namespace trellis::store

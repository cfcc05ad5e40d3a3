#include "store/client.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <shared_mutex>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "store/etcd.h"
#include "store/membership.h"
#include "store/protocol.h"
#include "store/server.h"
#include "util/checksum.h"
#include "util/log.h"

namespace trellis::store {

using net::ConnId;
using net::Deadline;

namespace {

Result<std::pair<std::string, uint16_t>> SplitAddress(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return InvalidArgument("store address '" + a + "' is not HOST:PORT");
  const std::string port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535 || std::stoi(port) == 0) {
    return InvalidArgument("store address '" + a + "' has no valid port");
  }
  return std::pair<std::string, uint16_t>(a.substr(0, colon), static_cast<uint16_t>(std::stoi(port)));
}

}  // namespace

struct StoreClient::Impl {
  struct Member {
    std::string address;
    uint64_t node = 0;
    ConnId conn = 0;
    net::RemoteRegion region;
    bool ready = false;
    bool live = true;  // in the current membership (members are never removed: indexes stay valid)
    // Unreachable when last tried: calls fail at once (no request waits on a dead server)
    // while a timer retries it in the background every kRetryMs.
    bool down = false;
  };
  static constexpr int kRetryMs = 1000;
  bool discover_pending = false;  // no member answered at start: ask the first that does
  ClientOptions opt;
  // Membership: changed only on the loop thread, under view_mu held exclusively; the
  // loop reads it freely, other threads under view_mu shared. conn / region / ready are
  // the loop's alone.
  mutable std::shared_mutex view_mu;
  std::vector<Member> members;
  std::map<uint64_t, size_t> by_node;
  std::vector<std::pair<uint64_t, size_t>> ring;  // (point, member), sorted; live members only
  size_t local = SIZE_MAX;  // this node's own server (options.local), if named
  std::optional<Etcd> etcd;
  std::unique_ptr<EtcdMembership> membership;  // with etcd: the members read every etcd_poll_ms
  mutable std::mutex stats_mu;
  ClientStats st;
  uint64_t client_id = 0;  // names this client's claims (random per client)
  // Put's staging buffer, registered once and kept (grown when a put needs more): a
  // fresh buffer per put cost page faults, zeroing, a registration and an munmap whose
  // TLB shootdown interrupts every core, each time. One put at a time uses it.
  std::mutex put_mu;
  std::unique_ptr<uint8_t[]> staging;
  size_t staging_bytes = 0;
  net::Registration staging_reg;
  std::unique_ptr<net::Transport> t;  // last: its loop stops before the rest goes (it unmaps what is registered)

  ~Impl() {
    membership.reset();  // its thread posts to the loop
    if (t) t->Stop();  // before the members its callbacks use go
  }

  // The live member owning a key, or SIZE_MAX when there is none. Any thread.
  size_t OwnerOf(const Key& k) const {
    std::shared_lock lock(view_mu);
    if (ring.empty()) return SIZE_MAX;
    auto it = std::lower_bound(ring.begin(), ring.end(), std::pair<uint64_t, size_t>(k.lo, 0));
    return it == ring.end() ? ring.front().second : it->second;
  }
  std::optional<size_t> MemberOf(uint64_t node) const {
    std::shared_lock lock(view_mu);
    auto it = by_node.find(node);
    if (it == by_node.end()) return std::nullopt;
    return it->second;
  }
  std::string AddressOf(size_t m) const {
    std::shared_lock lock(view_mu);
    return m < members.size() ? members[m].address : std::string();
  }
  uint64_t NodeOf(size_t m) const {
    std::shared_lock lock(view_mu);
    return members[m].node;
  }

  // (Loop thread; under view_mu exclusively.) 64 points per live member on the ring: a
  // member joining or leaving moves ~1/N of the keys.
  void RebuildRing() {
    ring.clear();
    for (size_t i = 0; i < members.size(); ++i) {
      if (!members[i].live) continue;
      for (int v = 0; v < 64; ++v) {
        const std::string p = members[i].address + "#" + std::to_string(v);
        ring.emplace_back(XXH3_64bits(p.data(), p.size()), i);
      }
    }
    std::sort(ring.begin(), ring.end());
  }
  // (Loop thread.) Makes `live` the membership: new addresses join, missing ones leave.
  void ApplyMembers(const std::vector<std::string>& live) {
    std::unique_lock lock(view_mu);
    std::set<uint64_t> now;
    for (const std::string& a : live) {
      const uint64_t node = NodeId(a);
      now.insert(node);
      auto it = by_node.find(node);
      if (it != by_node.end()) {
        members[it->second].live = true;
        continue;
      }
      Member m;
      m.address = a;
      m.node = node;
      by_node[node] = members.size();
      members.push_back(std::move(m));
    }
    for (Member& m : members) {
      if (!now.count(m.node)) m.live = false;
    }
    RebuildRing();
  }

  // Runs Call on the loop and waits (bounded by the call's deadline).
  Result<std::string> CallSync(size_t m, uint16_t type, std::string body, Deadline d) {
    if (m == SIZE_MAX) return Unavailable("no live store server");
    std::promise<Result<std::string>> p;
    auto f = p.get_future();
    // The callbacks outlive the posted task: they capture values, and references only to
    // this frame (which waits for them).
    t->Post([this, &p, &body, m, type, d] {
      EnsureConnected(m, d, [this, &p, &body, m, type, d](Status s) {
        if (!s.ok()) return p.set_value(s);
        t->Call(members[m].conn, type, std::move(body), d, [&p](Result<std::string> r) { p.set_value(std::move(r)); });
      });
    });
    return f.get();
  }

  // (Loop thread.) Calls then(Ok) once member m is connected and greeted, or then(error).
  // A member found down fails at once until the background retry reaches it again.
  bool EnsureConnected(size_t m, Deadline d, std::function<void(Status)> then) {
    Member& mb = members[m];
    if (mb.ready && t->IsConnected(mb.conn)) {
      then(Status::Ok());
      return true;
    }
    if (mb.down) {
      then(Unavailable("store " + mb.address + " is down (retried every " + std::to_string(kRetryMs) + " ms)"));
      return true;
    }
    Greet(m, d, [this, m, then = std::move(then)](Status s) {
      if (!s.ok()) MarkDown(m);
      then(s);
    });
    return true;
  }

  void MarkDown(size_t m) {
    if (members[m].down) return;
    members[m].down = true;
    ScheduleRetry(m);
  }

  void ScheduleRetry(size_t m) {
    t->AddTimer(net::After(std::chrono::milliseconds(kRetryMs)), [this, m] {
      Greet(m, net::After(std::chrono::milliseconds(2 * kRetryMs)), [this, m](Status s) {
        if (s.ok()) {
          members[m].down = false;
        } else {
          ScheduleRetry(m);
        }
      });
    });
  }

  // (Loop thread.) Connects to member m and checks its Hello.
  void Greet(size_t m, Deadline d, std::function<void(Status)> then) {
    Member& mb = members[m];
    mb.ready = false;
    auto hp = SplitAddress(mb.address);
    if (!hp.ok()) return then(hp.status());
    auto c = t->Connect(hp->first, hp->second);
    if (!c.ok()) return then(c.status());
    mb.conn = *c;
    t->Call(mb.conn, kHello, "", d, [this, m, then = std::move(then)](Result<std::string> r) {
      if (!r.ok()) return then(r.status().WithContext("store " + members[m].address));
      HelloReply h;
      if (!DecodeHelloReply(*r, h) || h.version != kProtocolVersion) {
        return then(Corrupt("store " + members[m].address + " speaks another protocol (version " + std::to_string(h.version) + ")"));
      }
      const net::RemoteRegion& region = h.region;
      if (h.node != members[m].node) {
        return then(Corrupt("store " + members[m].address + " names itself differently: is it listening on another address?"));
      }
      members[m].region = region;
      members[m].ready = true;
      if (discover_pending) {
        discover_pending = false;
        DiscoverFrom(m);
      }
      then(Status::Ok());
    });
  }

  // (Loop thread.) Asks member m for the members it knows and adds them.
  void DiscoverFrom(size_t m) {
    t->Call(members[m].conn, kMembers, "", net::After(std::chrono::milliseconds(2 * kRetryMs)),
            [this](Result<std::string> r) {
              if (!r.ok()) return;
              std::vector<std::string> known;
              if (!DecodeMembers(*r, known)) return;
              ApplyMembers(known);
            });
  }

  // The known members plus those a Members reply names; false if it is malformed.
  bool DecodeMembers(std::string_view body, std::vector<std::string>& known) {
    std::vector<std::string> named;
    if (!DecodeMembersReply(body, named)) return false;
    for (const Member& x : members) known.push_back(x.address);
    for (const std::string& a : named) {
      if (SplitAddress(a).ok() && std::find(known.begin(), known.end(), a) == known.end()) known.push_back(a);
    }
    return true;
  }

  // GetRange's steps (below).
  struct Piece {
    Run run;
    size_t dst_first = 0;        // index in dst of the run's first block
    size_t source = SIZE_MAX;    // the member it is read from, once acquired
    uint8_t tier = 0;
    bool unknown_owner = false;
    uint64_t addr = 0;
    uint32_t slices = 1;
    std::vector<uint64_t> sums;  // count x slices
  };
  struct Source {
    size_t member = SIZE_MAX;
    std::vector<Piece*> pieces;
    uint64_t lease = 0;
    Status status;
  };
  static std::vector<Piece> Plan(const LookupResult& found, size_t first, size_t n_blocks);
  Status TakeAcquired(Piece& p, const AcquiredRun& a, size_t member, uint64_t block_bytes, ByteRange range);
  void Acquire(std::vector<Source>& sources, uint64_t block_bytes, ByteRange range, Deadline deadline);
  Status AcquireAll(std::vector<Piece>& pieces, size_t local, uint64_t block_bytes, ByteRange range, Deadline deadline,
                    std::vector<Source>& sources, std::vector<std::pair<uint64_t, uint64_t>>& gone);
  Status ReadAll(const std::vector<Piece>& pieces, std::span<void* const> dst, uint64_t block_bytes, ByteRange range,
                 Deadline deadline);
  void ReleaseAll(const std::vector<Source>& sources);
  void CountGet(const GetReceipt& g, size_t n_blocks, uint64_t block_bytes);

  void CountMiss(const Status& s) {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (s.code() == StatusCode::kDeadlineExceeded) ++st.misses_deadline;
    else if (s.code() == StatusCode::kNotFound) ++st.misses_evicted;
    else if (s.code() == StatusCode::kCorrupt) ++st.checksum_failures;
    else if (s.code() == StatusCode::kFailedPrecondition) ++st.misses_mismatch;
    else if (s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kCancelled) ++st.misses_down;
    else ++st.misses_error;
  }
};

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Result<std::unique_ptr<StoreClient>> StoreClient::Connect(const ClientOptions& options, Deadline deadline) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->client_id = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                    static_cast<uint64_t>(net::Clock::now().time_since_epoch().count());
  std::vector<std::string> servers = options.servers;
  if (!options.etcd.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(Etcd e, Etcd::Parse(options.etcd));
    auto found = e.Members();
    if (!found.ok() && options.require_reachable) return found.status();
    if (!found.ok()) TRELLIS_LOG_WARN("store: etcd {}: {}; polling it", options.etcd, found.status().ToString());
    for (const std::string& a : found.ok() ? *found : std::vector<std::string>{}) {
      if (std::find(servers.begin(), servers.end(), a) == servers.end()) servers.push_back(a);
    }
    impl->etcd = e;
  }
  if (servers.empty() && (!impl->etcd || options.require_reachable)) {
    return InvalidArgument("no store servers given (and none registered in etcd)");
  }
  for (const std::string& a : servers) {
    TRELLIS_RETURN_IF_ERROR(SplitAddress(a).status());
    Impl::Member m;
    m.address = a;
    m.node = NodeId(a);
    if (impl->by_node.count(m.node)) return InvalidArgument("store server '" + a + "' is listed twice");
    impl->by_node[m.node] = impl->members.size();
    impl->members.push_back(m);
  }
  impl->RebuildRing();
  if (!options.local.empty()) {
    auto it = impl->by_node.find(NodeId(options.local));
    if (it == impl->by_node.end()) return InvalidArgument("the local store '" + options.local + "' is not among the servers");
    impl->local = it->second;
  }
  TRELLIS_ASSIGN_OR_RETURN(impl->t, net::Transport::Create(options.transport));
  // Greet everyone now; a member that is down is retried on use.
  size_t up = 0;
  Status last;
  for (size_t m = 0; m < impl->members.size(); ++m) {
    std::promise<Status> p;
    auto f = p.get_future();
    Impl* raw = impl.get();
    raw->t->Post([&, m, raw] { raw->EnsureConnected(m, deadline, [&](Status s) { p.set_value(s); }); });
    const Status s = f.get();
    if (s.ok()) ++up;
    else last = s;
  }
  if (up == 0 && !impl->members.empty()) {
    if (options.require_reachable) return Unavailable("no store server reachable: " + last.message());
    TRELLIS_LOG_WARN("store: no server reachable yet ({}); serving without it, retrying in the background", last.message());
    Impl* raw = impl.get();
    raw->t->Sync([&] { raw->discover_pending = !raw->etcd && options.discover; });
  }
  if (up > 0 && !impl->etcd && options.discover) {
    for (size_t m = 0; m < impl->members.size(); ++m) {
      auto r = impl->CallSync(m, kMembers, "", deadline);
      if (!r.ok()) continue;
      Impl* raw = impl.get();
      std::vector<std::string> known;
      if (!raw->t->Sync([&] { return raw->DecodeMembers(*r, known); })) {
        return Corrupt("malformed members reply from " + impl->members[m].address);
      }
      raw->t->Sync([&] { raw->ApplyMembers(known); return 0; });
      break;
    }
  }
  // With etcd, the membership follows it: polled every poll_ms, applied on the loop.
  if (impl->etcd) {
    Impl* raw = impl.get();
    EtcdMembership::Options m(*raw->etcd);
    m.period = std::chrono::milliseconds(raw->opt.etcd_poll_ms);
    m.who = "store client";
    raw->membership = std::make_unique<EtcdMembership>(std::move(m), [raw](std::vector<std::string> live) {
      raw->t->Post([raw, v = std::move(live)] { raw->ApplyMembers(v); });  // empty too: all gone
    });
  }
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

std::string StoreClient::IndexServer(const Key& first_block) const {
  return impl_->AddressOf(impl_->OwnerOf(first_block));
}

Result<size_t> StoreClient::Unclaim(const Namespace& ns, std::span<const int32_t> tokens, Deadline deadline) {
  UnclaimRequest m;
  m.client = impl_->client_id;
  m.keys = ChainKeys(ns, tokens);
  if (m.keys.empty()) return size_t{0};
  if (m.keys.size() > kMaxKeys) m.keys.resize(kMaxKeys);
  TRELLIS_ASSIGN_OR_RETURN(std::string r, impl_->CallSync(impl_->OwnerOf(m.keys[0]), kUnclaim, EncodeUnclaimRequest(m), deadline));
  uint32_t released = 0;
  if (!DecodeU32(r, released) || released > m.keys.size()) return Corrupt("malformed unclaim reply");
  return size_t{released};
}

Result<LookupResult> StoreClient::Lookup(const Namespace& ns, std::span<const int32_t> tokens, Deadline deadline,
                                         uint32_t claim_ms) {
  LookupResult out;
  out.keys = ChainKeys(ns, tokens);
  if (out.keys.empty()) return out;
  if (out.keys.size() > kMaxKeys) out.keys.resize(kMaxKeys);
  LookupRequest m;
  m.claim = claim_ms > 0;
  m.ttl_ms = claim_ms;
  m.client = impl_->client_id;
  const size_t owner = impl_->OwnerOf(out.keys[0]);
  m.keys = std::move(out.keys);  // lent to the encoder, not copied
  std::string body = EncodeLookupRequest(m);
  out.keys = std::move(m.keys);
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    ++impl_->st.lookups;
  }
  auto r = impl_->CallSync(owner, m.claim ? kLookupClaim : kLookup, std::move(body), deadline);
  if (!r.ok()) {
    impl_->CountMiss(r.status());
    return r.status();
  }
  LookupReply reply;
  if (!DecodeLookupReply(*r, m.claim, out.keys.size(), reply)) return Corrupt("malformed lookup reply");
  out.blocks = reply.matched;
  out.runs = std::move(reply.runs);
  out.pending = reply.pending;
  out.pending_ms = reply.pending_ms;
  out.claimed = reply.claimed;
  if (out.blocks == 0) {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    ++impl_->st.misses_not_stored;
  }
  return out;
}

// ---- GetRange: plan, acquire, read and verify, release ----------------------------------

// The pieces of one read: the lookup's runs cut to blocks [first, first + n_blocks), each
// landing at dst[dst_first ...].
std::vector<StoreClient::Impl::Piece> StoreClient::Impl::Plan(const LookupResult& found, size_t first, size_t n_blocks) {
  std::vector<Piece> pieces;
  size_t skip = first, at = 0;
  for (const Run& r : found.runs) {
    if (at >= n_blocks) break;
    Run x = r;
    if (skip >= x.count) {
      skip -= x.count;
      continue;
    }
    x.first += static_cast<uint32_t>(skip);
    x.count -= static_cast<uint32_t>(skip);
    skip = 0;
    x.count = static_cast<uint32_t>(std::min<size_t>(x.count, n_blocks - at));
    Piece p;
    p.run = x;
    p.dst_first = at;
    pieces.push_back(std::move(p));
    at += x.count;
  }
  return pieces;
}

// What a source's Acquire said of one piece: found, where, and its checksums; an error if
// the piece cannot serve this reader (other block size, slices that do not tile range).
Status StoreClient::Impl::TakeAcquired(Piece& p, const AcquiredRun& a, size_t member, uint64_t block_bytes, ByteRange range) {
  if (!a.found) return Status::Ok();
  if (a.block_bytes != block_bytes && a.count == p.run.count) {
    // Stored by an engine with other blocks: not this reader's to use.
    return FailedPrecondition(fmt::format("tensor {} holds {}-byte blocks, the reader's are {} bytes", p.run.tensor,
                                          a.block_bytes, block_bytes));
  }
  if (a.count != p.run.count || a.block_bytes != block_bytes) return Corrupt("acquire reply does not match the request");
  // A reader of part of each block checks the slices it reads: the tensor's slices must
  // tile the range.
  const uint64_t each = a.block_bytes / a.slices;
  if (range.offset % each != 0 || range.bytes % each != 0) {
    return FailedPrecondition(fmt::format("tensor {} is checksummed in {} slices per block, which do not cover bytes "
                                          "[{}, {}) of a block", p.run.tensor, a.slices, range.offset, range.offset + range.bytes));
  }
  p.slices = a.slices;
  p.sums = a.checksums;
  p.addr = a.addr;
  p.tier = a.tier;
  p.source = member;
  return Status::Ok();
}

// Acquires the pieces of each source at once (one message per member); each piece found
// gets that member as its source. Waits for all; each source's status says how it went.
void StoreClient::Impl::Acquire(std::vector<Source>& sources, uint64_t block_bytes, ByteRange range, Deadline deadline) {
  if (sources.empty()) return;
  std::promise<void> all;
  auto fut = all.get_future();
  size_t left = sources.size();
  t->Post([&] {
    for (Source& src : sources) {
      AcquireRequest m;
      m.lease_ms = opt.lease_ms;
      for (const Piece* p : src.pieces) m.runs.push_back(p->run);
      // Callbacks run after this task: they hold a pointer to their Source and refer
      // only to this function's frame, which waits for them.
      Source* sp = &src;
      auto done = [sp, &left, &all](Status st) {
        sp->status = st;
        if (--left == 0) all.set_value();
      };
      EnsureConnected(src.member, deadline, [this, sp, done, deadline, block_bytes, range, body = EncodeAcquireRequest(m)](Status s) mutable {
        if (!s.ok()) return done(s);
        t->Call(members[sp->member].conn, kAcquire, std::move(body), deadline, [this, sp, done, block_bytes, range](Result<std::string> r) {
          if (!r.ok()) return done(r.status());
          AcquireReply a;
          const bool decoded = DecodeAcquireReply(*r, sp->pieces.size(), a);
          sp->lease = a.lease;  // released even if the rest is nonsense
          if (!decoded) return done(Corrupt("malformed acquire reply from " + members[sp->member].address));
          for (size_t i = 0; i < sp->pieces.size(); ++i) {
            if (Status st = TakeAcquired(*sp->pieces[i], a.runs[i], sp->member, block_bytes, range); !st.ok()) return done(st);
          }
          done(Status::Ok());
        });
      });
    }
  });
  fut.wait();
}

// 1. This node's own store server first: it holds what it owns and its replicas of
//    others' hot tensors (and counts what it was asked for, to make replicas). 2. What is
//    left, from each owner, all at once. The sources asked (their leases to release), and
//    the first failure: a source's, a block nobody holds (NotFound; `gone` names them), or
//    one whose owner is not a live member (Unavailable).
Status StoreClient::Impl::AcquireAll(std::vector<Piece>& pieces, size_t local, uint64_t block_bytes, ByteRange range,
                                     Deadline deadline, std::vector<Source>& sources,
                                     std::vector<std::pair<uint64_t, uint64_t>>& gone) {
  if (local != SIZE_MAX) {
    std::vector<Source> mine(1);
    mine[0].member = local;
    for (Piece& p : pieces) mine[0].pieces.push_back(&p);
    Acquire(mine, block_bytes, range, deadline);
    sources.push_back(std::move(mine[0]));  // its lease is released even if all missed
  }
  std::map<size_t, Source> by_owner;
  for (Piece& p : pieces) {
    if (p.source != SIZE_MAX) continue;
    const auto m = MemberOf(p.run.owner);
    if (!m) {
      p.unknown_owner = true;  // not (yet) in this client's membership: down, not evicted
      continue;
    }
    if (*m == local) continue;  // the local server owns it and said no: evicted
    by_owner[*m].member = *m;
    by_owner[*m].pieces.push_back(&p);
  }
  std::vector<Source> owners;
  for (auto& [m, src] : by_owner) owners.push_back(std::move(src));
  Acquire(owners, block_bytes, range, deadline);
  for (Source& o : owners) sources.push_back(std::move(o));

  Status status;
  for (const Source& s : sources) {
    if (!s.status.ok() && status.ok()) status = s.status;
  }
  for (const Piece& p : pieces) {
    if (p.source == SIZE_MAX && p.unknown_owner && status.ok()) status = Unavailable("a block's owner is not a live member");
    if (p.source == SIZE_MAX && !p.unknown_owner) gone.emplace_back(p.run.owner, p.run.tensor);
  }
  if (status.ok() && !gone.empty()) status = NotFound(fmt::format("tensor {} is no longer stored", gone.front().second));
  return status;
}

// 3. Every segment from every source in flight at once, each block straight into its
//    buffer; each block's checksums are checked as its segment lands, while the others
//    are still in flight (on the transport's thread). A failed checksum fails the read.
Status StoreClient::Impl::ReadAll(const std::vector<Piece>& pieces, std::span<void* const> dst, uint64_t block_bytes,
                                  ByteRange range, Deadline deadline) {
  std::map<size_t, std::vector<net::Segment>> segs;
  // Per segment, the blocks it carries: (dst index, that block's checksums in range).
  struct Check {
    size_t dst;
    const uint64_t* sums;
    uint64_t slice_bytes;
  };
  std::map<size_t, std::vector<std::vector<Check>>> seg_blocks;
  for (const Piece& p : pieces) {
    auto& v = segs[p.source];
    auto& vb = seg_blocks[p.source];
    const uint64_t each = block_bytes / p.slices;
    for (uint32_t b = 0; b < p.run.count; ++b) {
      void* d = dst[p.dst_first + b];
      const uint64_t remote = p.addr + b * block_bytes + range.offset;
      if (!v.empty() && static_cast<uint8_t*>(v.back().local) + v.back().length == d &&
          v.back().remote + v.back().length == remote) {
        v.back().length += range.bytes;  // contiguous on both sides: one segment
      } else {
        v.push_back({remote, d, range.bytes});
        vb.emplace_back();
      }
      vb.back().push_back(Check{p.dst_first + b, &p.sums[size_t{b} * p.slices + range.offset / each], each});
    }
  }
  std::promise<void> got;
  auto gf = got.get_future();
  size_t left = segs.size();
  std::vector<Status> results(segs.size());
  size_t bad_block = SIZE_MAX;
  t->Post([&] {
    size_t i = 0;
    for (auto& [m, v] : segs) {
      const size_t k = i++;
      if (!t->IsConnected(members[m].conn)) {
        results[k] = Unavailable("store " + members[m].address + " went away");
        if (--left == 0) got.set_value();
        continue;
      }
      const auto* blocks = &seg_blocks[m];
      t->Get(
          members[m].conn, members[m].region, std::move(v), deadline,
          [&, k](Status s) {
            results[k] = s;
            if (--left == 0) got.set_value();
          },
          [&, blocks](size_t seg) {
            for (const Check& c : (*blocks)[seg]) {
              const auto* d = static_cast<const uint8_t*>(dst[c.dst]);
              for (uint64_t k = 0; k < range.bytes / c.slice_bytes; ++k) {
                if (Checksum64(d + k * c.slice_bytes, c.slice_bytes) != c.sums[k]) bad_block = std::min(bad_block, c.dst);
              }
            }
          });
    }
  });
  gf.wait();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  if (bad_block != SIZE_MAX) return Corrupt(fmt::format("block {} failed its checksum after the transfer", bad_block));
  return Status::Ok();
}

// 4. The leases go back (not waited for: a lost release just expires).
void StoreClient::Impl::ReleaseAll(const std::vector<Source>& sources) {
  std::vector<std::pair<size_t, uint64_t>> held;
  for (const Source& s : sources) {
    if (s.lease) held.emplace_back(s.member, s.lease);
  }
  t->Post([this, held] {
    for (auto [m, lease] : held) {
      if (!t->IsConnected(members[m].conn)) continue;
      t->Call(members[m].conn, kRelease, EncodeRelease(lease), net::After(std::chrono::milliseconds(2000)), [](Result<std::string>) {});
    }
  });
}

void StoreClient::Impl::CountGet(const GetReceipt& g, size_t n_blocks, uint64_t block_bytes) {
  std::lock_guard<std::mutex> lock(stats_mu);
  ++st.gets;
  st.get_blocks += n_blocks;
  st.get_bytes += n_blocks * block_bytes;
  st.blocks_local_memory += g.memory;
  st.blocks_local_replica += g.replica;
  st.blocks_local_ssd += g.ssd;
  st.blocks_remote += g.remote;
}

Status StoreClient::GetRange(const LookupResult& found, size_t first, size_t n_blocks, std::span<void* const> dst,
                             uint64_t block_bytes, Deadline deadline, GetReceipt* receipt, ByteRange range) {
  if (first > found.blocks || n_blocks > found.blocks - first || dst.size() < n_blocks) {
    return InvalidArgument("asked for more blocks than found or given");
  }
  if (range.bytes == 0) range = {0, block_bytes};
  if (range.offset > block_bytes || range.bytes > block_bytes - range.offset) {
    return InvalidArgument("byte range outside the block");
  }
  if (receipt) *receipt = {};
  if (n_blocks == 0) return Status::Ok();
  Impl& I = *impl_;
  std::vector<Impl::Piece> pieces = I.Plan(found, first, n_blocks);
  const size_t local = [&] {
    std::shared_lock lock(I.view_mu);
    return I.local != SIZE_MAX && I.members[I.local].live ? I.local : SIZE_MAX;
  }();
  std::vector<Impl::Source> sources;
  std::vector<std::pair<uint64_t, uint64_t>> gone;  // pieces nobody holds: (owner, tensor)
  Status status = I.AcquireAll(pieces, local, block_bytes, range, deadline, sources, gone);
  if (status.ok()) status = I.ReadAll(pieces, dst, block_bytes, range, deadline);
  I.ReleaseAll(sources);
  // An evicted tensor: tell the index so later lookups stop short of it (best effort).
  if (status.code() == StatusCode::kNotFound && !gone.empty() && !found.keys.empty()) {
    (void)I.CallSync(I.OwnerOf(found.keys[0]), kForget, EncodeForgetRequest(gone),
                     std::min(deadline, net::After(std::chrono::milliseconds(1000))));
  }
  if (!status.ok()) {
    I.CountMiss(status);
    return status;
  }
  GetReceipt g;
  for (const Impl::Piece& p : pieces) {
    if (p.source != local) g.remote += p.run.count;
    else if (p.tier == 1) g.replica += p.run.count;
    else if (p.tier == 2) g.ssd += p.run.count;
    else g.memory += p.run.count;
  }
  if (receipt) *receipt = g;
  I.CountGet(g, n_blocks, block_bytes);
  return Status::Ok();
}

Result<size_t> StoreClient::Put(const Namespace& ns, std::span<const int32_t> tokens, std::span<const void* const> blocks,
                                uint64_t block_bytes, double cost_s, Deadline deadline, uint32_t slices) {
  Impl& I = *impl_;
  TRELLIS_ASSIGN_OR_RETURN(LookupResult found, Lookup(ns, tokens, deadline));
  const size_t n = found.keys.size();
  if (blocks.size() < n) return InvalidArgument("fewer block buffers than whole blocks");
  const size_t k = found.blocks;
  if (k == n) {
    std::lock_guard<std::mutex> lock(I.stats_mu);
    I.st.put_skipped_blocks += n;
    return size_t{0};
  }
  const size_t inc = n - k;
  const size_t owner = I.OwnerOf(found.keys[k]);
  if (owner == SIZE_MAX) return Unavailable("no live store server");
  // The increment's bytes, in the registered staging buffer the owner reads (a bulk read our transport serves).
  std::lock_guard<std::mutex> put_lock(I.put_mu);
  const size_t bytes = inc * block_bytes;
  if (I.staging_bytes < bytes) {
    if (I.staging) I.t->Sync([&] { I.t->Unregister(I.staging_reg.base); });
    I.staging.reset();
    I.staging_bytes = 0;
    auto buf = std::unique_ptr<uint8_t[]>(new (std::nothrow) uint8_t[bytes]);
    if (!buf) return ResourceExhausted("no memory to stage a put of " + std::to_string(bytes) + " bytes");
    auto r = I.t->Sync([&] { return I.t->Register(buf.get(), bytes); });
    if (!r.ok()) return r.status();
    I.staging = std::move(buf);
    I.staging_bytes = bytes;
    I.staging_reg = *r;
  }
  for (size_t i = 0; i < inc; ++i) {
    // A null block: the caller has only the blocks past the prefix it saw stored, and the
    // store lost some of that prefix since.
    if (!blocks[k + i]) return Unavailable("the store lost part of the prefix during the put; not stored");
  }
  for (size_t i = 0; i < inc; ++i) std::memcpy(I.staging.get() + i * block_bytes, blocks[k + i], block_bytes);
  PutDataRequest m;
  m.keys.assign(found.keys.begin() + static_cast<ptrdiff_t>(k), found.keys.end());
  m.first = static_cast<uint32_t>(k);
  m.block_bytes = block_bytes;
  m.slices = slices;
  m.cost_s = cost_s;
  m.src = net::RemoteRegion{I.staging_reg.base, I.staging_reg.length, I.staging_reg.rkey};
  m.segments.push_back({I.staging_reg.base, bytes});
  // The writer's checksums, of the caller's blocks (not the staging copy): the owner
  // refuses bytes that changed anywhere on the way.
  m.checksums.resize(inc * slices);
  for (size_t i = 0; i < inc; ++i) {
    SliceChecksums(static_cast<const uint8_t*>(blocks[k + i]), block_bytes, slices, &m.checksums[i * slices]);
  }
  auto put = I.CallSync(owner, kPutData, EncodePutDataRequest(m), deadline);
  // The owner has read the bytes (or failed) once it answers. Without an answer it may
  // still be reading: force-close the connection first, so nothing reads the staging
  // buffer after this.
  I.t->Sync([&] {
    if (!put.ok()) I.t->Close(I.members[owner].conn);
  });
  if (!put.ok()) return put.status();
  PutCommitRequest c;
  c.owner = I.NodeOf(owner);
  if (!DecodeU64(*put, c.tensor)) return Corrupt("malformed put reply");
  c.keys = std::move(m.keys);
  auto commit = I.CallSync(I.OwnerOf(found.keys[0]), kPutCommit, EncodePutCommitRequest(c), deadline);
  if (!commit.ok()) return commit.status();
  std::lock_guard<std::mutex> lock(I.stats_mu);
  ++I.st.puts;
  I.st.put_blocks += inc;
  I.st.put_skipped_blocks += k;
  return inc;
}

std::vector<std::string> StoreClient::Members() const {
  std::shared_lock lock(impl_->view_mu);
  std::vector<std::string> out;
  for (const auto& m : impl_->members) {
    if (m.live) out.push_back(m.address);
  }
  return out;
}

void StoreClient::SetLandedHookForTesting(std::function<void(void*, uint64_t)> hook) {
  impl_->t->Sync([&] { impl_->t->SetLandedHookForTesting(std::move(hook)); });
}

size_t StoreClient::ReachableMembers() const {
  Impl& I = *impl_;
  return I.t->Sync([&I] {
    size_t n = 0;
    for (const Impl::Member& m : I.members) n += m.live && m.ready && !m.down && I.t->IsConnected(m.conn);
    return n;
  });
}

std::vector<MemberStats> StoreClient::StatsOfMembers(net::Deadline deadline) {
  std::vector<std::pair<size_t, std::string>> live;
  {
    std::shared_lock lock(impl_->view_mu);
    for (size_t i = 0; i < impl_->members.size(); ++i) {
      if (impl_->members[i].live) live.emplace_back(i, impl_->members[i].address);
    }
  }
  std::vector<MemberStats> out;
  for (auto& [m, address] : live) {
    MemberStats ms;
    ms.address = std::move(address);
    auto r = impl_->CallSync(m, kStats, "", deadline);
    if (!r.ok()) {
      ms.status = r.status();
    } else if (!DecodeStatsReply(*r, ms.stats)) {
      ms.status = Corrupt("store " + ms.address + " answered Stats malformed");
    }
    out.push_back(std::move(ms));
  }
  return out;
}

ClientStats StoreClient::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->st;
}

}  // namespace trellis::store

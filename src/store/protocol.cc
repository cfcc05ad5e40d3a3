#include "store/protocol.h"

namespace trellis::store {

using net::WireReader;
using net::WireWriter;

namespace {

void PutKeys(WireWriter& w, const std::vector<Key>& keys) {
  w.U32(static_cast<uint32_t>(keys.size()));
  for (const Key& k : keys) {
    w.U64(k.lo);
    w.U64(k.hi);
  }
}

void GetKeys(WireReader& r, std::vector<Key>& keys) {
  const uint32_t n = r.Count(kMaxKeys, 16);
  keys.resize(n);
  for (Key& k : keys) {
    k.lo = r.U64();
    k.hi = r.U64();
  }
}

void PutRegion(WireWriter& w, const net::RemoteRegion& g) {
  w.U64(g.base);
  w.U64(g.length);
  w.Str(g.rkey);
}

void GetRegion(WireReader& r, net::RemoteRegion& g) {
  g.base = r.U64();
  g.length = r.U64();
  g.rkey = std::string(r.Str(kMaxRkeyBytes));
}

}  // namespace

std::string EncodeHelloReply(const HelloReply& h) {
  WireWriter w;
  w.U64(h.node);
  PutRegion(w, h.region);
  w.U32(h.version);
  return w.Take();
}

bool DecodeHelloReply(std::string_view body, HelloReply& h) {
  WireReader r(body);
  h.node = r.U64();
  GetRegion(r, h.region);
  h.version = r.U32();
  return r.Done();
}

std::string EncodeLookupRequest(const LookupRequest& m) {
  WireWriter w;
  if (m.claim) {
    w.U32(m.ttl_ms);
    w.U64(m.client);
  }
  PutKeys(w, m.keys);
  return w.Take();
}

bool DecodeLookupRequest(std::string_view body, bool claim, LookupRequest& m) {
  WireReader r(body);
  m.claim = claim;
  if (claim) {
    m.ttl_ms = r.U32();
    m.client = r.U64();
  }
  GetKeys(r, m.keys);
  return r.Done();
}

std::string EncodeLookupReply(const LookupReply& m, bool claim) {
  WireWriter w;
  w.U32(m.matched);
  w.U32(static_cast<uint32_t>(m.runs.size()));
  for (const Run& x : m.runs) {
    w.U64(x.owner);
    w.U64(x.tensor);
    w.U32(x.first);
    w.U32(x.count);
  }
  if (claim) {
    w.U32(m.pending);
    w.U32(m.pending_ms);
    w.U32(m.claimed);
  }
  return w.Take();
}

bool DecodeLookupReply(std::string_view body, bool claim, size_t keys, LookupReply& m) {
  WireReader r(body);
  m.matched = r.U32();
  const uint32_t n = r.Count(m.matched, 24);
  m.runs.resize(n);
  uint64_t sum = 0;
  for (Run& x : m.runs) {
    x.owner = r.U64();
    x.tensor = r.U64();
    x.first = r.U32();
    x.count = r.U32();
    if (x.count == 0) r.Fail();
    sum += x.count;
  }
  if (claim) {
    m.pending = r.U32();
    m.pending_ms = r.U32();
    m.claimed = r.U32();
  }
  return r.Done() && m.matched <= keys && sum == m.matched &&
         uint64_t{m.matched} + m.pending + m.claimed <= keys;
}

std::string EncodePutDataRequest(const PutDataRequest& m) {
  WireWriter w;
  PutKeys(w, m.keys);
  w.U32(m.first);
  w.U64(m.block_bytes);
  w.U32(m.slices);
  w.F64(m.cost_s);
  PutRegion(w, m.src);
  w.U32(static_cast<uint32_t>(m.segments.size()));
  for (const Segment& s : m.segments) {
    w.U64(s.addr);
    w.U64(s.len);
  }
  w.U32(static_cast<uint32_t>(m.checksums.size()));
  for (uint64_t x : m.checksums) w.U64(x);
  return w.Take();
}

bool DecodePutDataRequest(std::string_view body, uint64_t max_bytes, PutDataRequest& m) {
  WireReader r(body);
  GetKeys(r, m.keys);
  m.first = r.U32();
  m.block_bytes = r.U64();
  m.slices = r.U32();
  m.cost_s = r.F64();
  GetRegion(r, m.src);
  m.segments.resize(r.Count(kMaxSegments, 16));
  uint64_t total = 0;
  bool sane = true;
  for (Segment& s : m.segments) {
    s.addr = r.U64();
    s.len = r.U64();
    if (s.len == 0 || s.len > max_bytes) sane = false;
    total += sane ? s.len : 0;
  }
  m.checksums.resize(r.Count(kMaxChecksums, 8));
  for (uint64_t& x : m.checksums) x = r.U64();
  const uint64_t n = m.keys.size();
  return r.Done() && n > 0 && sane && m.block_bytes > 0 && ValidSlices(m.block_bytes, m.slices) &&
         n * m.slices <= kMaxChecksums && m.checksums.size() == n * m.slices && m.cost_s >= 0 && m.cost_s < 1e9 &&
         m.block_bytes <= max_bytes / n && total == m.block_bytes * n;
}

std::string EncodePutCommitRequest(const PutCommitRequest& m) {
  WireWriter w;
  w.U64(m.owner);
  w.U64(m.tensor);
  PutKeys(w, m.keys);
  return w.Take();
}

bool DecodePutCommitRequest(std::string_view body, PutCommitRequest& m) {
  WireReader r(body);
  m.owner = r.U64();
  m.tensor = r.U64();
  GetKeys(r, m.keys);
  return r.Done();
}

std::string EncodeAcquireRequest(const AcquireRequest& m) {
  WireWriter w;
  w.U32(m.lease_ms);
  w.U32(static_cast<uint32_t>(m.runs.size()));
  for (const Run& x : m.runs) {
    w.U64(x.owner);
    w.U64(x.tensor);
    w.U32(x.first);
    w.U32(x.count);
  }
  return w.Take();
}

bool DecodeAcquireRequest(std::string_view body, AcquireRequest& m) {
  WireReader r(body);
  m.lease_ms = r.U32();
  m.runs.resize(r.Count(kMaxKeys, 24));
  for (Run& x : m.runs) {
    x.owner = r.U64();
    x.tensor = r.U64();
    x.first = r.U32();
    x.count = r.U32();
  }
  return r.Done() && m.lease_ms > 0;
}

std::string EncodeAcquireReply(const AcquireReply& m) {
  WireWriter w;
  w.U64(m.lease);
  w.U32(static_cast<uint32_t>(m.runs.size()));
  for (const AcquiredRun& x : m.runs) {
    w.U8(x.found ? 1 : 0);
    w.U8(x.found ? x.tier : 0);
    w.U64(x.found ? x.addr : 0);
    w.U32(x.found ? x.count : 0);
    w.U64(x.found ? x.block_bytes : 0);
    w.U32(x.found ? x.slices : 0);
    if (x.found) {
      for (uint64_t s : x.checksums) w.U64(s);
    }
  }
  return w.Take();
}

bool DecodeAcquireReply(std::string_view body, size_t runs, AcquireReply& m) {
  WireReader r(body);
  m.lease = r.U64();
  if (r.U32() != runs || runs > kMaxKeys) return false;
  m.runs.resize(runs);
  for (AcquiredRun& x : m.runs) {
    x.found = r.U8() == 1;
    x.tier = r.U8();
    x.addr = r.U64();
    x.count = r.U32();
    x.block_bytes = r.U64();
    x.slices = r.U32();
    if (!r.ok()) return false;
    if (!x.found) continue;
    if (!ValidSlices(x.block_bytes, x.slices) || uint64_t{x.count} * x.slices > r.remaining() / 8) return false;
    x.checksums.resize(size_t{x.count} * x.slices);
    for (uint64_t& s : x.checksums) s = r.U64();
  }
  return r.Done();
}

std::string EncodeRelease(uint64_t lease) { return EncodeU64(lease); }
bool DecodeRelease(std::string_view body, uint64_t& lease) { return DecodeU64(body, lease); }

std::string EncodeForgetRequest(const std::vector<std::pair<uint64_t, uint64_t>>& gone) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(gone.size()));
  for (const auto& [owner, tensor] : gone) {
    w.U64(owner);
    w.U64(tensor);
  }
  return w.Take();
}

bool DecodeForgetRequest(std::string_view body, std::vector<std::pair<uint64_t, uint64_t>>& gone) {
  WireReader r(body);
  gone.resize(r.Count(kMaxKeys, 16));
  for (auto& [owner, tensor] : gone) {
    owner = r.U64();
    tensor = r.U64();
  }
  return r.Done();
}

std::string EncodeUnclaimRequest(const UnclaimRequest& m) {
  WireWriter w;
  w.U64(m.client);
  PutKeys(w, m.keys);
  return w.Take();
}

bool DecodeUnclaimRequest(std::string_view body, UnclaimRequest& m) {
  WireReader r(body);
  m.client = r.U64();
  GetKeys(r, m.keys);
  return r.Done();
}

std::string EncodeU32(uint32_t v) {
  WireWriter w;
  w.U32(v);
  return w.Take();
}

bool DecodeU32(std::string_view body, uint32_t& v) {
  WireReader r(body);
  v = r.U32();
  return r.Done();
}

std::string EncodeU64(uint64_t v) {
  WireWriter w;
  w.U64(v);
  return w.Take();
}

bool DecodeU64(std::string_view body, uint64_t& v) {
  WireReader r(body);
  v = r.U64();
  return r.Done();
}

std::string EncodeMembersReply(const std::vector<std::string>& addresses) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(addresses.size()));
  for (const std::string& a : addresses) w.Str(a);
  return w.Take();
}

namespace {
// StatsReply's fields in wire order.
template <typename F>
void ForEachStat(F&& f, StatsReply& m) {
  for (uint64_t* v : {&m.memory_used, &m.memory_capacity, &m.tensors, &m.replicas, &m.replica_bytes, &m.replica_hits,
                      &m.ssd_used, &m.ssd_capacity, &m.ssd_tensors, &m.ssd_reads, &m.lookups,
                      &m.lookup_blocks_matched, &m.acquire_hits, &m.acquire_misses, &m.puts, &m.evictions, &m.peers}) {
    f(*v);
  }
}
}  // namespace

std::string EncodeStatsReply(const StatsReply& m) {
  WireWriter w;
  StatsReply copy = m;
  ForEachStat([&](uint64_t& v) { w.U64(v); }, copy);
  return w.Take();
}

bool DecodeStatsReply(std::string_view body, StatsReply& m) {
  WireReader r(body);
  ForEachStat([&](uint64_t& v) { v = r.U64(); }, m);
  return r.Done();
}

bool DecodeMembersReply(std::string_view body, std::vector<std::string>& addresses) {
  WireReader r(body);
  const uint32_t n = r.Count(kMaxMembersReply, 4);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    std::string_view a = r.Str(kMaxAddressBytes);
    if (r.ok()) addresses.emplace_back(a);
  }
  return r.Done();
}

}  // namespace trellis::store

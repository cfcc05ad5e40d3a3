// libFuzzer target: store requests from a hostile peer, over real UCX on loopback.
//
// One StoreServer (1 MiB of memory, a few sequences stored) lives for the whole run; each
// input is one request: byte 0 picks the message type (any u16-range value below 16,
// mostly the real ones), the rest is its body, sent as is. The server must answer every
// request (a reply or an error) within 2 s (util/slowdown.h), and keep answering a well-formed Lookup
// afterwards: a crash, an ASan report, or a hang (abort) is a finding.
//
// PutData names the peer's memory for the server to read. The harness points every
// PutData's region and key at a buffer it registered (a fuzzed key would only be refused
// by the harness's transport, and the server's deeper paths never reached), and fuzzes
// the rest (keys, counts, block size, cost, segment addresses and lengths, which the
// server must check against that region).
//
// Byte 0 from 240 up sends the transport's own bulk-read messages instead (transport.h):
// a read request of the server's arena (its base and key from Hello, for half of them, so
// the segments are what the server's transport checks), read data or a read error for
// whatever get the request id names (the server's own reads of PutData have small ids),
// or a cancel; no answer is due, and the server must still serve the lookup after.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "net/transport.h"
#include "net/wire.h"
#include "store/client.h"
#include "store/protocol.h"
#include "store/server.h"
#include "util/checksum.h"
#include "util/slowdown.h"

using namespace trellis;
using namespace std::chrono_literals;

namespace {

struct Harness {
  std::unique_ptr<store::StoreServer> server;
  std::unique_ptr<net::Transport> peer;
  net::ConnId conn = 0;
  std::vector<uint8_t> region = std::vector<uint8_t>(1 << 20, 0x5a);
  net::Registration reg;
  std::string lookup;  // a well-formed Lookup of a stored sequence

  Harness() {
    setenv("UCX_NET_DEVICES", "lo", 0);
    store::ServerOptions so;
    so.mem_bytes = 1 << 20;
    so.transport.net_devices = "lo";
    so.max_lease_ms = 500;
    server = std::move(store::StoreServer::Start(so)).value();
    const std::string addr = "127.0.0.1:" + std::to_string(server->port());
    // A few sequences, so lookups and acquires meet real tensors.
    store::ClientOptions co;
    co.servers = {addr};
    co.transport.net_devices = "lo";
    auto client = std::move(store::StoreClient::Connect(co, net::After(5s))).value();
    store::Namespace ns;
    ns.block_tokens = 4;
    std::vector<std::vector<uint8_t>> blocks(8, std::vector<uint8_t>(4096, 7));
    std::vector<const void*> ptrs;
    for (auto& b : blocks) ptrs.push_back(b.data());
    std::vector<int32_t> tokens;
    for (int s = 0; s < 3; ++s) {
      tokens.assign(32, 0);
      for (int i = 0; i < 32; ++i) tokens[static_cast<size_t>(i)] = s * 100 + (i < 12 ? i : i + s);
      (void)client->Put(ns, tokens, ptrs, 4096, 1.0, net::After(5s));
    }
    net::WireWriter w;
    const auto keys = store::ChainKeys(ns, tokens);
    w.U32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) {
      w.U64(k.lo);
      w.U64(k.hi);
    }
    lookup = w.Take();
    peer = std::move(net::Transport::Create([] {
      net::TransportOptions o;
      o.net_devices = "lo";
      return o;
    }())).value();
    conn = peer->Sync([&] { return *peer->Connect("127.0.0.1", server->port()); });
    reg = peer->Sync([&] { return *peer->Register(region.data(), region.size()); });
    auto hello = Call(store::kHello, "");
    net::WireReader hr(*hello);
    hr.U64();
    arena_base = hr.U64();
    arena_length = hr.U64();
    arena_key = std::string(hr.Str(store::kMaxRkeyBytes));
  }
  uint64_t arena_base = 0, arena_length = 0;
  std::string arena_key;

  // One raw bulk-read message (see the top of this file); byte 1 is the request id.
  void SendRead(uint8_t which, std::string_view rest) {
    static constexpr uint16_t kFlags[4] = {net::MessageHeader::kRead, net::MessageHeader::kReadData,
                                            net::MessageHeader::kReadData | net::MessageHeader::kError,
                                            net::MessageHeader::kReadCancel};
    const uint64_t id = rest.empty() ? 1 : static_cast<uint8_t>(rest[0]);
    std::string body(rest.substr(rest.empty() ? 0 : 1));
    if (which % 4 == 0 && (which & 4)) {
      // The arena's base and key, then n segments inside it or just past (each at most
      // 64 KiB, so a read costs the run little).
      net::WireReader r(body);
      net::WireWriter w;
      w.U64(arena_base);
      w.Str(arena_key);
      const uint32_t n = std::min<uint32_t>(r.U32(), 64);
      w.U32(n);
      for (uint32_t i = 0; i < n; ++i) {
        w.U64(arena_base + r.U64() % (arena_length + 64));
        w.U64(r.U64() % (64 << 10));
      }
      body = w.Take();
    }
    peer->Sync([&] {
      if (!peer->IsConnected(conn)) conn = *peer->Connect("127.0.0.1", server->port());
      (void)peer->SendForTesting(conn, 0, kFlags[which % 4], id, std::move(body));
    });
  }

  Result<std::string> Call(uint16_t type, std::string body) {
    std::promise<Result<std::string>> p;
    auto f = p.get_future();
    peer->Post([&] {
      if (!peer->IsConnected(conn)) {  // the server cut us off for a bad message: reconnect
        conn = *peer->Connect("127.0.0.1", server->port());
      }
      peer->Call(conn, type, std::move(body), net::After(TestScaled(2s)), [&](Result<std::string> r) { p.set_value(std::move(r)); });
    });
    return f.get();
  }

  // Rewrites a PutData body's region (base, length, rkey) to this harness's buffer and
  // its segment addresses to offsets into that buffer (taken modulo its size plus a
  // little, so some fall outside and must be refused); every other byte stays fuzzed.
  std::string PinRegion(const std::string& body) {
    net::WireReader r(body);
    const uint32_t n = r.U32();
    if (!r.ok() || n > store::kMaxKeys || static_cast<uint64_t>(n) * 16 > r.remaining()) return body;
    for (uint32_t i = 0; i < n; ++i) {
      r.U64();
      r.U64();
    }
    r.U32();
    const uint64_t block_bytes = r.U64();
    const uint32_t slices = r.U32();
    r.F64();
    if (!r.ok()) return body;
    const std::string head = body.substr(0, body.size() - r.remaining());
    r.U64();
    r.U64();
    r.Str(store::kMaxRkeyBytes);
    net::WireWriter w;
    w.U64(reg.base);
    w.U64(reg.length);
    w.Str(reg.rkey);
    if (!r.ok()) return head + w.Take();
    const uint32_t nseg = r.U32();
    if (!r.ok() || nseg > 64 || static_cast<uint64_t>(nseg) * 16 > r.remaining()) return head + w.Take();
    w.U32(nseg);
    for (uint32_t i = 0; i < nseg; ++i) {
      w.U64(reg.base + r.U64() % (reg.length + 64));
      w.U64(r.U64());
    }
    // The writer's checksums: when the fuzzed list has the right length and its first
    // value is even, the right values for this buffer's bytes (every byte is 0x5a, so a
    // slice's checksum depends on its length only), so puts also get past the check.
    const size_t after_segments = r.remaining();
    const uint32_t nsums = r.U32();
    if (r.ok() && nsums == uint64_t{n} * slices && slices > 0 && block_bytes % slices == 0 &&
        block_bytes / slices <= region.size() && uint64_t{nsums} * 8 <= r.remaining()) {
      const uint64_t first = r.U64();
      if ((first & 1) == 0) {
        const uint64_t sum = Checksum64(region.data(), block_bytes / slices);
        w.U32(nsums);
        for (uint32_t i = 0; i < nsums; ++i) w.U64(sum);
        for (uint32_t i = 1; i < nsums; ++i) r.U64();
        return head + w.Take() + body.substr(body.size() - r.remaining());
      }
    }
    return head + w.Take() + body.substr(body.size() - after_segments);
  }
};

Harness& H() {
  static Harness* h = new Harness();  // never destroyed: libFuzzer exits without unwinding
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Harness& h = H();
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] >= 240) {
    h.SendRead(data[0], body);
    auto l = h.Call(store::kLookup, h.lookup);
    if (!l.ok() && l.status().code() != StatusCode::kUnavailable) {
      std::fprintf(stderr, "store_fuzz: a well-formed lookup failed after a read message: %s\n", l.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  const uint16_t type = data[0] < 224 ? static_cast<uint16_t>(1 + data[0] % 11) : static_cast<uint16_t>(data[0] % 16);
  if (type == store::kPutData) body = h.PinRegion(body);
  auto r = h.Call(type, std::move(body));
  if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded) {
    std::fprintf(stderr, "store_fuzz: no answer within %lld ms to a type %u request\n", static_cast<long long>(TestScaled(2s).count()), type);
    std::abort();
  }
  // The server still serves a well-formed request.
  auto l = h.Call(store::kLookup, h.lookup);
  if (!l.ok() && l.status().code() != StatusCode::kUnavailable) {
    std::fprintf(stderr, "store_fuzz: a well-formed lookup failed: %s\n", l.status().ToString().c_str());
    std::abort();
  }
  return 0;
}

// net::Transport over real UCX on loopback (tcp) and over memory (the loopback link):
// calls and replies, errors, rendezvous bodies, size limits, scattered bulk gets,
// deadlines on both; and on UCX, peers that die (a second process, this binary re-run
// with --serve, killed with SIGKILL).
#include "net/transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "net/wire.h"
#include "util/slowdown.h"

namespace trellis::net {
namespace {

using namespace std::chrono_literals;

constexpr uint16_t kEcho = 1, kFail = 2, kSilent = 3, kRegion = 4;

// Which link the in-process tests run on: UCX over lo, or memory (TransportOptions::
// loopback); the same tests, both ways (TransportOnEveryLink).
bool g_memory = false;

TransportOptions Loopback() {
  TransportOptions o;
  o.net_devices = "lo";
  o.loopback = g_memory;
  return o;
}

class TransportOnEveryLink : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { g_memory = GetParam(); }
  void TearDown() override { g_memory = false; }
};

// A server answering: kEcho with the body, kFail with an error, kSilent never, kRegion
// with a registered 8 MiB region (base, length, rkey) filled with a known pattern.
struct EchoServer {
  std::unique_ptr<Transport> t;
  std::vector<uint8_t> region;
  Registration reg;
  uint16_t port = 0;

  explicit EchoServer(TransportOptions o = Loopback(), size_t region_bytes = 8 << 20) {
    auto r = Transport::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    t = std::move(r).value();
    region.resize(region_bytes);
    for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    port = t->Sync([&]() -> uint16_t {
      t->SetRequestHandler([this](ConnId c, uint16_t type, uint64_t rid, std::string_view body) {
        if (type == kEcho) t->Reply(c, rid, std::string(body));
        if (type == kFail) t->ReplyError(c, rid, ResourceExhausted("full: " + std::string(body)));
        if (type == kRegion) {
          WireWriter w;
          w.U64(reg.base);
          w.U64(reg.length);
          w.Str(reg.rkey);
          t->Reply(c, rid, w.Take());
        }
      });
      auto g = t->Register(region.data(), region.size());
      EXPECT_TRUE(g.ok()) << g.status().ToString();
      reg = *g;
      auto p = t->Listen("127.0.0.1", 0);
      EXPECT_TRUE(p.ok()) << p.status().ToString();
      return p.ok() ? *p : 0;
    });
  }
};

struct Client {
  std::unique_ptr<Transport> t;
  explicit Client(TransportOptions o = Loopback()) {
    auto r = Transport::Create(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    t = std::move(r).value();
  }
  ConnId Connect(uint16_t port) {
    return t->Sync([&] {
      auto c = t->Connect("127.0.0.1", port);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      return c.ok() ? *c : ConnId{0};
    });
  }
  Result<std::string> Call(ConnId c, uint16_t type, std::string body, std::chrono::milliseconds d = 5000ms) {
    std::promise<Result<std::string>> p;
    auto f = p.get_future();
    t->Post([&] { t->Call(c, type, std::move(body), After(d), [&](Result<std::string> r) { p.set_value(std::move(r)); }); });
    return f.get();
  }
  Status Get(ConnId c, const RemoteRegion& region, std::vector<Segment> segs, std::chrono::milliseconds d = 5000ms) {
    std::promise<Status> p;
    auto f = p.get_future();
    t->Post([&] { t->Get(c, region, std::move(segs), After(d), [&](Status s) { p.set_value(s); }); });
    return f.get();
  }
  RemoteRegion Region(ConnId c) {
    auto r = Call(c, kRegion, "");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    RemoteRegion out;
    if (!r.ok()) return out;
    WireReader rd(*r);
    out.base = rd.U64();
    out.length = rd.U64();
    out.rkey = std::string(rd.Str(1 << 16));
    EXPECT_TRUE(rd.Done());
    return out;
  }
};

TEST(Wire, ReaderRefusesEveryOverrun) {
  WireWriter w;
  w.U32(7);
  w.Str("hello");
  w.U64(1ull << 40);
  const std::string b = w.Take();
  WireReader ok(b);
  EXPECT_EQ(ok.U32(), 7u);
  EXPECT_EQ(ok.Str(16), "hello");
  EXPECT_EQ(ok.U64(), 1ull << 40);
  EXPECT_TRUE(ok.Done());
  WireReader too_long(b);
  too_long.U32();
  EXPECT_EQ(too_long.Str(4), "");  // over max_len
  EXPECT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.U64(), 0u);  // sticky
  for (size_t cut = 0; cut < b.size(); ++cut) {  // every truncation fails, none reads past
    WireReader r(std::string_view(b).substr(0, cut));
    r.U32();
    r.Str(16);
    r.U64();
    EXPECT_FALSE(r.ok()) << cut;
  }
  WireWriter c;
  c.U32(1000000);
  const std::string cb = c.Take();
  WireReader counts(cb);
  EXPECT_EQ(counts.Count(1u << 30, 8), 0u);  // a million 8-byte items cannot fit in 0 bytes
  EXPECT_FALSE(counts.ok());
}

TEST_P(TransportOnEveryLink, CallsRepliesAndErrors) {
  EchoServer s;
  Client c;
  const ConnId conn = c.Connect(s.port);
  auto r = c.Call(conn, kEcho, "ping");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "ping");
  auto e = c.Call(conn, kFail, "pool");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(e.status().message(), "full: pool");
  // Many calls in flight at once each get their own reply.
  std::vector<std::promise<Result<std::string>>> ps(64);
  std::vector<std::future<Result<std::string>>> fs;
  for (auto& p : ps) fs.push_back(p.get_future());
  c.t->Post([&] {
    for (size_t i = 0; i < ps.size(); ++i) {
      c.t->Call(conn, kEcho, std::to_string(i), After(5000ms), [&, i](Result<std::string> r) { ps[i].set_value(std::move(r)); });
    }
  });
  for (size_t i = 0; i < fs.size(); ++i) {
    auto x = fs[i].get();
    ASSERT_TRUE(x.ok());
    EXPECT_EQ(*x, std::to_string(i));
  }
}

TEST_P(TransportOnEveryLink, LargeBodiesArriveWholeAndLimitsHold) {
  TransportOptions small = Loopback();
  small.max_message_bytes = 1 << 20;
  EchoServer s(small);
  Client c;
  const ConnId conn = c.Connect(s.port);
  std::string big(1 << 20, '\0');
  std::mt19937 rng(1);
  for (char& ch : big) ch = static_cast<char>(rng());
  auto r = c.Call(conn, kEcho, big);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(*r == big);
  // One byte over the server's limit: refused there, and the server cuts the connection.
  auto over = c.Call(conn, kEcho, big + "x", 3000ms);
  EXPECT_FALSE(over.ok());
  EXPECT_GE(s.t->stats().messages_refused, 1u);
  // The sender's own limit refuses before sending.
  Client tiny([] {
    TransportOptions o = Loopback();
    o.max_message_bytes = 10;
    return o;
  }());
  const ConnId c2 = tiny.Connect(s.port);
  auto refused = tiny.Call(c2, kEcho, std::string(11, 'a'));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST_P(TransportOnEveryLink, ScatteredGetsLandInPlace) {
  EchoServer s;
  Client c;
  const ConnId conn = c.Connect(s.port);
  const RemoteRegion region = c.Region(conn);
  ASSERT_EQ(region.length, s.region.size());
  // 16 segments of different sizes at scattered offsets, into one destination buffer
  // laid out differently.
  std::vector<uint8_t> dst(8 << 20, 0);
  std::vector<Segment> segs;
  std::vector<std::pair<size_t, size_t>> want;  // (remote offset, local offset)
  size_t local = 0;
  for (size_t i = 0; i < 16; ++i) {
    const size_t len = 4096 + i * 65536;
    const size_t off = (15 - i) * 500000 + 17;
    segs.push_back({region.base + off, dst.data() + local, len});
    want.emplace_back(off, local);
    local += len;
  }
  ASSERT_LE(local, dst.size());
  ASSERT_TRUE(c.Get(conn, region, segs).ok());
  for (size_t i = 0; i < segs.size(); ++i) {
    ASSERT_EQ(std::memcmp(dst.data() + want[i].second, s.region.data() + want[i].first, segs[i].length), 0) << i;
  }
  EXPECT_EQ(c.t->stats().get_segments, 16u);
  // A segment past the region's end, or wrapping around, is refused before anything moves.
  for (Segment bad : {Segment{region.base + region.length - 10, dst.data(), 11},
                      Segment{region.base - 1, dst.data(), 8}, Segment{region.base + 8, dst.data(), ~uint64_t{0}}}) {
    const Status st = c.Get(conn, region, {bad});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  }
  EXPECT_TRUE(c.t->Sync([&] { return c.t->IsConnected(conn); }));
}


// Fault injection for chaos runs: fault_flip_landed_every = 3 flips exactly one byte,
// just past the middle, of every third segment a Get lands, and counts each; the rest
// land whole.
TEST_P(TransportOnEveryLink, TheFaultHookFlipsOneByteInEveryNthLandedSegment) {
  EchoServer s;
  TransportOptions o = Loopback();
  o.fault_flip_landed_every = 3;
  Client c(o);
  const ConnId conn = c.Connect(s.port);
  const RemoteRegion region = c.Region(conn);
  std::vector<uint8_t> dst(9 * 4096, 0);
  std::vector<Segment> segs;
  for (size_t i = 0; i < 9; ++i) segs.push_back({region.base + i * 8192, dst.data() + i * 4096, 4096});
  ASSERT_TRUE(c.Get(conn, region, segs).ok());
  std::vector<size_t> flipped;
  for (size_t i = 0; i < 9; ++i) {
    size_t diffs = 0;
    for (size_t j = 0; j < 4096; ++j) diffs += dst[i * 4096 + j] != s.region[i * 8192 + j];
    if (diffs > 0) {
      EXPECT_EQ(diffs, 1u) << "segment " << i;
      EXPECT_EQ(dst[i * 4096 + 2049], s.region[i * 8192 + 2049] ^ 0x40) << "segment " << i;
      flipped.push_back(i);
    }
  }
  EXPECT_EQ(flipped.size(), 3u);
  EXPECT_EQ(c.t->stats().faults_injected, 3u);
}
// The owner serves only what it registered, to a reader that names the region's key: a
// reader that lies about the region (a wrong key, a longer length, a base that is not
// one) is refused by the owner, and the connection stays up.
TEST_P(TransportOnEveryLink, TheOwnerChecksEveryRead) {
  EchoServer s;
  Client c;
  const ConnId conn = c.Connect(s.port);
  const RemoteRegion region = c.Region(conn);
  std::vector<uint8_t> dst(1 << 20);
  RemoteRegion wrong_key = region;
  wrong_key.rkey[3] ^= 1;
  Status st = c.Get(conn, wrong_key, {{region.base, dst.data(), 4096}});
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  RemoteRegion longer = region;
  longer.length += 1 << 20;
  st = c.Get(conn, longer, {{region.base + region.length - 100, dst.data(), 4096}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  RemoteRegion shifted = region;
  shifted.base -= 4096;
  shifted.length += 4096;
  st = c.Get(conn, shifted, {{shifted.base, dst.data(), 4096}});
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_EQ(s.t->stats().read_bytes_served, 0u);
  EXPECT_EQ(s.t->stats().reads_refused, 3u);
  // Still connected and served: empty segments land at once, chunks of odd sizes whole.
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_TRUE(c.Get(conn, region,
                    {{region.base + 5, dst.data(), 0}, {region.base + 7, dst.data() + 1, (300 << 10) + 3}, {region.base, dst.data(), 0}})
                  .ok());
  EXPECT_EQ(std::memcmp(dst.data() + 1, s.region.data() + 7, (300 << 10) + 3), 0);
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(s.t->stats().reads_served, 1u);
}

TEST_P(TransportOnEveryLink, DeadlinesBoundSilentPeersAndAbsentOnes) {
  EchoServer s;
  Client c;
  const ConnId conn = c.Connect(s.port);
  const auto t0 = Clock::now();
  auto r = c.Call(conn, kSilent, "", 200ms);
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - t0, TestScaled(2s));
  EXPECT_TRUE(c.Call(conn, kEcho, "still up").ok());  // a late reply does not break the connection
  // Nobody listens on this port: the call fails (connection refused) or times out, never hangs.
  const uint16_t dead_port = [&] {
    EchoServer gone;
    return gone.port;
  }();
  const ConnId dead = c.Connect(dead_port);
  const auto t1 = Clock::now();
  auto d = c.Call(dead, kEcho, "x", 2000ms);
  EXPECT_FALSE(d.ok());
  EXPECT_LT(Clock::now() - t1, TestScaled(5s));
}

INSTANTIATE_TEST_SUITE_P(Links, TransportOnEveryLink, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "Memory" : "Ucx"; });

// --- a peer in another process, killed mid-conversation ---------------------------------

std::string g_self;

struct Child {
  pid_t pid = -1;
  uint16_t port = 0;
  Child() {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      execl(g_self.c_str(), g_self.c_str(), "--serve", nullptr);
      _exit(127);
    }
    close(fds[1]);
    // The child prints "PORT n" (UCX may print warnings to stdout before it).
    FILE* in = fdopen(fds[0], "r");
    char line[512];
    while (in && std::fgets(line, sizeof line, in)) {
      if (std::strncmp(line, "PORT ", 5) == 0) {
        port = static_cast<uint16_t>(std::atoi(line + 5));
        break;
      }
    }
    if (in) std::fclose(in);
  }
  void Kill() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  // SIGSTOP, then waits until every thread of the child is stopped: kill() returns when
  // the signal is queued, and a thread running on another (virtual) CPU may still run,
  // and serve a read, until it takes the stop. True once all are stopped (within 10 s).
  bool Stop() {
    if (kill(pid, SIGSTOP) != 0) return false;
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
      bool all = true;
      std::error_code ec;
      for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        std::ifstream f(task.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const size_t paren = stat.rfind(')');  // the state follows the command name
        if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') all = false;
      }
      if (all && !ec) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
  ~Child() { Kill(); }
};

TEST(Transport, AKilledPeerFailsItsCallsAndGetsWithinTheirDeadline) {
  Child child;
  ASSERT_GT(child.port, 0);
  Client c;
  std::atomic<int> disconnects{0};
  c.t->Sync([&] { c.t->SetDisconnectHandler([&](ConnId, const Status&) { ++disconnects; }); });
  const ConnId conn = c.Connect(child.port);
  ASSERT_TRUE(c.Call(conn, kEcho, "hi").ok());
  const RemoteRegion region = c.Region(conn);
  std::vector<uint8_t> dst(8 << 20);
  ASSERT_TRUE(c.Get(conn, region, {{region.base, dst.data(), dst.size()}}).ok());
  // Kill it while gets are in flight: the get finishes (failed) within its deadline, and
  // the calls after it fail too.
  std::promise<Status> p;
  auto f = p.get_future();
  c.t->Post([&] {
    std::vector<Segment> segs;
    for (int i = 0; i < 8; ++i) segs.push_back({region.base + (i << 20), dst.data() + (i << 20), 1 << 20});
    c.t->Get(conn, region, segs, After(3000ms), [&](Status s) { p.set_value(s); });
  });
  child.Kill();
  const auto t0 = Clock::now();
  const Status got = f.get();  // either finished before the kill, or failed: never hangs
  EXPECT_LT(Clock::now() - t0, TestScaled(5s));
  auto after = c.Call(conn, kEcho, "x", 3000ms);
  EXPECT_FALSE(after.ok());
  EXPECT_LT(Clock::now() - t0, TestScaled(9s));
  std::printf("get after kill: %s; call after kill: %s\n", got.ToString().c_str(), after.status().ToString().c_str());
}

// A get whose owner stops (SIGSTOP) fails at its deadline and leaves the connection up:
// when the owner resumes, what it still sends for that get is dropped (the buffer the
// caller refilled keeps its bytes), and the next call and get on the connection succeed.
TEST(Transport, AGetPastItsDeadlineDropsLateBytesAndKeepsTheConnection) {
  Child child;
  ASSERT_GT(child.port, 0);
  Client c;
  const ConnId conn = c.Connect(child.port);
  const RemoteRegion region = c.Region(conn);
  std::vector<uint8_t> want(8 << 20);
  ASSERT_TRUE(c.Get(conn, region, {{region.base, want.data(), want.size()}}).ok());
  std::vector<uint8_t> dst(8 << 20, 0);
  ASSERT_TRUE(child.Stop());
  const Status st = c.Get(conn, region, {{region.base, dst.data(), dst.size()}}, 300ms);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  std::fill(dst.begin(), dst.end(), 0xA7);
  kill(child.pid, SIGCONT);
  auto r = c.Call(conn, kEcho, "after");  // the owner has read the get (and its cancel) by now
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "after");
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](uint8_t x) { return x == 0xA7; })) << "late bytes landed";
  ASSERT_TRUE(c.Get(conn, region, {{region.base, dst.data(), dst.size()}}).ok());
  EXPECT_EQ(dst, want);
}

}  // namespace
}  // namespace trellis::net

int main(int argc, char** argv) {
  using namespace trellis::net;
  if (argc > 1 && std::string(argv[1]) == "--serve") {
    EchoServer s;
    std::printf("PORT %u\n", s.port);
    std::fflush(stdout);
    for (;;) pause();
  }
  trellis::net::g_self = "/proc/self/exe";
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) trellis::net::g_self.assign(buf, static_cast<size_t>(n));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

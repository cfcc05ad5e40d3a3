#include "net/transport.h"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <future>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "net/link.h"
#include "net/wire.h"
#include "util/log.h"

namespace trellis::net {

namespace {

// Reads served by the owner (transport.h): the bytes of one read-data message (a little
// under the default tcp segment, tcp_tx_seg_size 256k, so a chunk and its headers go in
// one piece: 128 KiB chunks read 15% slower), how many of them a transport keeps handed
// to UCX at once, and the bounds on one read request and on reads queued.
constexpr uint64_t kReadChunk = (256 << 10) - 256;
constexpr uint64_t kServeWindow = 16 << 20;
constexpr uint32_t kMaxReadSegments = 1 << 20;
constexpr size_t kMaxServing = 4096;
constexpr size_t kReadDataPrefix = 12;  // u32 segment, u64 offset

std::string EncodeHeader(const MessageHeader& h) {
  WireWriter w;
  w.U32(MessageHeader::kMagic);
  w.U16(MessageHeader::kVersion);
  w.U16(h.type);
  w.U16(h.flags);
  w.U16(0);
  w.U64(h.request_id);
  w.U32(h.body_bytes);
  return w.Take();
}

// nullopt-like: ok() false when the header is not ours or not this version.
bool DecodeHeader(std::string_view b, MessageHeader& h) {
  if (b.size() != MessageHeader::kBytes) return false;
  WireReader r(b);
  const uint32_t magic = r.U32();
  const uint16_t version = r.U16();
  h.type = r.U16();
  h.flags = r.U16();
  r.U16();
  h.request_id = r.U64();
  h.body_bytes = r.U32();
  return r.Done() && magic == MessageHeader::kMagic && version == MessageHeader::kVersion;
}

std::string EncodeError(const Status& error) {
  WireWriter w;
  w.U32(static_cast<uint32_t>(error.code()));
  w.Str(std::string_view(error.message()).substr(0, 4096));
  return w.Take();
}

// The largest body a message may carry: the configured limit, except that read data is
// always accepted in chunks (its size is the protocol's, not the peer's choice).
size_t BodyLimit(const TransportOptions& o, uint16_t flags) {
  return (flags & MessageHeader::kReadData) ? std::max(o.max_message_bytes, kReadChunk + kReadDataPrefix)
                                            : o.max_message_bytes;
}

}  // namespace

struct Transport::Impl final : LinkEvents {
  struct Conn {
    EndpointId ep = 0;
    bool alive = true;
    std::string peer;
  };
  struct PendingCall {
    ConnId conn;
    ReplyCallback done;
    uint64_t timer;
  };
  struct PendingGet {  // a Get of ours, its chunks arriving
    ConnId conn;
    DoneCallback done;
    uint64_t timer = 0;
    SegmentCallback on_segment;  // optional: each segment that landed, as it lands
    std::vector<Segment> segments;
    std::vector<uint64_t> first_chunk;  // per segment: its first chunk's index in `arrived`
    std::vector<uint64_t> chunks_left;  // per segment
    std::vector<bool> arrived;          // per chunk
    uint64_t total_left = 0;
  };
  struct ServeRead {  // a peer's Get of one of our regions, being served
    ConnId conn;
    uint64_t id;
    uint64_t base;
    std::string key;
    std::vector<std::pair<uint64_t, uint64_t>> segments;  // (address, length)
    size_t segment = 0;
    uint64_t offset = 0;
  };
  struct Region {
    uint64_t length;
    std::string key;
  };
  TransportOptions opt;
  std::unique_ptr<Link> link;
  int wake_fd = -1, ep_fd = -1;
  std::thread thread;
  std::thread::id loop_id;
  std::atomic<bool> stop{false};

  std::mutex mu;  // guards tasks
  std::deque<std::function<void()>> tasks;

  ConnId next_conn = 1;
  std::unordered_map<ConnId, Conn> conns;
  std::unordered_map<EndpointId, ConnId> by_ep;

  uint64_t next_request = 1;
  std::unordered_map<uint64_t, PendingCall> calls;
  uint64_t next_get = 1;
  std::unordered_map<uint64_t, PendingGet> gets;
  std::deque<ServeRead> serving;  // reads of our regions, each served a chunk in turn
  uint64_t serve_inflight = 0;    // read-data bytes handed to UCX and not yet sent
  bool pump_wanted = false;       // a read arrived or a chunk went: Pump() after progress

  uint64_t next_timer = 1;
  std::multimap<Deadline, uint64_t> timer_queue;
  std::unordered_map<uint64_t, std::pair<Deadline, std::function<void()>>> timers;

  std::map<uint64_t, Region> regions;
  std::mt19937_64 key_rng{std::random_device{}()};
  RequestHandler on_request;
  std::function<void(ConnId, const Status&)> on_disconnect;
  TransportStats stats;
  mutable std::mutex stats_mu;

  ~Impl();
  Status Init();
  void Loop();
  void RunTasks();
  void RunTimers(int& wait_ms);
  void Wake() override {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
  }

  ConnId AddConn(EndpointId ep, std::string peer) {
    const ConnId id = next_conn++;
    conns[id] = Conn{ep, true, std::move(peer)};
    by_ep[ep] = id;
    return id;
  }
  void FailConn(ConnId id, const Status& why, bool notify);
  Status Send(ConnId c, const MessageHeader& h, std::string body, uint64_t serve_bytes = 0);
  void Dispatch(ConnId c, const MessageHeader& h, std::string_view body);
  Status DecodeError(ConnId c, std::string_view body);
  void SendReadError(ConnId c, uint64_t id, const Status& error);
  void OnRead(ConnId c, uint64_t id, std::string_view body);
  void OnReadData(ConnId c, const MessageHeader& h, std::string_view body);
  void Pump();
  void FinishGet(uint64_t id, Status status);
  void Landed(PendingGet& g, size_t segment) {
    if (landed_hook) landed_hook(g.segments[segment].local, g.segments[segment].length);
    if (opt.fault_flip_landed_every > 0 && g.segments[segment].length > 0 &&
        ++landed_segments % opt.fault_flip_landed_every == 0) {
      auto* seg = static_cast<uint8_t*>(g.segments[segment].local);
      seg[std::min(g.segments[segment].length - 1, g.segments[segment].length / 2 + 1)] ^= 0x40;
      std::lock_guard<std::mutex> lock(stats_mu);
      ++stats.faults_injected;
    }
    if (g.on_segment) g.on_segment(segment);
  }
  std::function<void(void*, uint64_t)> landed_hook;
  uint64_t landed_segments = 0;  // fault_flip_landed_every counts them

  // LinkEvents
  void OnAccept(EndpointId ep, std::string peer) override { AddConn(ep, std::move(peer)); }
  bool Accepts(EndpointId ep, std::string_view header, size_t body_bytes) override;
  void OnMessage(EndpointId ep, std::string_view header, std::string_view body) override;
  void OnFailed(EndpointId ep, const Status& why) override;
  void OnSent(uint64_t serve_bytes) override {
    serve_inflight -= serve_bytes;
    pump_wanted = true;
  }
};

Transport::Impl::~Impl() {
  link.reset();  // before the wake fd its events use
  if (ep_fd >= 0) close(ep_fd);
  if (wake_fd >= 0) close(wake_fd);
}

Status Transport::Impl::Init() {
  if (opt.loopback) {
    TRELLIS_ASSIGN_OR_RETURN(link, MakeLoopbackLink(opt, this));
  } else {
    TRELLIS_ASSIGN_OR_RETURN(link, MakeUcxLink(opt, this));
  }
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ep_fd = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || ep_fd < 0) return IoError("eventfd/epoll_create1 failed");
  for (int fd : {link->fd(), wake_fd}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(ep_fd, EPOLL_CTL_ADD, fd, &ev) != 0) return IoError("epoll_ctl failed");
  }
  return Status::Ok();
}

void Transport::Impl::RunTasks() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(mu);
    batch.swap(tasks);
  }
  for (auto& fn : batch) fn();
}

void Transport::Impl::RunTimers(int& wait_ms) {
  const Deadline now = Clock::now();
  while (!timer_queue.empty() && timer_queue.begin()->first <= now) {
    const uint64_t id = timer_queue.begin()->second;
    timer_queue.erase(timer_queue.begin());
    auto it = timers.find(id);
    if (it == timers.end()) continue;
    auto fn = std::move(it->second.second);
    timers.erase(it);
    fn();
  }
  wait_ms = 100;  // also bounds how long a missed wake-up could stall
  if (!timer_queue.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(timer_queue.begin()->first - Clock::now());
    wait_ms = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 100));
  }
}

void Transport::Impl::Loop() {
  loop_id = std::this_thread::get_id();
  Deadline last_work = Clock::now();
  const auto spin = std::chrono::microseconds(opt.spin_us);
  while (!stop.load(std::memory_order_acquire)) {
    RunTasks();
    int wait_ms = 0;
    RunTimers(wait_ms);
    bool worked = false;
    while (link->Progress()) worked = true;
    if (pump_wanted) {
      Pump();
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!tasks.empty()) continue;
    }
    if (wait_ms == 0) continue;
    // Busy for a moment after work before sleeping: peers' reads are served by this loop,
    // and each wake-up from epoll costs them latency.
    const Deadline now = Clock::now();
    if (worked) last_work = now;
    if (now - last_work < spin) continue;
    if (!link->Arm()) continue;  // events arrived meanwhile: progress again
    epoll_event evs[2];
    const int n = epoll_wait(ep_fd, evs, 2, wait_ms);
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.fd == wake_fd) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(wake_fd, &v, sizeof v);
      }
    }
  }
  // Shutting down: fail what is pending, close endpoints, finish the closes.
  RunTasks();
  std::vector<ConnId> ids;
  for (auto& [id, c] : conns) ids.push_back(id);
  for (ConnId id : ids) FailConn(id, Cancelled("transport shutting down"), /*notify=*/false);
  timers.clear();
  timer_queue.clear();
  link->Shutdown(After(std::chrono::milliseconds(2000)));
}

void Transport::Impl::FailConn(ConnId id, const Status& why, bool notify) {
  auto it = conns.find(id);
  if (it == conns.end() || !it->second.alive) return;
  Conn& c = it->second;
  c.alive = false;
  link->Close(c.ep);
  by_ep.erase(c.ep);
  c.ep = 0;
  std::vector<std::pair<uint64_t, PendingCall>> failed;
  for (auto cit = calls.begin(); cit != calls.end();) {
    if (cit->second.conn == id) {
      failed.emplace_back(cit->first, std::move(cit->second));
      cit = calls.erase(cit);
    } else {
      ++cit;
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (why.code() == StatusCode::kUnavailable) ++stats.connections_failed;
  }
  for (auto& [rid, pc] : failed) {
    timers.erase(pc.timer);
    pc.done(why);
  }
  std::erase_if(serving, [id](const ServeRead& r) { return r.conn == id; });
  std::vector<uint64_t> ours;
  for (auto& [gid, g] : gets) {
    if (g.conn == id) ours.push_back(gid);
  }
  for (uint64_t gid : ours) FinishGet(gid, why);
  if (notify && on_disconnect) on_disconnect(id, why);
  conns.erase(id);
}

Status Transport::Impl::Send(ConnId c, const MessageHeader& h, std::string body, uint64_t serve_bytes) {
  auto it = conns.find(c);
  if (it == conns.end() || !it->second.alive) return Unavailable("connection " + std::to_string(c) + " is closed");
  if (body.size() > BodyLimit(opt, h.flags)) {
    return InvalidArgument("message of " + std::to_string(body.size()) + " bytes is over the limit of " +
                           std::to_string(opt.max_message_bytes));
  }
  MessageHeader hh = h;
  hh.body_bytes = static_cast<uint32_t>(body.size());
  const size_t n = body.size();
  serve_inflight += serve_bytes;
  if (Status st = link->Send(it->second.ep, EncodeHeader(hh), std::move(body), serve_bytes); !st.ok()) {
    serve_inflight -= serve_bytes;
    return Unavailable("send to " + it->second.peer + ": " + st.message());
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  ++stats.messages_sent;
  stats.bytes_sent += n;
  return Status::Ok();
}

void Transport::Impl::Dispatch(ConnId c, const MessageHeader& h, std::string_view body) {
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.messages_received;
    stats.bytes_received += body.size();
  }
  if (h.flags & MessageHeader::kReadData) return OnReadData(c, h, body);
  if (h.flags & MessageHeader::kRead) return OnRead(c, h.request_id, body);
  if (h.flags & MessageHeader::kReadCancel) {
    std::erase_if(serving, [&](const ServeRead& r) { return r.conn == c && r.id == h.request_id; });
    return;
  }
  if (h.flags & MessageHeader::kReply) {
    auto it = calls.find(h.request_id);
    if (it == calls.end() || it->second.conn != c) return;  // timed out already, or not ours
    PendingCall pc = std::move(it->second);
    calls.erase(it);
    timers.erase(pc.timer);
    if (h.flags & MessageHeader::kError) {
      pc.done(DecodeError(c, body));
    } else {
      pc.done(std::string(body));
    }
    return;
  }
  if ((h.flags & MessageHeader::kRequest) && on_request) on_request(c, h.type, h.request_id, body);
}

Status Transport::Impl::DecodeError(ConnId c, std::string_view body) {
  WireReader r(body);
  const uint32_t code = r.U32();
  const std::string_view msg = r.Str(4096);
  if (!r.Done() || code == 0 || code > static_cast<uint32_t>(kLastStatusCode)) {
    return Corrupt("malformed error reply from " + conns[c].peer);
  }
  return Status(static_cast<StatusCode>(code), std::string(msg));
}

void Transport::Impl::SendReadError(ConnId c, uint64_t id, const Status& error) {
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.reads_refused;
  }
  MessageHeader h;
  h.flags = MessageHeader::kReadData | MessageHeader::kError;
  h.request_id = id;
  (void)Send(c, h, EncodeError(error));
}

// A peer's read request: u64 region base, str key, u32 n, n x (u64 address, u64 length).
void Transport::Impl::OnRead(ConnId c, uint64_t id, std::string_view body) {
  WireReader r(body);
  ServeRead sr{c, id, r.U64(), std::string(r.Str(64)), {}};
  const uint32_t n = r.Count(kMaxReadSegments, 16);
  sr.segments.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t addr = r.U64();
    sr.segments.emplace_back(addr, r.U64());
  }
  if (!r.Done()) return SendReadError(c, id, Corrupt("malformed read request"));
  auto it = regions.find(sr.base);
  if (it == regions.end() || it->second.key != sr.key) {
    return SendReadError(c, id, NotFound("no such registered region (gone, or a wrong key)"));
  }
  for (const auto& [addr, len] : sr.segments) {
    if (addr < sr.base || len > it->second.length || addr - sr.base > it->second.length - len) {
      return SendReadError(c, id, InvalidArgument("a read segment is outside the region"));
    }
  }
  if (serving.size() >= kMaxServing) return SendReadError(c, id, ResourceExhausted("too many reads queued"));
  serving.push_back(std::move(sr));
  pump_wanted = true;
}

// Hands read data to UCX, a chunk of each queued read in turn, until the window is full.
// The bytes are copied out of the region here, on the loop thread, after checking that
// it is still registered: once Unregister returns, no read touches its memory.
void Transport::Impl::Pump() {
  pump_wanted = false;
  while (!serving.empty() && serve_inflight < kServeWindow) {
    ServeRead sr = std::move(serving.front());
    serving.pop_front();
    auto skip_empty = [&] {
      while (sr.segment < sr.segments.size() && sr.segments[sr.segment].second == 0) ++sr.segment;
    };
    skip_empty();
    if (sr.segment == sr.segments.size()) continue;
    auto rit = regions.find(sr.base);
    if (rit == regions.end() || rit->second.key != sr.key) {
      SendReadError(sr.conn, sr.id, Unavailable("the region was unregistered during the read"));
      continue;
    }
    const auto [addr, len] = sr.segments[sr.segment];
    const uint64_t n = std::min(kReadChunk, len - sr.offset);
    WireWriter w;
    w.U32(static_cast<uint32_t>(sr.segment));
    w.U64(sr.offset);
    std::string body = w.Take();
    body.append(reinterpret_cast<const char*>(addr + sr.offset), n);
    MessageHeader h;
    h.flags = MessageHeader::kReadData;
    h.request_id = sr.id;
    sr.offset += n;
    if (sr.offset == len) {
      ++sr.segment;
      sr.offset = 0;
      skip_empty();
    }
    const bool last = sr.segment == sr.segments.size();
    // Counted before the send: the reader may see its read complete before this thread
    // runs again, and whoever it tells must find the read counted.
    auto count = [&](int sign) {
      std::lock_guard<std::mutex> lock(stats_mu);
      stats.read_bytes_served += sign * static_cast<int64_t>(n);
      if (last) stats.reads_served += sign;
    };
    count(+1);
    if (!Send(sr.conn, h, std::move(body), n).ok()) {  // the reader is gone: so is its read
      count(-1);
      continue;
    }
    if (!last) serving.push_back(std::move(sr));
  }
}

// A chunk of one of our Gets (u32 segment, u64 offset, the bytes), or its failure.
void Transport::Impl::OnReadData(ConnId c, const MessageHeader& h, std::string_view body) {
  auto it = gets.find(h.request_id);
  if (it == gets.end() || it->second.conn != c) return;  // timed out or cancelled: dropped
  PendingGet& g = it->second;
  if (h.flags & MessageHeader::kError) return FinishGet(h.request_id, DecodeError(c, body));
  WireReader r(body);
  const uint32_t seg = r.U32();
  const uint64_t off = r.U64();
  const std::string_view data = body.substr(std::min(body.size(), kReadDataPrefix));
  bool good = r.ok() && seg < g.segments.size() && off % kReadChunk == 0 && off < g.segments[seg].length &&
              data.size() == std::min(kReadChunk, g.segments[seg].length - off);
  const uint64_t chunk = good ? g.first_chunk[seg] + off / kReadChunk : 0;
  if (good && g.arrived[chunk]) good = false;  // a chunk twice: some other chunk would be missing
  if (!good) {
    FinishGet(h.request_id, Corrupt("malformed read data from " + conns[c].peer));
    std::lock_guard<std::mutex> lock(mu);
    tasks.emplace_back([this, c] { FailConn(c, Corrupt("malformed read data"), true); });
    return;
  }
  std::memcpy(static_cast<char*>(g.segments[seg].local) + off, data.data(), data.size());
  g.arrived[chunk] = true;
  --g.total_left;
  if (--g.chunks_left[seg] == 0) Landed(g, seg);
  if (g.total_left == 0) FinishGet(h.request_id, Status::Ok());
}

bool Transport::Impl::Accepts(EndpointId ep, std::string_view header, size_t body_bytes) {
  auto it = ep ? by_ep.find(ep) : by_ep.end();
  const ConnId c = it == by_ep.end() ? 0 : it->second;
  MessageHeader h;
  if (c != 0 && DecodeHeader(header, h) && h.body_bytes == body_bytes && body_bytes <= BodyLimit(opt, h.flags)) return true;
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.messages_refused;
  }
  // A peer speaking something else is cut off rather than answered (not from inside the
  // link's callback: as a task).
  if (c != 0) {
    std::lock_guard<std::mutex> lock(mu);
    tasks.emplace_back([this, c] { FailConn(c, Corrupt("malformed message"), true); });
  }
  return false;
}

void Transport::Impl::OnMessage(EndpointId ep, std::string_view header, std::string_view body) {
  // Accepts passed (the link asks first); the connection may have gone while a body was
  // still arriving.
  auto it = by_ep.find(ep);
  if (it == by_ep.end()) return;
  MessageHeader h;
  DecodeHeader(header, h);
  Dispatch(it->second, h, body);
}

void Transport::Impl::OnFailed(EndpointId ep, const Status& why) {
  auto it = by_ep.find(ep);
  if (it == by_ep.end()) return;
  const ConnId c = it->second;
  const std::string peer = conns[c].peer;
  // Not from inside the link's callback: the close and the handlers run as a task.
  std::lock_guard<std::mutex> lock(mu);
  tasks.emplace_back([this, c, peer, why] { FailConn(c, Unavailable("peer " + peer + " " + why.message()), true); });
}

void Transport::Impl::FinishGet(uint64_t id, Status status) {
  auto it = gets.find(id);
  if (it == gets.end()) return;
  PendingGet g = std::move(it->second);
  gets.erase(it);
  timers.erase(g.timer);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(stats_mu);
    ++stats.get_failures;
  }
  g.done(status);
}

// --- Transport ---

Transport::Transport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Transport>> Transport::Create(const TransportOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  TRELLIS_RETURN_IF_ERROR(impl->Init());
  Impl* raw = impl.get();
  std::unique_ptr<Transport> t(new Transport(std::move(impl)));
  std::promise<void> started;
  auto f = started.get_future();
  raw->thread = std::thread([raw, &started] {
    raw->loop_id = std::this_thread::get_id();
    // Best effort: an unprivileged process may not be allowed to lower a nice value.
    if (raw->opt.nice != 0) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), raw->opt.nice);
    started.set_value();
    raw->Loop();
  });
  f.wait();
  return t;
}

Transport::~Transport() { Stop(); }

void Transport::Stop() {
  impl_->stop.store(true, std::memory_order_release);
  impl_->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Transport::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->tasks.push_back(std::move(fn));
  }
  impl_->Wake();
}

bool Transport::OnLoopThread() const { return std::this_thread::get_id() == impl_->loop_id; }

void Transport::SetRequestHandler(RequestHandler h) { impl_->on_request = std::move(h); }
void Transport::SetDisconnectHandler(std::function<void(ConnId, const Status&)> h) {
  impl_->on_disconnect = std::move(h);
}

Result<uint16_t> Transport::Listen(const std::string& host, uint16_t port) { return impl_->link->Listen(host, port); }

Result<ConnId> Transport::Connect(const std::string& host, uint16_t port) {
  std::string peer;
  TRELLIS_ASSIGN_OR_RETURN(EndpointId ep, impl_->link->Connect(host, port, &peer));
  return impl_->AddConn(ep, std::move(peer));
}

bool Transport::IsConnected(ConnId c) const {
  auto it = impl_->conns.find(c);
  return it != impl_->conns.end() && it->second.alive;
}

std::string Transport::PeerName(ConnId c) const {
  auto it = impl_->conns.find(c);
  return it == impl_->conns.end() ? "" : it->second.peer;
}

void Transport::Close(ConnId c) { impl_->FailConn(c, Cancelled("connection closed"), /*notify=*/false); }

void Transport::Call(ConnId c, uint16_t type, std::string body, Deadline deadline, ReplyCallback done) {
  const uint64_t id = impl_->next_request++;
  MessageHeader h;
  h.type = type;
  h.flags = MessageHeader::kRequest;
  h.request_id = id;
  const Status s = impl_->Send(c, h, std::move(body));
  if (!s.ok()) {
    Post([done = std::move(done), s] { done(s); });  // never re-enter the caller
    return;
  }
  Impl* impl = impl_.get();
  const uint64_t timer = AddTimer(deadline, [impl, id] {
    auto it = impl->calls.find(id);
    if (it == impl->calls.end()) return;
    Impl::PendingCall pc = std::move(it->second);
    impl->calls.erase(it);
    {
      std::lock_guard<std::mutex> lock(impl->stats_mu);
      ++impl->stats.calls_timed_out;
    }
    auto cit = impl->conns.find(pc.conn);
    pc.done(DeadlineExceeded("no reply from " + (cit == impl->conns.end() ? std::string("a closed connection") : cit->second.peer) +
                             " before the deadline"));
  });
  impl_->calls[id] = Impl::PendingCall{c, std::move(done), timer};
}

void Transport::Reply(ConnId c, uint64_t request_id, std::string body) {
  MessageHeader h;
  h.flags = MessageHeader::kReply;
  h.request_id = request_id;
  (void)impl_->Send(c, h, std::move(body));  // a peer gone meanwhile needs no answer
}

void Transport::ReplyError(ConnId c, uint64_t request_id, const Status& error) {
  MessageHeader h;
  h.flags = MessageHeader::kReply | MessageHeader::kError;
  h.request_id = request_id;
  (void)impl_->Send(c, h, EncodeError(error));
}

Result<Registration> Transport::Register(void* base, size_t length) {
  if (base == nullptr || length == 0) return InvalidArgument("registering an empty region");
  WireWriter key;
  key.U64(impl_->key_rng());
  key.U64(impl_->key_rng());
  Registration r{reinterpret_cast<uint64_t>(base), length, key.Take()};
  impl_->regions[r.base] = Impl::Region{length, r.rkey};
  return r;
}

void Transport::Unregister(uint64_t base) { impl_->regions.erase(base); }

void Transport::Get(ConnId c, const RemoteRegion& region, std::vector<Segment> segments, Deadline deadline,
                    DoneCallback done, SegmentCallback on_segment) {
  Impl* impl = impl_.get();
  auto fail = [&](Status s) { Post([done = std::move(done), s] { done(s); }); };
  auto cit = impl->conns.find(c);
  if (cit == impl->conns.end() || !cit->second.alive) return fail(Unavailable("connection " + std::to_string(c) + " is closed"));
  if (segments.size() > kMaxReadSegments) return fail(InvalidArgument("too many segments in one get"));
  uint64_t total = 0;
  WireWriter w;
  w.U64(region.base);
  w.Str(region.rkey);
  w.U32(static_cast<uint32_t>(segments.size()));
  for (const Segment& s : segments) {
    const bool inside = s.remote >= region.base && s.length <= region.length &&
                        s.remote - region.base <= region.length - s.length;
    if (!inside || s.local == nullptr) {
      return fail(InvalidArgument("segment [" + std::to_string(s.remote) + ", +" + std::to_string(s.length) +
                                  ") is outside the peer's region"));
    }
    total += s.length;
    w.U64(s.remote);
    w.U64(s.length);
  }
  const uint64_t id = impl->next_get++;
  Impl::PendingGet g;
  g.conn = c;
  g.done = std::move(done);
  g.on_segment = std::move(on_segment);
  g.first_chunk.reserve(segments.size());
  g.chunks_left.reserve(segments.size());
  for (const Segment& s : segments) {
    g.first_chunk.push_back(g.total_left);
    g.chunks_left.push_back((s.length + kReadChunk - 1) / kReadChunk);
    g.total_left += g.chunks_left.back();
  }
  g.arrived.assign(g.total_left, false);
  g.segments = std::move(segments);
  {
    std::lock_guard<std::mutex> lock(impl->stats_mu);
    ++impl->stats.gets;
    impl->stats.get_segments += g.segments.size();
    impl->stats.get_bytes += total;
  }
  Impl::PendingGet& pg = impl->gets[id] = std::move(g);
  for (size_t si = 0; si < pg.segments.size(); ++si) {
    if (pg.chunks_left[si] == 0) impl->Landed(pg, si);  // nothing to move
  }
  if (pg.total_left == 0) {
    // Report from the loop, never re-entering the caller.
    Post([impl, id] { impl->FinishGet(id, Status::Ok()); });
    return;
  }
  MessageHeader h;
  h.flags = MessageHeader::kRead;
  h.request_id = id;
  if (const Status s = impl->Send(c, h, w.Take()); !s.ok()) {
    Post([impl, id, s] { impl->FinishGet(id, s); });
    return;
  }
  pg.timer = AddTimer(deadline, [impl, id] {
    auto it = impl->gets.find(id);
    if (it == impl->gets.end()) return;
    it->second.timer = 0;
    // The owner may still be sending: tell it to stop. What arrives after this is
    // dropped (the get is gone), so the buffers are the caller's again at once.
    MessageHeader cancel;
    cancel.flags = MessageHeader::kReadCancel;
    cancel.request_id = id;
    (void)impl->Send(it->second.conn, cancel, "");
    impl->FinishGet(id, DeadlineExceeded("bulk get not finished before the deadline"));
  });
}

void Transport::SetLandedHookForTesting(std::function<void(void*, uint64_t)> hook) { impl_->landed_hook = std::move(hook); }

Status Transport::SendForTesting(ConnId c, uint16_t type, uint16_t flags, uint64_t request_id, std::string body) {
  MessageHeader h;
  h.type = type;
  h.flags = flags;
  h.request_id = request_id;
  return impl_->Send(c, h, std::move(body));
}

uint64_t Transport::AddTimer(Deadline when, std::function<void()> fn) {
  const uint64_t id = impl_->next_timer++;
  impl_->timers[id] = {when, std::move(fn)};
  impl_->timer_queue.emplace(when, id);
  return id;
}

void Transport::CancelTimer(uint64_t id) { impl_->timers.erase(id); }

TransportStats Transport::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

const TransportOptions& Transport::options() const { return impl_->opt; }

}  // namespace trellis::net

#include "net/transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
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

#include <ucp/api/ucp.h>

#include "net/wire.h"
#include "util/log.h"

namespace trellis::net {

namespace {

constexpr unsigned kAmId = 7;  // the one UCX active-message id Trellis uses
// Reads served by the owner (transport.h): the bytes of one read-data message (a little
// under the default tcp segment, tcp_tx_seg_size 256k, so a chunk and its headers go in
// one piece: 128 KiB chunks read 15% slower), how many of them a transport keeps handed
// to UCX at once, and the bounds on one read request and on reads queued.
constexpr uint64_t kReadChunk = (256 << 10) - 256;
constexpr uint64_t kServeWindow = 16 << 20;
constexpr uint32_t kMaxReadSegments = 1 << 20;
constexpr size_t kMaxServing = 4096;
constexpr size_t kReadDataPrefix = 12;  // u32 segment, u64 offset

std::string UcsError(ucs_status_t s) { return ucs_status_string(s); }

std::string AddrName(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

Result<sockaddr_storage> Resolve(const std::string& host, uint16_t port) {
  sockaddr_storage ss{};
  auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
  const std::string h = host.empty() || host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(port);
  } else if (inet_pton(AF_INET6, h.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
  } else {
    return InvalidArgument("'" + host + "' is not an IPv4 or IPv6 address");
  }
  return ss;
}

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

struct Transport::Impl {
  struct Conn {
    ucp_ep_h ep = nullptr;
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
  struct SendCtx {  // keeps a message alive until UCX is done with it
    Impl* impl;
    std::string header, body;
    uint64_t serve_bytes;  // read data counted in serve_inflight
  };
  struct RecvCtx {  // a rendezvous body being received
    Impl* impl;
    ConnId conn;
    MessageHeader header;
    std::string body;
  };

  TransportOptions opt;
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  int ucx_fd = -1, wake_fd = -1, ep_fd = -1;
  std::thread thread;
  std::thread::id loop_id;
  std::atomic<bool> stop{false};

  std::mutex mu;  // guards tasks
  std::deque<std::function<void()>> tasks;

  ConnId next_conn = 1;
  std::unordered_map<ConnId, Conn> conns;
  std::unordered_map<ucp_ep_h, ConnId> by_ep;
  std::vector<ucp_listener_h> listeners;
  std::vector<void*> closing;  // ep close requests to finish before the worker goes

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
  void Wake() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd, &one, sizeof one);
  }

  ConnId AddConn(ucp_ep_h ep, std::string peer) {
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

  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static void OnConnRequest(ucp_conn_request_h req, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
};

Transport::Impl::~Impl() {
  if (worker) ucp_worker_destroy(worker);
  if (ctx) ucp_cleanup(ctx);
  if (ep_fd >= 0) close(ep_fd);
  if (wake_fd >= 0) close(wake_fd);
}

Status Transport::Impl::Init() {
  // Transport-level settings (UCT's tcp) are read from the environment only, so they
  // are defaults there: a UCX_* variable the user set wins.
  static std::once_flag env_once;
  std::call_once(env_once, [&] {
    if (!opt.tcp_tx_seg_size.empty()) setenv("UCX_TCP_TX_SEG_SIZE", opt.tcp_tx_seg_size.c_str(), 0);
    if (!opt.tcp_rx_seg_size.empty()) setenv("UCX_TCP_RX_SEG_SIZE", opt.tcp_rx_seg_size.c_str(), 0);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);  // pitfall 4: restart a listener on the same port
    // One socket event per epoll_wait: UCX 1.13's tcp progress handles a batch of up to
    // MAX_POLL (16) events, and when handling one fails or closes an endpoint whose
    // event is later in the same batch it asserts (tcp_iface.c:307, `ep->conn_state !=
    // UCT_TCP_EP_CONN_STATE_CLOSED`) and aborts the process. The chaos run (tests/chaos)
    // hit it in a grid head while nodes and stores were killed and their links cut.
    setenv("UCX_TCP_MAX_POLL", "1", 0);
  });
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Unavailable("UCX configuration: " + UcsError(s));
  auto set = [&](const char* key, const std::string& value) {
    if (!value.empty()) ucp_config_modify(config, key, value.c_str());
  };
  set("TLS", opt.tls);
  set("NET_DEVICES", opt.net_devices);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return Unavailable("UCX init (transports '" + opt.tls + "'): " + UcsError(s));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(ctx, &wp, &worker);
  if (s != UCS_OK) return Unavailable("UCX worker: " + UcsError(s));
  s = ucp_worker_get_efd(worker, &ucx_fd);
  if (s != UCS_OK) return Unavailable("UCX worker event fd: " + UcsError(s));

  ucp_am_handler_param_t ap{};
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  ap.id = kAmId;
  ap.cb = &Impl::OnAm;
  ap.arg = this;
  s = ucp_worker_set_am_recv_handler(worker, &ap);
  if (s != UCS_OK) return Unavailable("UCX active-message handler: " + UcsError(s));

  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ep_fd = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || ep_fd < 0) return IoError("eventfd/epoll_create1 failed");
  for (int fd : {ucx_fd, wake_fd}) {
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
    while (ucp_worker_progress(worker) != 0) worked = true;
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
    const ucs_status_t s = ucp_worker_arm(worker);
    if (s == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
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
  for (ucp_listener_h l : listeners) ucp_listener_destroy(l);
  listeners.clear();
  const Deadline until = After(std::chrono::milliseconds(2000));
  while (Clock::now() < until) {
    ucp_worker_progress(worker);
    bool done = true;
    for (void* r : closing) done &= ucp_request_check_status(r) != UCS_INPROGRESS;
    if (done && gets.empty()) break;
  }
  for (void* r : closing) ucp_request_free(r);
  closing.clear();
}

void Transport::Impl::FailConn(ConnId id, const Status& why, bool notify) {
  auto it = conns.find(id);
  if (it == conns.end() || !it->second.alive) return;
  Conn& c = it->second;
  c.alive = false;
  // Force-close (needs peer error handling): outstanding requests on the endpoint
  // complete with an error at once.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = opt.peer_error_handling ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* r = ucp_ep_close_nbx(c.ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  by_ep.erase(c.ep);
  c.ep = nullptr;
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
  auto* ctx_ = new SendCtx{this, EncodeHeader(hh), std::move(body), serve_bytes};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  // Eager only, whatever the size: a rendezvous has the receiver send UCX's own internal
  // messages back (an RTR or an ATS, rndv.c), and UCX 1.13 aborts the process when such
  // a send fails other than for lack of resources (ucp_request_try_send's ucs_fatal), as
  // it can when the sender has just died. Large bodies cost one reassembly copy instead.
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.user_data = ctx_;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* sc = static_cast<SendCtx*>(user_data);
    if (sc->serve_bytes) {
      sc->impl->serve_inflight -= sc->serve_bytes;
      sc->impl->pump_wanted = true;
    }
    delete sc;
    ucp_request_free(request);
  };
  serve_inflight += serve_bytes;
  void* r = ucp_am_send_nbx(it->second.ep, kAmId, ctx_->header.data(), ctx_->header.size(), ctx_->body.data(),
                            ctx_->body.size(), &p);
  const size_t n = ctx_->body.size();
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    serve_inflight -= serve_bytes;
    delete ctx_;
    if (r != nullptr) return Unavailable("send to " + it->second.peer + ": " + UcsError(UCS_PTR_STATUS(r)));
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

ucs_status_t Transport::Impl::OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                   const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Impl*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  MessageHeader h;
  ConnId c = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    auto it = self->by_ep.find(param->reply_ep);
    if (it != self->by_ep.end()) c = it->second;
  }
  const bool good = c != 0 &&
                    DecodeHeader({static_cast<const char*>(header), header_length}, h) && h.body_bytes == length &&
                    length <= BodyLimit(self->opt, h.flags);
  if (!good) {
    {
      std::lock_guard<std::mutex> lock(self->stats_mu);
      ++self->stats.messages_refused;
    }
    // (A rendezvous body not received is dropped by UCX when the callback returns UCS_OK.)
    // A peer speaking something else is cut off rather than answered.
    if (c != 0) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->tasks.emplace_back([self, c] { self->FailConn(c, Corrupt("malformed message"), true); });
    }
    return UCS_OK;
  }
  if (!rndv) {
    self->Dispatch(c, h, {static_cast<const char*>(data), length});
    return UCS_OK;
  }
  // Rendezvous: receive the body into its own buffer, then dispatch.
  auto* rc = new RecvCtx{self, c, h, std::string(length, '\0')};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = rc;
  p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    auto* rc = static_cast<RecvCtx*>(user_data);
    if (status == UCS_OK && rc->impl->conns.count(rc->conn)) rc->impl->Dispatch(rc->conn, rc->header, rc->body);
    delete rc;
    ucp_request_free(request);
  };
  void* r = ucp_am_recv_data_nbx(self->worker, data, rc->body.data(), length, &p);
  if (r == nullptr) {
    self->Dispatch(c, h, rc->body);
    delete rc;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete rc;
  }
  return UCS_INPROGRESS;
}

void Transport::Impl::OnConnRequest(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<Impl*>(arg);
  std::string peer = "?";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = AddrName(attr.client_address);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_handler.cb = &Impl::OnEpError;
  ep.err_handler.arg = self;
  if (self->opt.peer_error_handling) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t s = ucp_ep_create(self->worker, &ep, &h);
  if (s != UCS_OK) {
    TRELLIS_LOG_WARN("net: refusing a connection from {}: {}", peer, UcsError(s));
    return;
  }
  self->AddConn(h, peer);
}

void Transport::Impl::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Impl*>(arg);
  auto it = self->by_ep.find(ep);
  if (it == self->by_ep.end()) return;
  const ConnId c = it->second;
  const std::string peer = self->conns[c].peer;
  // Not from inside UCX's callback: the close and the handlers run as a task.
  std::lock_guard<std::mutex> lock(self->mu);
  self->tasks.emplace_back(
      [self, c, peer, status] { self->FailConn(c, Unavailable("peer " + peer + " failed: " + UcsError(status)), true); });
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

Result<uint16_t> Transport::Listen(const std::string& host, uint16_t port) {
  TRELLIS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(host, port));
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  lp.conn_handler.cb = &Impl::OnConnRequest;
  lp.conn_handler.arg = impl_.get();
  ucp_listener_h l = nullptr;
  const ucs_status_t s = ucp_listener_create(impl_->worker, &lp, &l);
  if (s != UCS_OK) return Unavailable("listen on " + host + ":" + std::to_string(port) + ": " + UcsError(s));
  impl_->listeners.push_back(l);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(l, &attr) != UCS_OK) return Internal("cannot query the listener's address");
  const auto& a = attr.sockaddr;
  return static_cast<uint16_t>(ntohs(a.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(a).sin_port
                                                            : reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
}

Result<ConnId> Transport::Connect(const std::string& host, uint16_t port) {
  TRELLIS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(host, port));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  ep.sockaddr.addrlen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  ep.err_handler.cb = &Impl::OnEpError;
  ep.err_handler.arg = impl_.get();
  if (impl_->opt.peer_error_handling) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  }
  ucp_ep_h h = nullptr;
  const ucs_status_t s = ucp_ep_create(impl_->worker, &ep, &h);
  if (s != UCS_OK) return Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + UcsError(s));
  return impl_->AddConn(h, AddrName(ss));
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

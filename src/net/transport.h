// net::Transport: Trellis's one peer transport (the store and the grid share it), on UCX
// or, for tests, through memory between transports of one process (net/link.h).
//
// What it gives:
//   - connections: Listen on HOST:PORT, Connect to a peer; each side names a connection
//     by a ConnId;
//   - requests and replies: Call(conn, type, body, deadline) -> the reply's body or an
//     error; the peer's handler answers with Reply / ReplyError. Small messages go eagerly,
//     large ones by UCX's rendezvous, and a body above max_message_bytes is refused
//     before anything is allocated for it;
//   - bulk reads: Register a memory region (its key travels in a message), and Get a
//     list of scattered segments of a peer's region straight into local buffers. The
//     region's owner serves a Get itself: the reader sends one read request naming the
//     segments, the owner checks each against the region it registered and streams the
//     bytes back as active messages (kReadChunk bytes each, a bounded window of them in
//     flight per transport, every read served round-robin), and the reader copies each
//     chunk into place as it lands. Not UCX RMA: Debian's UCX 1.13 emulates gets over
//     tcp in software, and its emulation aborts the serving process when a reader dies
//     mid-read (docs/store.md, "what survives what"); here a send that fails is one
//     failed request of ours, and the read is dropped;
//   - timers and a task queue, so its owner keeps all of its state on one thread.
//
// Threading: one loop thread owns the UCX worker and runs every callback (handlers,
// replies, completions, timers). Post() is the only way in from another thread; the
// other methods are called on the loop thread (from a callback or a Post()ed task).
// Sync() runs a function on the loop thread and waits for its result, for callers that
// live elsewhere.
//
// Failures: with peer error handling (the default), a peer that dies or resets fails its
// connection: pending calls and gets on it complete with Unavailable, the disconnect
// handler runs, and the ConnId is dead. A call or get past its deadline completes with
// DeadlineExceeded. Bytes are copied into a Get's buffers only while it is pending, on
// the loop thread, so none lands after its callback has run; a get that times out tells
// the owner to stop serving it and leaves the connection up. The owner serves only
// segments inside a region it registered, to a reader that names the region's key; the
// owner of a region still checks every offset it hands out (what is in the region is its
// business), and Get refuses segments outside the region the caller names.
//
// The wire format (docs/store.md, "Transport"): every message is one UCX active message
// whose header is the 24-byte MessageHeader below and whose data is the body.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trellis::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline Deadline After(std::chrono::milliseconds ms) { return Clock::now() + ms; }

using ConnId = uint64_t;  // 0 is never a connection

struct TransportOptions {
  // UCX_TLS for this transport's context. tcp is always needed (it is the connection
  // manager for listeners); "tcp" alone is what peer error handling keeps anyway in
  // UCX 1.13 (with UCP_ERR_HANDLING_MODE_PEER it drops the shared-memory and loopback
  // transports, which cannot report a dead peer).
  std::string tls = "tcp";
  // UCX_NET_DEVICES; empty: UCX's choice. Loopback tests set "lo" (UCX's default picks every
  // device, and a test on one machine must not wander onto the host's NICs).
  std::string net_devices;
  // UCP_ERR_HANDLING_MODE_PEER: dead peers are detected and their connections failed,
  // and a connection can be force-closed. Without it a dead peer can hang a flush.
  bool peer_error_handling = true;
  // Largest message body accepted or sent; bulk data moves by Get, not by messages.
  size_t max_message_bytes = size_t{64} << 20;
  // After doing work, the loop keeps polling this long before it sleeps in epoll (0:
  // sleep at once). Costs CPU while busy; saves a wake-up per message under load.
  uint32_t spin_us = 200;
  // Linux nice value of the progress thread (0: the process's). A background transport,
  // one that only publishes, runs at a low priority so compute threads keep the cores.
  int nice = 0;
  // UCX's tcp segment sizes (pitfall 6: the defaults cap bulk throughput).
  std::string tcp_tx_seg_size = "256k";
  std::string tcp_rx_seg_size = "1m";
  // Fault injection for chaos runs (hidden flags, never in production): flips bit 6 of
  // the byte just past the middle of every Nth segment a Get lands, after the
  // transport's own checks, as corruption on the wire would (0: off). In K/V blocks that
  // byte is the high byte of an f16, so the flip is an exponent bit: a check that missed
  // it would change the answer. What reads the bytes must catch it by its checksums.
  uint32_t fault_flip_landed_every = 0;
  // In-process only (tests): connections reach transports of this process through
  // memory, found by the port they listen on, instead of UCX (net/link.h). Everything
  // above the wire (calls, deadlines, reads served by the owner, failures) is the same.
  bool loopback = false;
};

// The 24-byte header of every message, little-endian on the wire.
struct MessageHeader {
  static constexpr uint32_t kMagic = 0x534c5254;  // "TRLS"
  static constexpr uint16_t kVersion = 2;  // 2: reads are served by the owner, not UCX RMA
  static constexpr size_t kBytes = 24;
  // kRead: a Get's read request (request_id is the get's id); kReadData: a chunk of its
  // bytes, or with kError its failure; kReadCancel: the reader gave up on it.
  enum Flags : uint16_t { kRequest = 1, kReply = 2, kError = 4, kRead = 8, kReadData = 16, kReadCancel = 32 };
  uint16_t type = 0;       // the protocol's message type (store, grid)
  uint16_t flags = 0;
  uint64_t request_id = 0;  // pairs a reply with its request
  uint32_t body_bytes = 0;  // must equal the data length UCX delivers
};

// A region of this process's memory registered for remote reads.
struct Registration {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;  // the region's key (16 random bytes): send it to peers that will Get from it
};

// What a peer needs to read a registered region.
struct RemoteRegion {
  uint64_t base = 0;
  uint64_t length = 0;
  std::string rkey;
};

// One piece of a bulk read: `length` bytes at remote address `remote` into `local`.
struct Segment {
  uint64_t remote = 0;
  void* local = nullptr;
  uint64_t length = 0;
};

struct TransportStats {
  uint64_t messages_sent = 0, messages_received = 0, messages_refused = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t gets = 0, get_segments = 0, get_bytes = 0, get_failures = 0;
  uint64_t reads_served = 0, read_bytes_served = 0, reads_refused = 0;  // Gets of peers, as the owner
  uint64_t calls_timed_out = 0, connections_failed = 0;
  uint64_t faults_injected = 0;  // TransportOptions::fault_flip_landed_every
};

class Transport {
 public:
  // A request from a peer: answer it with Reply or ReplyError (now or later, on the loop
  // thread). `body` is valid during the call only.
  using RequestHandler = std::function<void(ConnId, uint16_t type, uint64_t request_id, std::string_view body)>;
  using ReplyCallback = std::function<void(Result<std::string>)>;
  using DoneCallback = std::function<void(Status)>;
  using SegmentCallback = std::function<void(size_t segment)>;

  static Result<std::unique_ptr<Transport>> Create(const TransportOptions& options);
  ~Transport();  // Stop()
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // --- any thread but the loop's ---
  // Stops the loop thread and closes every connection; nothing runs on the loop after it
  // returns. Idempotent. Owners whose handlers reach the transport through their own
  // pointer call this before destroying it (unique_ptr::reset clears the pointer first).
  void Stop();

  // --- any thread ---
  void Post(std::function<void()> fn);
  // Runs fn on the loop thread and returns its result (fn must not block).
  template <typename F>
  auto Sync(F fn) -> decltype(fn());
  bool OnLoopThread() const;

  // --- loop thread ---
  // Handlers are set before the first connection.
  void SetRequestHandler(RequestHandler h);
  void SetDisconnectHandler(std::function<void(ConnId, const Status&)> h);

  // Listens on host:port (port 0: any); returns the bound port.
  Result<uint16_t> Listen(const std::string& host, uint16_t port);
  // Starts connecting; the connection is usable at once (messages queue until it is up).
  // A peer that is not there fails the connection (calls on it get Unavailable).
  Result<ConnId> Connect(const std::string& host, uint16_t port);
  bool IsConnected(ConnId c) const;
  // The peer's address as seen by this side ("host:port"), or "" for a dead connection.
  std::string PeerName(ConnId c) const;
  // Closes a connection: pending calls and gets fail with Cancelled.
  void Close(ConnId c);

  void Call(ConnId c, uint16_t type, std::string body, Deadline deadline, ReplyCallback done);
  void Reply(ConnId c, uint64_t request_id, std::string body);
  void ReplyError(ConnId c, uint64_t request_id, const Status& error);

  Result<Registration> Register(void* base, size_t length);
  void Unregister(uint64_t base);
  // Reads every segment of `region` (on connection c's peer) into local memory, all in
  // flight at once; done(Ok) when all have landed. A segment outside the region is
  // refused before anything is sent. on_segment, if given, runs for each segment as it
  // lands (before done), so the caller can check it while the rest are in flight.
  void Get(ConnId c, const RemoteRegion& region, std::vector<Segment> segments, Deadline deadline, DoneCallback done,
           SegmentCallback on_segment = nullptr);

  // Tests only: runs on every segment a Get lands, on the loop thread, before on_segment
  // or done see it (a test flips a byte there: corruption on the wire that the transport
  // cannot see). nullptr removes it. Call on the loop thread.
  void SetLandedHookForTesting(std::function<void(void* local, uint64_t length)> hook);

  // Tests and fuzzers only: sends one message with any flags and request id, as a hostile
  // peer could (a read request, read data for a get the peer never made). Loop thread.
  Status SendForTesting(ConnId c, uint16_t type, uint16_t flags, uint64_t request_id, std::string body);

  // Runs fn once at `when` (on the loop thread); returns an id for CancelTimer.
  uint64_t AddTimer(Deadline when, std::function<void()> fn);
  void CancelTimer(uint64_t id);

  TransportStats stats() const;
  const TransportOptions& options() const;

  struct Impl;

 private:
  explicit Transport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sync's body needs only Post and a promise.
}  // namespace trellis::net

#include <future>
#include <type_traits>

namespace trellis::net {
template <typename F>
auto Transport::Sync(F fn) -> decltype(fn()) {
  using R = decltype(fn());
  if (OnLoopThread()) return fn();
  std::promise<R> p;
  auto f = p.get_future();
  Post([&] {
    if constexpr (std::is_void_v<R>) {
      fn();
      p.set_value();
    } else {
      p.set_value(fn());
    }
  });
  return f.get();
}
}  // namespace trellis::net

// net::Link: what carries a Transport's messages (internal to src/net). A link moves
// framed messages (a MessageHeader's bytes, then a body) between endpoints, accepts and
// opens connections, and reports a peer that died or closed; everything above it (calls
// and replies, bulk reads served by the owner, deadlines, checks of every header) is the
// Transport's and the same on every link.
//
//   UcxLink       (link_ucx.cc)       UCX active messages over tcp: between processes
//   LoopbackLink  (link_loopback.cc)  transports of one process, through memory: unit
//                                     tests of the store and the grid without UCX
//
// Threading: the transport's loop thread calls every method and receives every event;
// LinkEvents::Wake may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "net/transport.h"

namespace trellis::net {

using EndpointId = uint64_t;  // a link's name for one end of a connection; 0 is none

// What a link tells its transport (on the loop thread, from Progress, except Wake).
class LinkEvents {
 public:
  virtual ~LinkEvents() = default;
  // A peer connected to a listener.
  virtual void OnAccept(EndpointId ep, std::string peer) = 0;
  // Whether a message with this header and body length is acceptable on ep (a known
  // endpoint, a well-formed header, a body within the limits). False: it was counted as
  // refused and the connection is being failed; the body must not be received.
  virtual bool Accepts(EndpointId ep, std::string_view header, size_t body_bytes) = 0;
  // A message whose header and length Accepts took (the link always asks it first).
  virtual void OnMessage(EndpointId ep, std::string_view header, std::string_view body) = 0;
  // The peer died, reset or closed: the connection is gone.
  virtual void OnFailed(EndpointId ep, const Status& why) = 0;
  // The bytes of a Send with a nonzero token have left (its buffers are free).
  virtual void OnSent(uint64_t token) = 0;
  // Any thread: progress is wanted (the loop may be asleep).
  virtual void Wake() = 0;
};

class Link {
 public:
  virtual ~Link() = default;
  // Listens on host:port (0: any); the bound port.
  virtual Result<uint16_t> Listen(const std::string& host, uint16_t port) = 0;
  // Opens a connection; usable at once (a peer that is not there fails it later, by
  // OnFailed). *peer: the peer's name ("host:port").
  virtual Result<EndpointId> Connect(const std::string& host, uint16_t port, std::string* peer) = 0;
  // Sends header then body, in order with the endpoint's other messages. token != 0:
  // OnSent(token) once the bytes are out. An error: nothing was sent, no OnSent.
  virtual Status Send(EndpointId ep, std::string header, std::string body, uint64_t token) = 0;
  // Closes at once; no OnFailed follows for ep. The peer sees its end fail.
  virtual void Close(EndpointId ep) = 0;
  // Delivers what arrived; true if anything happened.
  virtual bool Progress() = 0;
  // A file descriptor the loop polls beside its own wake-up (-1: none; the link wakes
  // the loop through LinkEvents::Wake).
  virtual int fd() const = 0;
  // Before the loop sleeps: false if events are pending (progress again instead).
  virtual bool Arm() = 0;
  // Stops listening and finishes closing endpoints, waiting at most until `until`.
  virtual void Shutdown(Deadline until) = 0;
};

Result<std::unique_ptr<Link>> MakeUcxLink(const TransportOptions& options, LinkEvents* events);
Result<std::unique_ptr<Link>> MakeLoopbackLink(const TransportOptions& options, LinkEvents* events);

}  // namespace trellis::net

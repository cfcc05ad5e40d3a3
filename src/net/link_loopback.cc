// LoopbackLink: transports of one process, connected through memory (TransportOptions::
// loopback). Listeners are found by port in a process-wide hub; a message is queued in
// the receiving link's inbox and that transport's loop woken; closing or destroying one
// end fails the other, as a peer reset would. Bytes, order and failures are what a
// process boundary gives, so store and grid unit tests exercise the same Transport code
// (calls, deadlines, reads served by the owner) without UCX.
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <variant>

#include "net/link.h"

namespace trellis::net {
namespace {

class LoopbackLink;

// Everything shared between loopback links, under one lock.
struct Hub {
  std::mutex mu;
  std::map<uint16_t, LoopbackLink*> listeners;  // port -> the link listening there
  uint16_t next_port = 40000;
  EndpointId next_ep = 1;  // endpoint ids are unique across links
  struct End {
    LoopbackLink* owner;
    LoopbackLink* peer;
    EndpointId peer_ep;
  };
  std::unordered_map<EndpointId, End> ends;
  static Hub& Get() {
    static Hub* h = new Hub;  // never destroyed: links may outlive static destruction order
    return *h;
  }
};

struct Event {
  enum Kind { kAccept, kMessage, kFailed, kSent } kind;
  EndpointId ep = 0;
  std::string a, b;  // accept: peer; message: header, body; failed: why
  uint64_t token = 0;
};

class LoopbackLink final : public Link {
 public:
  LoopbackLink(const TransportOptions&, LinkEvents* ev) : ev_(ev) {}
  ~LoopbackLink() override { Shutdown(Clock::now()); }

  Result<uint16_t> Listen(const std::string& host, uint16_t port) override {
    Hub& h = Hub::Get();
    std::lock_guard<std::mutex> lock(h.mu);
    if (port == 0) {
      while (h.listeners.count(h.next_port)) ++h.next_port;
      port = h.next_port++;
    }
    if (!h.listeners.emplace(port, this).second) {
      return Unavailable("listen on " + host + ":" + std::to_string(port) + ": the port is taken (loopback)");
    }
    ports_.push_back(port);
    return port;
  }

  Result<EndpointId> Connect(const std::string& host, uint16_t port, std::string* peer) override {
    Hub& h = Hub::Get();
    std::lock_guard<std::mutex> lock(h.mu);
    const EndpointId mine = h.next_ep++;
    if (peer) *peer = host + ":" + std::to_string(port);
    auto l = h.listeners.find(port);
    if (l == h.listeners.end()) {
      // As a refused connection: usable at once, failed by the next progress.
      h.ends[mine] = Hub::End{this, nullptr, 0};
      Push(Event{Event::kFailed, mine, "failed: nothing listens there (loopback)", {}, 0});
      return mine;
    }
    const EndpointId theirs = h.next_ep++;
    h.ends[mine] = Hub::End{this, l->second, theirs};
    h.ends[theirs] = Hub::End{l->second, this, mine};
    l->second->Push(Event{Event::kAccept, theirs, "loopback:" + std::to_string(mine), {}, 0});
    return mine;
  }

  Status Send(EndpointId ep, std::string header, std::string body, uint64_t token) override {
    Hub& h = Hub::Get();
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.ends.find(ep);
    if (it == h.ends.end() || it->second.owner != this) return Unavailable("endpoint closed");
    if (!it->second.peer) return Unavailable("not connected");
    it->second.peer->Push(Event{Event::kMessage, it->second.peer_ep, std::move(header), std::move(body), 0});
    if (token) Push(Event{Event::kSent, ep, {}, {}, token});
    return Status::Ok();
  }

  void Close(EndpointId ep) override {
    Hub& h = Hub::Get();
    std::lock_guard<std::mutex> lock(h.mu);
    CloseLocked(h, ep, "failed: the peer closed the connection");
    // What is still queued for ep is dropped, as a force-closed endpoint delivers nothing
    // more (completions of sends stay: the transport counts the bytes they carried).
    std::erase_if(inbox_, [ep](const Event& e) { return e.ep == ep && e.kind != Event::kSent; });
  }

  bool Progress() override {
    std::deque<Event> batch;
    {
      std::lock_guard<std::mutex> lock(Hub::Get().mu);
      batch.swap(inbox_);
    }
    for (Event& e : batch) {
      switch (e.kind) {
        case Event::kAccept: ev_->OnAccept(e.ep, std::move(e.a)); break;
        case Event::kMessage:
          if (ev_->Accepts(e.ep, e.a, e.b.size())) ev_->OnMessage(e.ep, e.a, e.b);
          break;
        case Event::kFailed: ev_->OnFailed(e.ep, Unavailable(e.a)); break;
        case Event::kSent: ev_->OnSent(e.token); break;
      }
    }
    return !batch.empty();
  }

  int fd() const override { return -1; }

  bool Arm() override {
    std::lock_guard<std::mutex> lock(Hub::Get().mu);
    return inbox_.empty();
  }

  void Shutdown(Deadline) override {
    Hub& h = Hub::Get();
    std::lock_guard<std::mutex> lock(h.mu);
    for (uint16_t p : ports_) h.listeners.erase(p);
    ports_.clear();
    std::vector<EndpointId> mine;
    for (const auto& [ep, end] : h.ends) {
      if (end.owner == this) mine.push_back(ep);
    }
    for (EndpointId ep : mine) CloseLocked(h, ep, "failed: the peer's transport stopped");
    inbox_.clear();
  }

 private:
  // Under the hub's lock.
  void Push(Event e) {
    inbox_.push_back(std::move(e));
    ev_->Wake();
  }
  void CloseLocked(Hub& h, EndpointId ep, const char* why) {
    auto it = h.ends.find(ep);
    if (it == h.ends.end() || it->second.owner != this) return;
    const Hub::End end = it->second;
    h.ends.erase(it);
    if (end.peer) {
      h.ends.erase(end.peer_ep);
      end.peer->Push(Event{Event::kFailed, end.peer_ep, why, {}, 0});
    }
  }

  LinkEvents* ev_;
  std::deque<Event> inbox_;  // under the hub's lock
  std::vector<uint16_t> ports_;
};

}  // namespace

Result<std::unique_ptr<Link>> MakeLoopbackLink(const TransportOptions& options, LinkEvents* events) {
  return std::unique_ptr<Link>(new LoopbackLink(options, events));
}

}  // namespace trellis::net

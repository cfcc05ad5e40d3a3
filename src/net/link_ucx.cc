// UcxLink: a Transport's messages as UCX active messages (one id, kAmId), eager whatever
// their size, over tcp with peer error handling (transport.h says why each choice).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include <ucp/api/ucp.h>

#include "net/link.h"
#include "util/log.h"

namespace trellis::net {
namespace {

constexpr unsigned kAmId = 7;  // the one UCX active-message id Trellis uses

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

class UcxLink final : public Link {
 public:
  UcxLink(const TransportOptions& o, LinkEvents* ev) : opt_(o), ev_(ev) {}
  ~UcxLink() override {
    if (worker_) ucp_worker_destroy(worker_);
    if (ctx_) ucp_cleanup(ctx_);
  }

  Status Init();
  Result<uint16_t> Listen(const std::string& host, uint16_t port) override;
  Result<EndpointId> Connect(const std::string& host, uint16_t port, std::string* peer) override;
  Status Send(EndpointId ep, std::string header, std::string body, uint64_t token) override;
  void Close(EndpointId ep) override;
  bool Progress() override { return ucp_worker_progress(worker_) != 0; }
  int fd() const override { return ucx_fd_; }
  bool Arm() override { return ucp_worker_arm(worker_) != UCS_ERR_BUSY; }
  void Shutdown(Deadline until) override;

 private:
  struct SendCtx {  // keeps a message alive until UCX is done with it
    UcxLink* link;
    std::string header, body;
    uint64_t token;
  };
  struct RecvCtx {  // a rendezvous body being received
    UcxLink* link;
    EndpointId ep;
    std::string header, body;
  };

  EndpointId Add(ucp_ep_h h) {
    const EndpointId id = next_++;
    eps_[id] = h;
    by_ep_[h] = id;
    return id;
  }
  ucp_ep_params_t EpParams();
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param);
  static void OnConnRequest(ucp_conn_request_h req, void* arg);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  TransportOptions opt_;
  LinkEvents* ev_;
  ucp_context_h ctx_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int ucx_fd_ = -1;
  EndpointId next_ = 1;
  std::unordered_map<EndpointId, ucp_ep_h> eps_;
  std::unordered_map<ucp_ep_h, EndpointId> by_ep_;
  std::vector<ucp_listener_h> listeners_;
  std::vector<void*> closing_;  // ep close requests to finish before the worker goes
};

Status UcxLink::Init() {
  // Transport-level settings (UCT's tcp) are read from the environment only, so they
  // are defaults there: a UCX_* variable the user set wins.
  static std::once_flag env_once;
  std::call_once(env_once, [&] {
    if (!opt_.tcp_tx_seg_size.empty()) setenv("UCX_TCP_TX_SEG_SIZE", opt_.tcp_tx_seg_size.c_str(), 0);
    if (!opt_.tcp_rx_seg_size.empty()) setenv("UCX_TCP_RX_SEG_SIZE", opt_.tcp_rx_seg_size.c_str(), 0);
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
  set("TLS", opt_.tls);
  set("NET_DEVICES", opt_.net_devices);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &ctx_);
  ucp_config_release(config);
  if (s != UCS_OK) return Unavailable("UCX init (transports '" + opt_.tls + "'): " + UcsError(s));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  s = ucp_worker_create(ctx_, &wp, &worker_);
  if (s != UCS_OK) return Unavailable("UCX worker: " + UcsError(s));
  s = ucp_worker_get_efd(worker_, &ucx_fd_);
  if (s != UCS_OK) return Unavailable("UCX worker event fd: " + UcsError(s));

  ucp_am_handler_param_t ap{};
  ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  ap.id = kAmId;
  ap.cb = &UcxLink::OnAm;
  ap.arg = this;
  s = ucp_worker_set_am_recv_handler(worker_, &ap);
  if (s != UCS_OK) return Unavailable("UCX active-message handler: " + UcsError(s));
  return Status::Ok();
}

ucp_ep_params_t UcxLink::EpParams() {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.err_handler.cb = &UcxLink::OnEpError;
  ep.err_handler.arg = this;
  if (opt_.peer_error_handling) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  }
  return ep;
}

Result<uint16_t> UcxLink::Listen(const std::string& host, uint16_t port) {
  TRELLIS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(host, port));
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  lp.conn_handler.cb = &UcxLink::OnConnRequest;
  lp.conn_handler.arg = this;
  ucp_listener_h l = nullptr;
  const ucs_status_t s = ucp_listener_create(worker_, &lp, &l);
  if (s != UCS_OK) return Unavailable("listen on " + host + ":" + std::to_string(port) + ": " + UcsError(s));
  listeners_.push_back(l);
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(l, &attr) != UCS_OK) return Internal("cannot query the listener's address");
  const auto& a = attr.sockaddr;
  return static_cast<uint16_t>(ntohs(a.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(a).sin_port
                                                            : reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
}

Result<EndpointId> UcxLink::Connect(const std::string& host, uint16_t port, std::string* peer) {
  TRELLIS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(host, port));
  ucp_ep_params_t ep = EpParams();
  ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  ep.sockaddr.addrlen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  ucp_ep_h h = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &h);
  if (s != UCS_OK) return Unavailable("connect to " + host + ":" + std::to_string(port) + ": " + UcsError(s));
  if (peer) *peer = AddrName(ss);
  return Add(h);
}

Status UcxLink::Send(EndpointId id, std::string header, std::string body, uint64_t token) {
  auto it = eps_.find(id);
  if (it == eps_.end()) return Unavailable("endpoint " + std::to_string(id) + " is closed");
  auto* sc = new SendCtx{this, std::move(header), std::move(body), token};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  // Eager only, whatever the size: a rendezvous has the receiver send UCX's own internal
  // messages back (an RTR or an ATS, rndv.c), and UCX 1.13 aborts the process when such
  // a send fails other than for lack of resources (ucp_request_try_send's ucs_fatal), as
  // it can when the sender has just died. Large bodies cost one reassembly copy instead.
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  p.user_data = sc;
  p.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* sc = static_cast<SendCtx*>(user_data);
    if (sc->token) sc->link->ev_->OnSent(sc->token);
    delete sc;
    ucp_request_free(request);
  };
  void* r = ucp_am_send_nbx(it->second, kAmId, sc->header.data(), sc->header.size(), sc->body.data(), sc->body.size(), &p);
  if (r == nullptr) {  // sent at once: the callback does not run
    if (sc->token) ev_->OnSent(sc->token);
    delete sc;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete sc;
    return Unavailable(UcsError(UCS_PTR_STATUS(r)));
  }
  return Status::Ok();
}

void UcxLink::Close(EndpointId id) {
  auto it = eps_.find(id);
  if (it == eps_.end()) return;
  // Force-close (needs peer error handling): outstanding requests on the endpoint
  // complete with an error at once.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = opt_.peer_error_handling ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  void* r = ucp_ep_close_nbx(it->second, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
  by_ep_.erase(it->second);
  eps_.erase(it);
}

void UcxLink::Shutdown(Deadline until) {
  for (ucp_listener_h l : listeners_) ucp_listener_destroy(l);
  listeners_.clear();
  while (Clock::now() < until) {
    ucp_worker_progress(worker_);
    bool done = true;
    for (void* r : closing_) done &= ucp_request_check_status(r) != UCS_INPROGRESS;
    if (done) break;
  }
  for (void* r : closing_) ucp_request_free(r);
  closing_.clear();
}

ucs_status_t UcxLink::OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxLink*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  EndpointId ep = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    auto it = self->by_ep_.find(param->reply_ep);
    if (it != self->by_ep_.end()) ep = it->second;
  }
  const std::string_view h(static_cast<const char*>(header), header_length);
  // (A rendezvous body not received is dropped by UCX when the callback returns UCS_OK.)
  if (!self->ev_->Accepts(ep, h, length)) return UCS_OK;
  if (!rndv) {
    self->ev_->OnMessage(ep, h, {static_cast<const char*>(data), length});
    return UCS_OK;
  }
  // Rendezvous: receive the body into its own buffer, then deliver.
  auto* rc = new RecvCtx{self, ep, std::string(h), std::string(length, '\0')};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = rc;
  p.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    auto* rc = static_cast<RecvCtx*>(user_data);
    if (status == UCS_OK && rc->link->eps_.count(rc->ep)) rc->link->ev_->OnMessage(rc->ep, rc->header, rc->body);
    delete rc;
    ucp_request_free(request);
  };
  void* r = ucp_am_recv_data_nbx(self->worker_, data, rc->body.data(), length, &p);
  if (r == nullptr) {
    self->ev_->OnMessage(ep, rc->header, rc->body);
    delete rc;
  } else if (UCS_PTR_IS_ERR(r)) {
    delete rc;
  }
  return UCS_INPROGRESS;
}

void UcxLink::OnConnRequest(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<UcxLink*>(arg);
  std::string peer = "?";
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(req, &attr) == UCS_OK) peer = AddrName(attr.client_address);
  ucp_ep_params_t ep = self->EpParams();
  ep.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
  ep.conn_request = req;
  ucp_ep_h h = nullptr;
  const ucs_status_t s = ucp_ep_create(self->worker_, &ep, &h);
  if (s != UCS_OK) {
    TRELLIS_LOG_WARN("net: refusing a connection from {}: {}", peer, UcsError(s));
    return;
  }
  self->ev_->OnAccept(self->Add(h), peer);
}

void UcxLink::OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxLink*>(arg);
  auto it = self->by_ep_.find(ep);
  if (it == self->by_ep_.end()) return;
  self->ev_->OnFailed(it->second, Unavailable("failed: " + UcsError(status)));
}

}  // namespace

Result<std::unique_ptr<Link>> MakeUcxLink(const TransportOptions& options, LinkEvents* events) {
  auto link = std::make_unique<UcxLink>(options, events);
  TRELLIS_RETURN_IF_ERROR(link->Init());
  return std::unique_ptr<Link>(std::move(link));
}

}  // namespace trellis::net

#include "http/server.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include <fmt/core.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>

#include "http/beast.h"

namespace trellis::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
}  // namespace

class Connection;

struct HttpServer::Impl {
  Impl(HttpHandler& h, HttpServerOptions o) : handler(h), opts(std::move(o)), guard(asio::make_work_guard(io)) {}

  void Accept();
  void Sweep();
  void WorkerLoop();
  void ConnectionEnded();

  HttpHandler& handler;
  const HttpServerOptions opts;
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;  // I/O thread
  asio::steady_timer accept_retry{io};
  int port = 0;
  std::atomic<bool> stopping{false};
  std::atomic<int> open{0};
  std::unordered_set<Connection*> conns;  // I/O thread only

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Connection>> queue;  // GUARDED_BY(mu)
  bool workers_stop = false;                      // GUARDED_BY(mu)
  std::atomic<int> queued{0};
  std::vector<std::thread> workers;
};

// One client connection. Lives on the I/O thread except while a worker runs Handle
// (state kWorker): then only that worker touches it, and it comes back through a post.
class Connection : public std::enable_shared_from_this<Connection>, public HttpExchange {
 public:
  enum class State { kIdle, kHead, kBody, kQueued, kWorker, kWriting, kClosed };

  Connection(HttpServer::Impl& s, tcp::socket sock) : s_(s), stream_(std::move(sock)), deadline_(s.io) {
    s_.open.fetch_add(1);
    s_.conns.insert(this);
    beast::error_code ec;
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~Connection() override {
    s_.conns.erase(this);
    s_.open.fetch_sub(1);
    s_.ConnectionEnded();
  }

  void Start() { WaitRequest(); }
  State state() const { return state_; }

  // Shutdown: connections not in a request's hands are closed at once.
  void Abort() {
    if (state_ == State::kIdle || state_ == State::kHead || state_ == State::kBody) Close();
  }

  // A refusal before the body was read (or instead of it): answer, then close lingeringly.
  void Fail(const HttpError& e, std::vector<std::pair<std::string, std::string>> extra = {}) {
    HttpResponse r;
    r.status = e.status;
    r.body = s_.handler.ErrorBody(e.status, e.message);
    r.headers = std::move(extra);
    if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
    WriteInline(std::move(r), /*keep_alive=*/false);
  }

  // ---- HttpExchange (worker thread) ----
  bool Respond(const HttpResponse& r) override {
    if (answered_) return false;
    answered_ = true;
    status_ = r.status;
    return WriteRaw(SerializeResponse(r, req_.request_id, KeepAlive()));
  }
  bool BeginStream(int status, std::string_view content_type,
                   const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (answered_) return false;
    answered_ = true;
    streaming_ = true;
    status_ = status;
    if (req_.version == 10) {  // no chunked encoding in HTTP/1.0: the close ends the body
      std::string head = fmt::format("HTTP/1.0 {} {}\r\nContent-Type: {}\r\n", status, StatusReason(status),
                                     content_type);
      for (const auto& [k, v] : headers) head += fmt::format("{}: {}\r\n", k, v);
      head += fmt::format("x-request-id: {}\r\nConnection: close\r\n\r\n", req_.request_id);
      return WriteRaw(head);
    }
    return WriteRaw(SerializeStreamHead(status, content_type, headers, req_.request_id, KeepAlive()));
  }
  bool WriteChunk(std::string_view data) override {
    if (!streaming_ || stream_ended_) return false;
    if (data.empty()) return true;
    if (req_.version == 10) return WriteRaw(data);
    std::string c = fmt::format("{:x}\r\n", data.size());
    c.append(data);
    c += "\r\n";
    return WriteRaw(c);
  }
  bool EndStream() override {
    if (!streaming_ || stream_ended_) return false;
    stream_ended_ = true;
    if (req_.version == 10) {
      broken_ = true;  // the close ends the body
      return true;
    }
    return WriteRaw("0\r\n\r\n");
  }
  bool ClientGone() override {
    if (broken_) return true;
    pollfd p{fd(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
    if (p.revents & POLLRDHUP) {
      half_closed_ = true;
      // A FIN: either the client is gone or it only shut down its sending side. An
      // HTTP/1.1 client must skip an interim 1xx; a closed socket answers it with a reset,
      // which the next poll sees as POLLERR/POLLHUP.
      if (!probed_ && req_.version == 11 && !answered_) {
        probed_ = true;
        if (!WriteRaw(kContinue)) return true;
      }
    }
    return false;
  }
  AccessInfo& access() override { return info_; }

  // ---- worker entry ----
  void RunHandler() {
    state_ = State::kWorker;
    const auto t0 = start_;
    if (auto e = DecodeBody(req_.Header("Content-Encoding"), req_.body, s_.opts.limits.max_decoded_body)) {
      HttpResponse r;
      r.status = e->status;
      r.body = s_.handler.ErrorBody(e->status, e->message);
      keep_alive_override_ = false;
      Respond(r);
    } else {
      try {
        s_.handler.Handle(req_, *this);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "server: internal error=\"%s\"\n", e.what());
        if (!answered_) {
          HttpResponse r;
          r.status = 500;
          r.body = s_.handler.ErrorBody(500, std::string("internal error: ") + e.what());
          Respond(r);
        } else {
          broken_ = true;
        }
      }
      if (!answered_) {
        HttpResponse r;
        r.status = 500;
        r.body = s_.handler.ErrorBody(500, "internal error: the request was not answered");
        Respond(r);
      }
    }
    if (streaming_ && !stream_ended_) broken_ = true;
    s_.handler.OnAnswered(req_, status_, info_, std::chrono::duration<double>(Clock::now() - t0).count());
    asio::post(s_.io, [self = shared_from_this()] { self->AfterWorker(); });
  }

 private:
  int fd() { return stream_.socket().native_handle(); }
  bool KeepAlive() const { return req_.keep_alive && keep_alive_override_ && !s_.stopping.load(); }

  // Blocking write from a worker, bounded by write_timeout per stall.
  bool WriteRaw(std::string_view data) {
    if (broken_) return false;
    const auto timeout = s_.opts.limits.write_timeout;
    while (!data.empty()) {
      const ssize_t n = ::send(fd(), data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd(), POLLOUT, 0};
        const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
        if (r > 0 && !(p.revents & (POLLERR | POLLHUP | POLLNVAL))) continue;
        if (r < 0 && errno == EINTR) continue;
      }
      broken_ = true;  // peer gone, reset, or not reading for write_timeout
      return false;
    }
    return true;
  }

  // A deadline for reading a head or a body. tcp_stream's own expiry closes the socket,
  // which would leave no way to answer 408; this one only cancels the read.
  void Arm(std::chrono::milliseconds d) {
    timed_out_ = false;
    stream_.expires_never();
    deadline_.expires_after(d);
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;  // cancelled: the read finished first
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
  }

  void WaitRequest() {
    state_ = State::kIdle;
    if (s_.stopping) return Close();
    if (buf_.size() > 0) return ReadHead();
    stream_.expires_after(s_.opts.limits.idle_timeout);
    stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->Close();
      self->buf_.commit(n);
      self->ReadHead();
    });
  }

  void ReadHead() {
    state_ = State::kHead;
    start_ = Clock::now();
    req_ = HttpRequest{};
    answered_ = streaming_ = stream_ended_ = probed_ = half_closed_ = false;
    keep_alive_override_ = true;
    status_ = 0;
    info_ = AccessInfo{};
    parser_.emplace();
    detail::ConfigureParser(*parser_, s_.opts.limits);
    Arm(s_.opts.limits.header_timeout);
    bhttp::async_read_header(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->deadline_.cancel();
      self->OnHead(ec);
    });
  }

  void OnHead(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    req_.remote = remote_;
    if (timed_out_) {
      return Fail({408, fmt::format("the request head did not arrive within {} s (--header-timeout)",
                                    s_.opts.limits.header_timeout.count() / 1000.0)});
    }
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        ec == asio::error::connection_reset) {
      return Close();
    }
    if (ec) return Fail(detail::ParseErrorToHttp(ec));
    HttpRequest head = detail::HeadFromParser(*parser_);
    head.remote = remote_;
    head.request_id = PickRequestId(head.Header("X-Request-Id"));
    req_ = std::move(head);
    const auto cl = parser_->content_length();
    if (auto e = CheckHead(req_, cl ? std::optional<uint64_t>(*cl) : std::nullopt, s_.opts.limits)) return Fail(*e);
    if (s_.stopping) return Fail({503, "the server is shutting down"});
    const bool has_body = parser_->chunked() || (cl && *cl > 0);
    if (auto r = s_.handler.OnHead(req_)) return WriteInline(std::move(*r), req_.keep_alive && !has_body);
    if (s_.queued.load() >= s_.opts.max_queued) {
      return Fail({503, fmt::format("{} requests are already waiting for a worker; retry later", s_.queued.load())});
    }
    if (has_body && req_.version == 11 && !req_.Header("Expect").empty()) {
      state_ = State::kWriting;
      stream_.expires_after(s_.opts.limits.write_timeout);
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    state_ = State::kBody;
    Arm(s_.opts.limits.body_timeout);
    bhttp::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->deadline_.cancel();
      self->OnBody(ec);
    });
  }

  void OnBody(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    if (timed_out_) {
      return Fail({408, fmt::format("the request body did not arrive within {} s (--body-timeout)",
                                    s_.opts.limits.body_timeout.count() / 1000.0)});
    }
    if (ec == asio::error::operation_aborted || ec == asio::error::connection_reset) return Close();
    if (ec == bhttp::error::body_limit) {
      return Fail({413, fmt::format("the request body is larger than {} bytes (--max-body)", s_.opts.limits.max_body)});
    }
    if (ec == bhttp::error::partial_message || ec == asio::error::eof) {
      return Close();  // the client closed before sending the whole body: nobody to answer
    }
    if (ec) return Fail(detail::ParseErrorToHttp(ec));
    req_.body = std::move(parser_->get().body());
    parser_.reset();
    stream_.expires_never();
    beast::error_code ignored;
    stream_.socket().non_blocking(true, ignored);
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(s_.mu);
      if (s_.queue.size() < static_cast<size_t>(s_.opts.max_queued)) {
        state_ = State::kQueued;
        s_.queue.push_back(shared_from_this());
        s_.queued.fetch_add(1);
        queued = true;
      }
    }
    if (!queued) return Fail({503, "too many requests are waiting for a worker; retry later"});
    s_.cv.notify_one();
  }

  // An answer from the I/O thread (cheap routes, refusals).
  void WriteInline(HttpResponse r, bool keep_alive) {
    keep_alive = keep_alive && req_.keep_alive && !s_.stopping;
    status_ = r.status;
    if (req_.request_id.empty()) req_.request_id = NewRequestId();
    out_ = SerializeResponse(r, req_.request_id, keep_alive);
    state_ = State::kWriting;
    stream_.expires_after(s_.opts.limits.write_timeout);
    asio::async_write(stream_, asio::buffer(out_),
                      [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        self->s_.handler.OnAnswered(
                            self->req_, self->status_, self->info_,
                            std::chrono::duration<double>(Clock::now() - self->start_).count());
                        self->out_.clear();
                        if (ec) return self->Close();
                        if (keep_alive) return self->WaitRequest();
                        self->LingerClose();
                      });
  }

  void AfterWorker() {
    state_ = State::kIdle;
    if (broken_ || half_closed_ || !KeepAlive()) return LingerClose();
    WaitRequest();
  }

  // Half-close, then read and drop what the client still sends for up to a second before
  // closing: closing with unread bytes would reset the connection and could destroy the
  // answer just written (a 413 while the client is still sending its body).
  void LingerClose() {
    if (state_ == State::kClosed) return;
    state_ = State::kClosed;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return stream_.close();
    stream_.expires_after(std::chrono::seconds(1));
    Drain();
  }
  void Drain() {
    buf_.clear();
    stream_.async_read_some(buf_.prepare(16384), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (4u << 20)) return self->stream_.close();
      self->Drain();
    });
  }

  void Close() {
    state_ = State::kClosed;
    deadline_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  HttpServer::Impl& s_;
  beast::tcp_stream stream_;
  asio::steady_timer deadline_;  // head and body reads (Arm)
  beast::flat_buffer buf_;
  std::optional<detail::RequestParser> parser_;
  std::string remote_;
  std::string out_;
  HttpRequest req_;
  AccessInfo info_;
  State state_ = State::kIdle;
  Clock::time_point start_ = Clock::now();
  int status_ = 0;
  size_t drained_ = 0;
  bool answered_ = false, streaming_ = false, stream_ended_ = false, broken_ = false;
  bool probed_ = false, half_closed_ = false, keep_alive_override_ = true, timed_out_ = false;
};

void HttpServer::Impl::Accept() {
  acceptor.async_accept(io, [this](beast::error_code ec, tcp::socket sock) {
    if (!acceptor.is_open() || stopping) return;
    if (ec) {
      // Out of descriptors and the like: wait a little rather than spin.
      std::fprintf(stderr, "server: accept failed: %s\n", ec.message().c_str());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code) { Accept(); });
      return;
    }
    beast::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);  // small SSE chunks must not wait for Nagle
    if (open.load() >= opts.limits.max_connections) {
      HttpResponse r;
      r.status = 503;
      r.body = handler.ErrorBody(503, "too many open connections; retry later");
      r.headers.emplace_back("Retry-After", "1");
      const std::string out = SerializeResponse(r, NewRequestId(), false);
      ::send(sock.native_handle(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort
      sock.shutdown(tcp::socket::shutdown_both, ignored);
      sock.close(ignored);
    } else {
      std::make_shared<Connection>(*this, std::move(sock))->Start();
    }
    Accept();
  });
}

void HttpServer::Impl::Sweep() {
  beast::error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
  std::deque<std::shared_ptr<Connection>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu);
    waiting.swap(queue);
    queued.store(0);
  }
  for (auto& c : waiting) c->Fail({503, "the server is shutting down"});
  waiting.clear();
  std::vector<Connection*> all(conns.begin(), conns.end());
  for (Connection* c : all) c->Abort();
  if (open.load() == 0) guard.reset();
}

void HttpServer::Impl::ConnectionEnded() {
  if (stopping && open.load() == 0) guard.reset();
}

void HttpServer::Impl::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return workers_stop || !queue.empty(); });
      if (queue.empty()) return;
      c = std::move(queue.front());
      queue.pop_front();
      queued.fetch_sub(1);
    }
    c->RunHandler();  // posts the connection back to the I/O thread
  }
}

HttpServer::HttpServer(HttpHandler& handler, HttpServerOptions opts)
    : impl_(std::make_unique<Impl>(handler, std::move(opts))) {}

HttpServer::~HttpServer() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->workers_stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) {
    if (t.joinable()) t.join();
  }
}

Status HttpServer::Bind() {
  beast::error_code ec;
  tcp::resolver resolver(impl_->io);
  auto eps = resolver.resolve(impl_->opts.host, std::to_string(impl_->opts.port), ec);
  if (ec || eps.empty()) return Unavailable(fmt::format("cannot resolve {}: {}", impl_->opts.host, ec.message()));
  const tcp::endpoint ep = eps.begin()->endpoint();
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);  // TIME_WAIT only; never SO_REUSEPORT
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable(fmt::format("cannot listen on {}:{}: {}", impl_->opts.host, impl_->opts.port, ec.message()));
  }
  impl_->port = a.local_endpoint(ec).port();
  return Status::Ok();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::Run() {
  for (int i = 0; i < std::max(1, impl_->opts.workers); ++i) impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
  if (!impl_->stopping) impl_->Accept();
  impl_->io.run();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->workers_stop = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->workers) t.join();
  impl_->workers.clear();
}

void HttpServer::BeginShutdown() {
  if (impl_->stopping.exchange(true)) return;
  asio::post(impl_->io, [this] { impl_->Sweep(); });
}

int HttpServer::open_connections() const { return impl_->open.load(); }
int HttpServer::queued_requests() const { return impl_->queued.load(); }

}  // namespace trellis::http

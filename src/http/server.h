// HttpServer: the socket side of `trellis serve` (and of `trellis store`'s /metrics), on Boost.Asio + Beast.
//
// One I/O thread runs every connection asynchronously: accept (at most
// HttpLimits::max_connections open; past that a 503 and close), read the head under a
// total deadline, ask the handler about it (OnHead, on the I/O thread: cheap answers such
// as /health and /metrics and every refusal that needs no body are given here, so they
// never wait behind generations), then read the body under its own deadline and byte
// bound. A request that needs work (OnHead returned nothing) goes to a fixed pool of
// worker threads through a bounded queue (full: 503 + Retry-After); the worker decodes
// the body and runs Handle, which answers through an HttpExchange: one whole response or
// a chunked stream, written with blocking, deadline-bounded writes on the socket the
// worker now owns. The connection then returns to the I/O thread for its next request.
//
// Disconnects: a stream notices a closed client at its next write. For a long answer
// written only at the end, Handle polls ClientGone(): an error or hang-up on the socket
// means gone; a FIN alone may be a half-close (HTTP/1.1 allows a client to shut down its
// sending side and wait), so the first FIN is answered with an interim "100 Continue",
// which a half-closed client skips and a closed one answers with a reset.
//
// Shutdown: BeginShutdown stops accepting, closes idle and reading connections and
// answers queued requests 503; requests in workers finish (the owner cancels their
// generations so they end promptly); Run returns once every connection is gone.
//
// Thread safety: Bind, then Run on one thread; BeginShutdown from any thread. Handler
// methods: OnHead on the I/O thread, Handle on workers (concurrently), OnAnswered on
// either.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "http/http.h"
#include "util/status.h"

namespace trellis::http {

// Token counts a handler reports for the access log.
struct AccessInfo {
  int prompt_tokens = -1;  // -1: not a generation
  int cached_tokens = 0;
  int completion_tokens = 0;
};

// The worker side of one request: how Handle answers.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // One whole response. False if the client is gone (or a write timed out).
  virtual bool Respond(const HttpResponse& r) = 0;
  // A chunked response: the head, then chunks, then the terminating chunk.
  virtual bool BeginStream(int status, std::string_view content_type,
                           const std::vector<std::pair<std::string, std::string>>& headers) = 0;
  virtual bool WriteChunk(std::string_view data) = 0;
  virtual bool EndStream() = 0;
  // Non-blocking: true once the client has certainly gone (see the file comment).
  virtual bool ClientGone() = 0;
  virtual AccessInfo& access() = 0;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // On the I/O thread with the head (body empty). A response answers the request now
  // (the body, if any, is not read, and the connection closes after it); nullopt reads
  // the body and queues Handle. Must be quick and must not block.
  virtual std::optional<HttpResponse> OnHead(const HttpRequest& head) = 0;
  // On a worker thread with the decoded body. Must answer through `ex` exactly once.
  virtual void Handle(const HttpRequest& req, HttpExchange& ex) = 0;
  // After each answer: for the access log and metrics.
  virtual void OnAnswered(const HttpRequest& req, int status, const AccessInfo& info, double seconds) = 0;
  // The body of an HTTP-level error (OpenAI-shaped JSON).
  virtual std::string ErrorBody(int status, const std::string& message) const = 0;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  HttpLimits limits;
  int workers = 48;        // threads running Handle
  int max_queued = 256;    // requests waiting for a worker; beyond: 503
};

class Connection;

class HttpServer {
 public:
  HttpServer(HttpHandler& handler, HttpServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (SO_REUSEADDR only: a second process cannot share the port).
  Status Bind();
  int port() const;
  // Serves until BeginShutdown, then until every connection has ended.
  void Run();
  void BeginShutdown();

  // Gauges for /metrics.
  int open_connections() const;
  int queued_requests() const;

 private:
  friend class Connection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trellis::http

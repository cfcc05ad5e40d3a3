// Server: the OpenAI-compatible HTTP front end of `trellis serve`.
//
// cpp-httplib runs a pool of HTTP threads. Each request is parsed into a typed request
// (api.h), rendered with the chat template, tokenized and checked against the context on
// its HTTP thread, then handed to the engine thread as a Generation (EngineLoop::Submit).
// Streaming answers are written as SSE by httplib's chunked content provider, which also
// notices a closed connection and cancels the request. A non-streamed answer is one JSON
// body written at the end; while it is generated, the handler watches the connection's
// socket (found by its addresses, see FindConnectionSocket in server.cc) and cancels the
// request when the client has closed it. Endpoints, options and the cache-salt design are
// in docs/server.md.
//
// Tenancy: with API keys configured, every request must carry `Authorization: Bearer
// <key>` (compared in constant time); the engine's cache salt is a hash of the key, so
// requests of different keys never share KV blocks (unless share_cache is set). Clients
// cannot choose a salt. Without keys, everyone shares one namespace.
//
// Thread safety: Run blocks the calling thread; Stop may be called from any thread (e.g.
// a signal-waiting thread) and makes Run return once in-flight requests have ended.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "engine/model.h"
#include "model/tokenizer.h"
#include "server/api.h"
#include "server/chat_template.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace trellis::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_id;               // the name /v1/models reports and requests may give
  std::vector<std::string> api_keys;  // empty: no authentication, one cache namespace
  bool share_cache = false;           // keys share one cache namespace
  int http_threads = 0;               // 0: max_running + 32
};

class Server {
 public:
  // Borrows model, tokenizer and engine, which must outlive the Server.
  Server(const Model& model, const Tokenizer& tok, ChatTemplate chat, EngineLoop& engine, ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port). Error if the address is taken.
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(). REQUIRES: Bind() succeeded.
  void Run();
  // Cancels in-flight generations and stops the listener.
  void Stop();

  // Exposed for tests: the cache salt a key maps to (0 without keys).
  static uint64_t SaltForKey(const std::string& key);

 private:
  void Routes();
  // Authorization check; on failure fills `res` and returns false. `salt` gets the caller's.
  bool Authorize(const httplib::Request& req, httplib::Response& res, uint64_t& salt) const;
  void HandleChat(const httplib::Request& req, httplib::Response& res);
  void HandleCompletion(const httplib::Request& req, httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  // Checks the prompt against the context, runs it and answers (streamed or not).
  void Generate(Endpoint ep, std::vector<int32_t> prompt, const GenerationParams& gen, uint64_t salt,
                const std::string& echo, const httplib::Request& req, httplib::Response& res);
  void SendError(httplib::Response& res, const ApiError& e) const;
  void Track(RequestId id, bool add);

  const Model& model_;
  const Tokenizer& tok_;
  const ChatTemplate chat_;
  EngineLoop& engine_;
  const ServerOptions opts_;
  ApiLimits limits_;
  int64_t created_ = 0;
  std::atomic<uint64_t> next_seed_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stopping_{false};
  int port_ = 0;
  int listen_fd_ = -1;  // the listening socket, for the backlog (see Bind)
  ServerMetrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::mutex mu_;
  std::set<RequestId> active_;  // GUARDED_BY(mu_): generations in flight, cancelled by Stop
};

}  // namespace trellis::server

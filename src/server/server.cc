#include "server/server.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <chrono>
#include <cstdio>

#include <fmt/core.h>
#include <httplib.h>

#include "server/generation.h"

namespace trellis::server {
namespace {

using namespace std::chrono_literals;

constexpr const char* kJson = "application/json";

// Compares every byte of the longer string whatever the contents, so the time taken
// says nothing about how much of a guess was right (only about its length).
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

uint64_t Mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string RandomHex(uint64_t x) { return fmt::format("{:016x}", Mix64(x)); }

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

ApiError MakeError(int status, std::string message, std::string type = "invalid_request_error", std::string code = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// The address and port of one end of a socket, formatted as cpp-httplib formats
// Request::remote_addr / local_addr (getnameinfo, NI_NUMERICHOST). False if not TCP/IP.
bool SocketEnd(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(fd, sa, &len) : ::getsockname(fd, sa, &len)) != 0) return false;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  char host[NI_MAXHOST];
  if (::getnameinfo(sa, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return false;
  ip = host;
  return true;
}

// The socket a request arrived on, or -1. cpp-httplib 0.11 shows a handler no socket, so
// this looks through the process's descriptors for the one TCP connection with the
// request's two ends: a connected 4-tuple belongs to one socket only, and this one stays
// open while its handler runs. Costs two syscalls per open descriptor, once per request
// that runs long enough to be watched.
int FindConnectionSocket(const httplib::Request& req) {
  if (req.remote_port <= 0 || req.local_port <= 0) return -1;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  std::string ip;
  int port = 0;
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    const int s = static_cast<int>(fd);
    if (SocketEnd(s, /*peer=*/true, ip, port) && port == req.remote_port && ip == req.remote_addr &&
        SocketEnd(s, /*peer=*/false, ip, port) && port == req.local_port && ip == req.local_addr) {
      found = s;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// False once the client has closed its end of the connection (or it failed). A client
// that only shuts down its sending side is taken as gone too, as httplib's
// DataSink::is_writable (what the streaming path relies on) does.
bool PeerConnected(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;    // bytes waiting (a pipelined request): still there
  if (n == 0) return false;  // orderly close
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

// How often a non-streamed request checks that its client is still connected.
constexpr auto kPeerCheckInterval = 50ms;

}  // namespace

uint64_t Server::SaltForKey(const std::string& key) {
  // FNV-1a over a domain-separated key, then a mixer. The salt never leaves the server.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : std::string("trellis-cache-salt/v1:") + key) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  h = Mix64(h);
  return h == 0 ? 1 : h;
}

Server::Server(const Model& model, const Tokenizer& tok, ChatTemplate chat, EngineLoop& engine, ServerOptions opts)
    : model_(model),
      tok_(tok),
      chat_(std::move(chat)),
      engine_(engine),
      opts_(std::move(opts)),
      created_(UnixNow()),
      next_seed_(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())),
      http_(std::make_unique<httplib::Server>()) {
  limits_.model_id = opts_.model_id;
  limits_.n_ctx = engine_.options().n_ctx;
  limits_.n_vocab = model_.config().n_vocab;
  const int threads = opts_.http_threads > 0 ? opts_.http_threads : engine_.options().max_running + 32;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(16u << 20);
  // Streamed chunks are small: without TCP_NODELAY, Nagle holds them ~40 ms on a reused
  // connection (TTFT 6 -> 45 ms on the tiny model, found by trellis bench serve).
  http_->set_tcp_nodelay(true);
  http_->set_keep_alive_timeout(5);
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);
  // Remember the listening socket (and keep httplib's reuse option) so Bind can widen the
  // accept backlog: Debian's cpp-httplib is a compiled library that listens with a
  // backlog of 5, and a burst of clients connecting at once (64 in the load test) then
  // overflows the accept queue and gets connections reset.
  http_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEPORT, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  Routes();
}

Server::~Server() = default;

Status Server::Bind() {
  if (opts_.port == 0) {
    port_ = http_->bind_to_any_port(opts_.host);
    if (port_ < 0) return Unavailable(fmt::format("cannot bind {}:0", opts_.host));
  } else if (http_->bind_to_port(opts_.host, opts_.port)) {
    port_ = opts_.port;
  } else {
    return Unavailable(fmt::format("cannot bind {}:{} (address in use or not local?)", opts_.host, opts_.port));
  }
  // Calling listen() again on a bound socket updates its backlog (Linux).
  if (listen_fd_ >= 0 && ::listen(listen_fd_, SOMAXCONN) != 0) {
    return Unavailable(fmt::format("cannot widen the listen backlog: {}", std::strerror(errno)));
  }
  return Status::Ok();
}

void Server::Run() { http_->listen_after_bind(); }

void Server::Stop() {
  stopping_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (RequestId id : active_) engine_.Cancel(id);
  }
  http_->stop();
}

void Server::Track(RequestId id, bool add) {
  std::lock_guard<std::mutex> lock(mu_);
  if (add) {
    active_.insert(id);
  } else {
    active_.erase(id);
  }
}

void Server::SendError(httplib::Response& res, const ApiError& e) const {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(ErrorJson(e), kJson);
}

bool Server::Authorize(const httplib::Request& req, httplib::Response& res, uint64_t& salt) const {
  salt = 0;
  if (opts_.api_keys.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view given = auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0
                                     ? std::string_view(auth).substr(kBearer.size())
                                     : std::string_view();
  int match = -1;
  for (size_t i = 0; i < opts_.api_keys.size(); ++i) {  // no early exit: every key is compared
    if (ConstantTimeEquals(given, opts_.api_keys[i]) && !given.empty()) match = static_cast<int>(i);
  }
  if (match < 0) {
    ApiError e = MakeError(401, given.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                              : "incorrect API key provided",
                           "invalid_request_error", "invalid_api_key");
    SendError(res, e);
    res.set_header("WWW-Authenticate", "Bearer");
    return false;
  }
  salt = opts_.share_cache ? 0 : SaltForKey(opts_.api_keys[static_cast<size_t>(match)]);
  return true;
}

void Server::Routes() {
  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", kJson);
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Render(engine_.metrics(), engine_.queue_depth()), "text/plain; version=0.0.4");
  });
  auto models = [this](const httplib::Request& req, httplib::Response& res) {
    uint64_t salt = 0;
    if (!Authorize(req, res, salt)) return;
    res.set_content(ModelsJson(opts_.model_id, created_, engine_.options().n_ctx), kJson);
  };
  http_->Get("/v1/models", models);
  http_->Get("/models", models);
  http_->Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleChat(q, r); });
  http_->Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleChat(q, r); });
  http_->Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleCompletion(q, r); });
  http_->Post("/completions", [this](const httplib::Request& q, httplib::Response& r) { HandleCompletion(q, r); });
  http_->Post("/tokenize", [this](const httplib::Request& q, httplib::Response& r) { HandleTokenize(q, r); });
  http_->Post("/detokenize", [this](const httplib::Request& q, httplib::Response& r) { HandleDetokenize(q, r); });

  http_->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      SendError(res, MakeError(404, "no route for " + req.method + " " + req.path, "invalid_request_error",
                               "not_found"));
    } else if (res.status == 413) {
      SendError(res, MakeError(413, "request body too large"));
    } else {
      SendError(res, MakeError(res.status, "HTTP error " + std::to_string(res.status)));
    }
  });
  http_->set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "server: internal error=\"%s\"\n", what.c_str());
    SendError(res, MakeError(500, "internal error: " + what, "server_error"));
  });
  http_->set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Known routes only: a client must not grow the label set with made-up paths.
    static const std::set<std::string> kRoutes = {"/health", "/metrics", "/v1/models", "/models",
                                                  "/v1/chat/completions", "/chat/completions", "/v1/completions",
                                                  "/completions", "/tokenize", "/detokenize"};
    metrics_.CountRequest(kRoutes.count(req.path) ? req.path : "other", res.status);
  });
}

void Server::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  uint64_t salt = 0;
  if (!Authorize(req, res, salt)) return;
  auto r = ParseTokenizeRequest(req.body);
  if (!r.ok()) return SendError(res, r.error());
  const std::vector<int32_t> ids = tok_.Encode(r->content, r->add_special && tok_.add_bos(), true);
  std::vector<std::string> pieces;
  if (r->with_pieces) {
    for (int32_t id : ids) pieces.push_back(tok_.TokenToPiece(id, true));
  }
  res.set_content(TokenizeJson(ids, r->with_pieces ? &pieces : nullptr), kJson);
}

void Server::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  uint64_t salt = 0;
  if (!Authorize(req, res, salt)) return;
  auto r = ParseDetokenizeRequest(req.body, limits_);
  if (!r.ok()) return SendError(res, r.error());
  res.set_content(DetokenizeJson(tok_.Decode(r->tokens)), kJson);
}

void Server::HandleChat(const httplib::Request& req, httplib::Response& res) {
  uint64_t salt = 0;
  if (!Authorize(req, res, salt)) return;
  auto r = ParseChatCompletionRequest(req.body, limits_);
  if (!r.ok()) return SendError(res, r.error());
  auto text = chat_.Render(r->messages, /*add_generation_prompt=*/true);
  if (!text.ok()) {
    ApiError e = MakeError(400, text.status().message());
    e.param = "messages";
    return SendError(res, e);
  }
  // Templates that spell out bos_token (llama3, mistral) must not get a second one.
  const std::string& bos = chat_.tokens().bos;
  const bool has_bos = !bos.empty() && text->compare(0, bos.size(), bos) == 0;
  std::vector<int32_t> prompt = tok_.Encode(*text, tok_.add_bos() && !has_bos, /*parse_special=*/true);
  Generate(Endpoint::kChat, std::move(prompt), r->gen, salt, "", req, res);
}

void Server::HandleCompletion(const httplib::Request& req, httplib::Response& res) {
  uint64_t salt = 0;
  if (!Authorize(req, res, salt)) return;
  auto r = ParseCompletionRequest(req.body, limits_);
  if (!r.ok()) return SendError(res, r.error());
  std::vector<int32_t> prompt =
      r->prompt_text ? tok_.Encode(*r->prompt_text, tok_.add_bos(), /*parse_special=*/true) : r->prompt_tokens;
  std::string echo;
  if (r->echo) echo = r->prompt_text ? *r->prompt_text : tok_.Decode(r->prompt_tokens);
  Generate(Endpoint::kCompletion, std::move(prompt), r->gen, salt, echo, req, res);
}

void Server::Generate(Endpoint ep, std::vector<int32_t> prompt, const GenerationParams& gen, uint64_t salt,
                      const std::string& echo, const httplib::Request& req, httplib::Response& res) {
  if (stopping_) return SendError(res, MakeError(503, "the server is shutting down", "server_error"));
  const SchedulerOptions& so = engine_.options();
  const int n = static_cast<int>(prompt.size());
  if (n == 0) return SendError(res, MakeError(400, "the prompt is empty"));
  if (n >= so.n_ctx) {
    ApiError e = MakeError(400, fmt::format("this model's context is {} tokens; the prompt has {} tokens", so.n_ctx, n),
                           "invalid_request_error", "context_length_exceeded");
    e.param = ep == Endpoint::kChat ? "messages" : "prompt";
    return SendError(res, e);
  }
  if ((n + so.block_size) / so.block_size > so.kv_blocks) {
    return SendError(res, MakeError(400, fmt::format("the prompt of {} tokens needs more KV memory than the server has "
                                                     "({} blocks of {})", n, so.kv_blocks, so.block_size),
                                    "invalid_request_error", "context_length_exceeded"));
  }
  Generation::Params p;
  p.prompt = std::move(prompt);
  p.gen = gen;
  p.cache_salt = salt;
  p.seed = Mix64(next_seed_.fetch_add(1));
  auto g = std::make_shared<Generation>(engine_, tok_, metrics_, std::move(p));
  if (auto err = g->Start()) return SendError(res, *err);
  Track(g->id(), true);
  if (stopping_) g->Cancel();  // Stop() ran between the check above and Track

  const std::string id = (ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + RandomHex(next_id_.fetch_add(1));
  const int64_t created = UnixNow();

  if (!gen.stream) {
    CompletionResponse out;
    out.endpoint = ep;
    out.id = id;
    out.created = created;
    out.model = opts_.model_id;
    out.text = echo;
    out.with_logprobs = gen.logprobs;
    // The body is written only at the end (with its Content-Length and the final status),
    // so a closed connection cannot show up as a failed write as it does for streams:
    // look at the socket every kPeerCheckInterval instead, and cancel when the client is
    // gone. The socket is looked up at the first check: short requests never pay for it.
    int fd = -2;  // -2: not looked up yet; -1: not found (not watched)
    bool client_gone = false;
    auto next_check = std::chrono::steady_clock::now() + kPeerCheckInterval;
    for (;;) {
      GenerationDelta d = g->Next(kPeerCheckInterval);
      out.text += d.text;
      for (auto& lp : d.logprobs) out.logprobs.push_back(std::move(lp));
      if (d.done) break;
      const auto now = std::chrono::steady_clock::now();
      if (client_gone || now < next_check) continue;
      next_check = now + kPeerCheckInterval;
      if (fd == -2) fd = FindConnectionSocket(req);
      if (fd >= 0 && !PeerConnected(fd)) {
        client_gone = true;
        metrics_.CountDisconnect();
        g->Cancel();  // Next() reports done once the engine has dropped the request
      }
    }
    Track(g->id(), false);
    if (client_gone) {
      // Nobody reads this; 499 (nginx's "client closed request") labels it in the metrics.
      return SendError(res, MakeError(499, "the client closed the connection", "invalid_request_error",
                                      "client_closed_request"));
    }
    if (g->failed()) return SendError(res, MakeError(stopping_ ? 503 : 500, g->error_message(), "server_error"));
    out.finish_reason = g->finish_reason();
    out.usage = g->usage();
    res.set_content(ResponseJson(out), kJson);
    return;
  }

  // Streaming: one SSE event per batch of new text. State shared by the provider calls.
  struct StreamState {
    bool first = true;
    bool finished = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<StreamState>();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, g, st, ep, id, created, gen, echo](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&](const std::string& payload) {
          const std::string ev = "data: " + payload + "\n\n";
          st->last_write = std::chrono::steady_clock::now();
          return sink.write(ev.data(), ev.size());
        };
        StreamChunk c;
        c.endpoint = ep;
        c.id = id;
        c.created = created;
        c.model = opts_.model_id;
        c.with_logprobs = gen.logprobs;
        c.usage_null = gen.include_usage;
        bool ok = true;
        if (st->first) {
          st->first = false;
          if (ep == Endpoint::kChat) {
            c.role = true;
            ok = send(ChunkJson(c));
            c.role = false;
          } else if (!echo.empty()) {
            c.text = echo;
            ok = send(ChunkJson(c));
            c.text.clear();
          }
        }
        GenerationDelta d = ok ? g->Next(250ms) : GenerationDelta{};
        if (ok && (!d.text.empty() || !d.logprobs.empty())) {
          c.text = std::move(d.text);
          c.logprobs = std::move(d.logprobs);
          ok = send(ChunkJson(c));
          c.text.clear();
          c.logprobs.clear();
        }
        if (ok && d.done) {
          if (g->failed()) {
            ok = send(ErrorJson(MakeError(stopping_ ? 503 : 500, g->error_message(), "server_error")));
          } else {
            c.finish_reason = g->finish_reason();
            ok = send(ChunkJson(c));
            if (ok && gen.include_usage) ok = send(UsageChunkJson(ep, id, created, opts_.model_id, g->usage()));
          }
          if (ok) {
            static constexpr std::string_view kDone = "data: [DONE]\n\n";
            ok = sink.write(kDone.data(), kDone.size());
          }
          if (ok) {
            st->finished = true;
            sink.done();
            return true;
          }
        }
        if (ok && std::chrono::steady_clock::now() - st->last_write > 1s) {
          // An SSE comment: ignored by clients, and how a closed connection shows up while
          // a long prompt is still being computed.
          static constexpr std::string_view kPing = ": ping\n\n";
          st->last_write = std::chrono::steady_clock::now();
          ok = sink.write(kPing.data(), kPing.size());
        }
        if (!ok) {
          metrics_.CountDisconnect();
          g->Cancel();
          return false;
        }
        return true;
      },
      [this, g, st](bool success) {
        if (!success || !st->finished) g->Cancel();
        Track(g->id(), false);
      });
}

}  // namespace trellis::server

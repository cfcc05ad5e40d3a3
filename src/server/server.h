// Server: the OpenAI-compatible HTTP front end of `trellis serve`.
//
// The socket side is HttpServer (http/server.h: Boost.Beast on one I/O thread, a bounded
// pool of workers). This class is its handler: cheap routes (/health, /metrics,
// /v1/models) and every refusal that needs no body (401, 404, 405) are answered on the
// I/O thread from the request head alone, so they stay fast under any generation load and
// no body is read before authentication. Generation requests are parsed into typed
// requests (api.h), rendered with the chat template, tokenized and checked against the
// context on a worker, then handed to the engine thread as a Generation
// (EngineLoop::Submit). The worker writes the answer: SSE chunks as text arrives, or one
// JSON body at the end while polling the socket for a client that has gone.
// Endpoints, options, limits and the cache-salt design are in docs/server.md.
//
// Tenancy: with API keys configured, every request but /health must carry
// `Authorization: Bearer <key>` (scheme case-insensitive, key compared in constant time);
// the engine's cache salt is a hash of the key, so requests of different keys never share
// KV blocks (unless share_cache is set). Clients cannot choose a salt. Without keys,
// everyone shares one namespace.
//
// Thread safety: Run blocks the calling thread; Stop may be called from any thread (e.g.
// a signal-waiting thread): it stops accepting, cancels in-flight generations (their
// streams end with an error event and [DONE]) and makes Run return once every connection
// has ended.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/constraint.h"
#include "engine/engine_loop.h"
#include "engine/model.h"
#include "model/tokenizer.h"
#include "server/answer_writer.h"
#include "server/api.h"
#include "server/chat_template.h"
#include "server/dialects.h"
#include "server/tool_calls.h"
#include "http/server.h"
#include "server/metrics.h"
#include "server/reasoning.h"

namespace trellis::server {

// The HTTP types this server speaks (src/http).
using http::AccessInfo;
using http::HttpExchange;
using http::HttpHandler;
using http::HttpLimits;
using http::HttpRequest;
using http::HttpResponse;
using http::HttpServer;
using http::HttpServerOptions;

enum class LogFormat { kText, kJson };

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_id;               // the name /v1/models reports and requests may give
  std::vector<std::string> api_keys;  // empty: no authentication, one cache namespace
  std::string metrics_key;            // protects /metrics; "" with api_keys: any API key
  bool share_cache = false;           // keys share one cache namespace
  int http_threads = 0;               // 0: max_running + 32
  int max_queue = 256;                // requests waiting for an HTTP worker; beyond: 503
  size_t max_prompt_bytes = 0;        // 0: n_ctx x the longest token piece
  HttpLimits http;
  LogFormat log_format = LogFormat::kText;
  bool access_log = true;
  // --reasoning-format: "deepseek" splits <think> blocks into reasoning_content (when the
  // template writes them), "none" leaves them in content.
  std::string reasoning_format = "deepseek";
  // Extra health check for /health (a grid head's nodes): {ok, reason}. Called on the
  // HTTP I/O thread: must be quick and thread-safe.
  std::function<std::pair<bool, std::string>()> health = nullptr;
  // More Prometheus text appended to /metrics (same thread rules as health).
  std::function<std::string()> extra_metrics = nullptr;
  // Fields added to /health's JSON that do not make it unhealthy (the prefix store being
  // down: the server serves without it), e.g. {"store", "down"}.
  std::function<std::vector<std::pair<std::string, std::string>>()> health_fields = nullptr;
  // More sections of the cache view (GET /trellis/v1/cache): {key, a JSON value's text},
  // e.g. {"store", ...} with the prefix store's servers, {"grid", ...} with the grid's
  // nodes. Called on an HTTP worker for every view; may wait on the network (bounded).
  std::function<std::vector<std::pair<std::string, std::string>>()> cache_view_sections = nullptr;
  // The GGUF file served (/props, Ollama's /api/tags and /api/show); "" and 0 if unknown.
  std::string model_path;
  uint64_t model_bytes = 0;
  // The web page at / (webui.h): on unless --no-webui; webui_path: a folder served
  // instead of the embedded page (its index.html at /, its other files at /webui/NAME).
  bool webui = true;
  std::string webui_path;
  // Responses kept for previous_response_id: at most this many, this many bytes, this long.
  size_t responses_max = 1024;
  size_t responses_max_bytes = 64ull << 20;
  int responses_ttl_s = 3600;
};

// splitmix64's finalizer: ids, salts and the cache view's hashes (server.cc).
uint64_t Mix64(uint64_t z);

// Reported by /api/version and /props.
inline constexpr char kServerVersion[] = "0.1.0";

class Server : public HttpHandler {
 public:
  // Borrows model, tokenizer and engine, which must outlive the Server.
  Server(const Model& model, const Tokenizer& tok, ChatTemplate chat, EngineLoop& engine, ServerOptions opts);
  ~Server() override;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (port 0: any free port). Error if the address is taken.
  Status Bind();
  int port() const { return http_->port(); }
  // The tool-call syntax answers are held to and parsed in (from the template).
  ToolCallFormat tool_format() const { return tool_format_; }
  // Serves until Stop() and until every connection has ended. REQUIRES: Bind() succeeded.
  void Run();
  // Stops accepting, cancels in-flight generations, answers queued requests 503.
  void Stop();

  // Exposed for tests: the cache salt a key maps to (0 without keys).
  static uint64_t SaltForKey(const std::string& key);

  // HttpHandler
  std::optional<HttpResponse> OnHead(const HttpRequest& head) override;
  void Handle(const HttpRequest& req, HttpExchange& ex) override;
  void OnAnswered(const HttpRequest& req, int status, const AccessInfo& info, double seconds) override;
  std::string ErrorBody(int status, const std::string& message) const override;

 private:
  // The caller's cache salt, or the 401 to answer.
  std::optional<HttpResponse> Authorize(const HttpRequest& req, uint64_t& salt) const;
  void HandleChat(const HttpRequest& req, uint64_t salt, HttpExchange& ex);
  void HandleCompletion(const HttpRequest& req, uint64_t salt, HttpExchange& ex);
  void HandleTokenize(const HttpRequest& req, HttpExchange& ex);
  void HandleDetokenize(const HttpRequest& req, HttpExchange& ex);
  // The chat request rendered with the template and tokenized, or the 400 to answer.
  Parsed<std::vector<int32_t>> RenderChat(const ChatCompletionRequest& r, const char* prompt_param,
                                          std::string* prompt_text) const;
  // The GET and DELETE routes answered from the head: /props, Ollama's tags, version and
  // ps, a stored response. nullopt for the others.
  std::optional<HttpResponse> AnswerHead(int route, const HttpRequest& req, uint64_t salt);
  void HandleApplyTemplate(const HttpRequest& req, HttpExchange& ex);
  void HandleResponses(const HttpRequest& req, uint64_t salt, HttpExchange& ex);
  void HandleMessages(const HttpRequest& req, uint64_t salt, HttpExchange& ex);
  void HandleCountTokens(const HttpRequest& req, HttpExchange& ex);
  void HandleOllama(const HttpRequest& req, uint64_t salt, HttpExchange& ex, bool generate);
  void HandleOllamaShow(const HttpRequest& req, HttpExchange& ex);
  // GET /trellis/v1/cache: the pool and the radix tree, the viewer's own prefixes with
  // their text (docs/server.md, "The cache view").
  void HandleCacheView(const HttpRequest& req, uint64_t salt, HttpExchange& ex);
  // GET / and /webui/NAME: the page's files, or 404.
  HttpResponse WebPage(std::string_view path) const;
  // Renders a chat request with the template, builds the grammar its tools and output
  // constraint hold the answer to, and runs it (every chat dialect ends here).
  // prompt_param: the request field the prompt came from, for errors.
  void ServeChat(ChatCompletionRequest& r, uint64_t salt, const char* prompt_param, HttpExchange& ex, AnswerWriter& w);
  // Checks the prompt against the context, runs it and answers through `w` (streamed or
  // not). reasoning: how the answer's text is split (a default one: all content); tools:
  // where its calls are found (a default one: none).
  void Generate(std::vector<int32_t> prompt, const GenerationParams& gen, uint64_t salt, const char* prompt_param,
                HttpExchange& ex, AnswerWriter& w, ReasoningSplitter reasoning = {}, ToolCallStream tools = {});
  // A fresh id suffix (16 hex digits) for answers and stored responses.
  std::string NewId();
  void SendError(HttpExchange& ex, const ApiError& e) const;
  void Track(RequestId id, bool add);

  const Model& model_;
  const Tokenizer& tok_;
  const ChatTemplate chat_;
  // How the model writes tool calls: its template's syntax, or the generic one written
  // into the prompt for templates that do not render tools (PolyfillTools).
  const ToolCallFormat tool_format_;
  // Its markers that are control tokens in this vocabulary, rendered as text (sorted).
  std::vector<int32_t> marker_tokens_;
  EngineLoop& engine_;
  const ServerOptions opts_;
  ApiLimits limits_;
  // The vocabulary's token bytes for constrained decoding, built on the first request that
  // needs them (O(n_vocab)); compiled grammars by hash.
  std::once_flag grammars_once_;
  std::unique_ptr<GrammarCache> grammars_;
  GrammarCache& grammars();
  int64_t created_ = 0;
  std::atomic<uint64_t> next_seed_;
  std::atomic<uint64_t> next_id_;  // random start: ids differ across restarts
  std::atomic<bool> stopping_{false};
  ServerMetrics metrics_;
  std::unique_ptr<HttpServer> http_;
  std::mutex mu_;
  std::set<RequestId> active_;  // GUARDED_BY(mu_): generations in flight, cancelled by Stop
  std::mutex log_mu_;           // one access line at a time
  ResponseStore responses_;     // for previous_response_id and GET /v1/responses/{id}
  const uint64_t view_secret_;  // keys the cache view's node hashes (random per process)
};

}  // namespace trellis::server

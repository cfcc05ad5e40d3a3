#include "server/server.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "grammar/stacks.h"
#include "server/answer_writer.h"
#include "server/dialects.h"
#include "server/generation.h"
#include "server/webui.h"

namespace trellis::server {

uint64_t Mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

using http::IEquals;
namespace {

using namespace std::chrono_literals;

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


std::string RandomHex(uint64_t x) { return fmt::format("{:016x}", Mix64(x)); }

// A tool call's id: a prefix ("call_", Anthropic's "toolu_") and 24 random letters and
// digits, as OpenAI's; nine letters
// and digits for Mistral, whose templates refuse any other id when the call comes back.
std::string CallId(ToolCallFormat f, const std::string& prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  const bool mistral = f == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : prefix;
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlphabet[rng() % 62];
  return id;
}

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
      tool_format_(chat_.renders_tools() ? DetectToolCallFormat(chat_.source()) : ToolCallFormat::kGeneric),
      engine_(engine),
      opts_(std::move(opts)),
      created_(UnixNow()),
      next_seed_(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())),
      next_id_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()),
      responses_(opts_.responses_max, opts_.responses_max_bytes, std::chrono::seconds(opts_.responses_ttl_s)),
      view_secret_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {
  for (std::string_view marker : ToolCallMarkers(tool_format_)) {
    const std::vector<int32_t> ids = tok_.Encode(marker, /*add_bos=*/false, /*parse_special=*/true);
    if (ids.size() == 1 && tok_.TokenToPiece(ids[0]).empty() && tok_.TokenToPiece(ids[0], true) == marker) {
      marker_tokens_.push_back(ids[0]);
    }
  }
  std::sort(marker_tokens_.begin(), marker_tokens_.end());
  limits_.model_id = opts_.model_id;
  limits_.n_ctx = engine_.options().n_ctx;
  limits_.n_vocab = model_.config().n_vocab;
  // A text longer than this cannot fit the context whatever it tokenizes to: refused
  // before tokenizing (a 10 MB prompt took 3.5 s to tokenize).
  limits_.max_prompt_bytes =
      opts_.max_prompt_bytes > 0
          ? opts_.max_prompt_bytes
          : std::min(static_cast<size_t>(limits_.n_ctx) * std::max<size_t>(1, tok_.max_token_bytes()),
                     opts_.http.max_decoded_body);
  HttpServerOptions h;
  h.host = opts_.host;
  h.port = opts_.port;
  h.limits = opts_.http;
  h.workers = opts_.http_threads > 0 ? opts_.http_threads : engine_.options().max_running + 32;
  h.max_queued = opts_.max_queue;
  http_ = std::make_unique<HttpServer>(*this, h);
}

Server::~Server() = default;

std::string Server::NewId() { return RandomHex(next_id_.fetch_add(1)); }

GrammarCache& Server::grammars() {
  std::call_once(grammars_once_, [this] { grammars_ = std::make_unique<GrammarCache>(MakeTokenVocabulary(tok_, marker_tokens_)); });
  return *grammars_;
}

Status Server::Bind() { return http_->Bind(); }

void Server::Run() { http_->Run(); }

void Server::Stop() {
  stopping_ = true;
  http_->BeginShutdown();
  std::lock_guard<std::mutex> lock(mu_);
  for (RequestId id : active_) engine_.Cancel(id);
}

void Server::Track(RequestId id, bool add) {
  std::lock_guard<std::mutex> lock(mu_);
  if (add) {
    active_.insert(id);
  } else {
    active_.erase(id);
  }
}

std::string Server::ErrorBody(int status, const std::string& message) const {
  return ErrorJson(MakeError(status, message, status >= 500 ? "server_error" : "invalid_request_error"));
}

namespace {

HttpResponse ErrorResponse(const ApiError& e) { return OpenAiErrorResponse(e); }

// The credentials of `Authorization: Bearer <token>`; the scheme is case-insensitive
// (RFC 9110 11.1), one or more spaces follow it.
std::string_view BearerToken(std::string_view auth) {
  if (auth.size() < 7 || !IEquals(auth.substr(0, 7), "bearer ")) return {};
  auth.remove_prefix(7);
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  while (!auth.empty() && (auth.back() == ' ' || auth.back() == '\t')) auth.remove_suffix(1);
  return auth;
}

enum class Route {
  kNone, kHealth, kMetrics, kModels, kChat, kCompletion, kTokenize, kDetokenize, kApplyTemplate, kProps,
  kResponses, kResponseById, kMessages, kCountTokens,
  kOllamaChat, kOllamaGenerate, kOllamaTags, kOllamaShow, kOllamaVersion, kOllamaPs, kWebPage, kCacheView,
};

constexpr std::string_view kResponsesPrefix = "/v1/responses/";

Route FindRoute(std::string_view path) {
  if (path == "/" || path == "/index.html" || path.starts_with("/webui/")) return Route::kWebPage;
  if (path == "/health") return Route::kHealth;
  if (path == "/metrics") return Route::kMetrics;
  if (path == "/trellis/v1/cache") return Route::kCacheView;
  if (path == "/v1/models" || path == "/models") return Route::kModels;
  if (path == "/v1/chat/completions" || path == "/chat/completions") return Route::kChat;
  if (path == "/v1/completions" || path == "/completions") return Route::kCompletion;
  if (path == "/tokenize") return Route::kTokenize;
  if (path == "/detokenize") return Route::kDetokenize;
  if (path == "/apply-template") return Route::kApplyTemplate;
  if (path == "/props") return Route::kProps;
  if (path == "/v1/responses" || path == "/responses") return Route::kResponses;
  if (path.starts_with(kResponsesPrefix) && path.size() > kResponsesPrefix.size()) return Route::kResponseById;
  if (path == "/v1/messages") return Route::kMessages;
  if (path == "/v1/messages/count_tokens") return Route::kCountTokens;
  if (path == "/api/chat") return Route::kOllamaChat;
  if (path == "/api/generate") return Route::kOllamaGenerate;
  if (path == "/api/tags") return Route::kOllamaTags;
  if (path == "/api/show") return Route::kOllamaShow;
  if (path == "/api/version") return Route::kOllamaVersion;
  if (path == "/api/ps") return Route::kOllamaPs;
  return Route::kNone;
}

// The methods a route takes (answered in Allow with a 405).
std::string_view Methods(Route r) {
  switch (r) {
    case Route::kHealth:
    case Route::kMetrics:
    case Route::kModels:
    case Route::kProps:
    case Route::kOllamaTags:
    case Route::kOllamaVersion:
    case Route::kOllamaPs:
    case Route::kWebPage:
    case Route::kCacheView: return "GET, HEAD";
    case Route::kResponseById: return "GET, DELETE";
    default: return "POST";
  }
}

bool MethodAllowed(Route r, std::string_view method) {
  const std::string_view m = Methods(r);
  if (method.empty() || method.find(',') != std::string_view::npos || method.find(' ') != std::string_view::npos) return false;
  for (size_t pos = 0; (pos = m.find(method, pos)) != std::string_view::npos; pos += method.size()) {
    const bool start = pos == 0 || m[pos - 1] == ' ';
    const bool end = pos + method.size() == m.size() || m[pos + method.size()] == ',';
    if (start && end) return true;
  }
  return false;
}

// Errors in the shape of the dialect a path belongs to.
HttpResponse ErrorFor(std::string_view path, const ApiError& e) {
  if (path.starts_with("/v1/messages")) return AnthropicErrorResponse(e);
  if (path.starts_with("/api/")) return OllamaErrorResponse(e);
  return OpenAiErrorResponse(e);
}

// A path for the log: printable ASCII only, at most 200 bytes.
std::string LogSafe(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 200)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x21 && u < 0x7f && c != '"' && c != '\\') ? c : '?';
  }
  if (s.size() > 200) out += "...";
  return out;
}

}  // namespace

void Server::SendError(HttpExchange& ex, const ApiError& e) const { ex.Respond(ErrorResponse(e)); }

std::optional<HttpResponse> Server::Authorize(const HttpRequest& req, uint64_t& salt) const {
  salt = 0;
  if (opts_.api_keys.empty()) return std::nullopt;
  // Bearer, or Anthropic's x-api-key.
  std::string_view given = BearerToken(req.Header("Authorization"));
  if (given.empty()) given = TrimSpace(req.Header("x-api-key"));
  int match = -1;
  for (size_t i = 0; i < opts_.api_keys.size(); ++i) {  // no early exit: every key is compared
    if (ConstantTimeEquals(given, opts_.api_keys[i]) && !given.empty()) match = static_cast<int>(i);
  }
  if (match < 0) {
    HttpResponse r = ErrorFor(req.path, MakeError(401, given.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                                                     : "incorrect API key provided",
                                                  "invalid_request_error", "invalid_api_key"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }
  salt = opts_.share_cache ? 0 : SaltForKey(opts_.api_keys[static_cast<size_t>(match)]);
  return std::nullopt;
}

std::optional<HttpResponse> Server::OnHead(const HttpRequest& req) {
  const Route route = FindRoute(req.path);
  if (route == Route::kNone) {
    return ErrorFor(req.path, MakeError(404, "no route for " + LogSafe(req.method) + " " + LogSafe(req.path),
                                        "invalid_request_error", "not_found"));
  }
  if (!MethodAllowed(route, req.method)) {
    HttpResponse r = ErrorFor(req.path, MakeError(405, "method " + LogSafe(req.method) + " is not allowed on " + LogSafe(req.path),
                                                  "invalid_request_error", "method_not_allowed"));
    r.headers.emplace_back("Allow", std::string(Methods(route)));
    return r;
  }
  if (route == Route::kHealth) {
    HttpResponse r;
    r.body = stopping_ ? R"({"status":"shutting down"})" : R"({"status":"ok"})";
    if (stopping_) r.status = 503;
    if (!stopping_ && opts_.health) {
      // Something the engine needs is down (a grid node): say which, and that it is 503.
      const auto [ok, reason] = opts_.health();
      if (!ok) {
        r.status = 503;
        r.body = nlohmann::json{{"status", "unhealthy"}, {"reason", reason}}.dump();
      }
    }
    if (!stopping_ && opts_.health_fields) {
      nlohmann::json body = nlohmann::json::parse(r.body);
      for (auto& [k, v] : opts_.health_fields()) body[k] = v;
      r.body = body.dump();
    }
    return r;
  }
  if (route == Route::kWebPage) return WebPage(req.path);  // no key: the page asks for one
  if (route == Route::kMetrics) {
    if (!opts_.metrics_key.empty()) {
      const std::string_view given = BearerToken(req.Header("Authorization"));
      if (given.empty() || !ConstantTimeEquals(given, opts_.metrics_key)) {
        HttpResponse r = ErrorResponse(MakeError(401, "/metrics needs 'Authorization: Bearer <metrics key>'",
                                                 "invalid_request_error", "invalid_api_key"));
        r.headers.emplace_back("WWW-Authenticate", "Bearer");
        return r;
      }
    } else {
      uint64_t salt = 0;
      if (auto denied = Authorize(req, salt)) return denied;
    }
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics_.Render(engine_.metrics(), engine_.queue_depth());
    r.body += fmt::format(
        "# HELP trellis_http_connections_open client connections open\n# TYPE trellis_http_connections_open gauge\n"
        "trellis_http_connections_open {}\n"
        "# HELP trellis_http_queued_requests requests waiting for an HTTP worker\n"
        "# TYPE trellis_http_queued_requests gauge\ntrellis_http_queued_requests {}\n",
        http_->open_connections(), http_->queued_requests());
    if (opts_.extra_metrics) r.body += opts_.extra_metrics();
    return r;
  }
  uint64_t salt = 0;
  if (auto denied = Authorize(req, salt)) return denied;
  if (route == Route::kModels) {
    HttpResponse r;
    r.body = ModelsJson(opts_.model_id, created_, engine_.options().n_ctx, model_.config().n_ctx_train);
    return r;
  }
  if (auto r = AnswerHead(static_cast<int>(route), req, salt)) return r;
  if (stopping_) return ErrorFor(req.path, MakeError(503, "the server is shutting down", "server_error"));
  return std::nullopt;  // read the body; Handle runs on a worker
}

HttpResponse Server::WebPage(std::string_view path) const {
  const std::string_view name = path.starts_with("/webui/") ? path.substr(7) : std::string_view("index.html");
  HttpResponse r;
  auto missing = [&] { return ErrorFor(path, MakeError(404, "no such file of the web page", "invalid_request_error", "not_found")); };
  if (!opts_.webui) {
    return ErrorFor(path, MakeError(404, "the web page is off (--no-webui)", "invalid_request_error", "not_found"));
  }
  if (!opts_.webui_path.empty()) {
    auto body = ReadWebAsset(opts_.webui_path, name);
    if (!body.ok()) return missing();
    r.body = std::move(*body);
    r.content_type = WebAssetType(name);
  } else {
    auto a = EmbeddedWebAsset(name);
    if (!a) return missing();
    r.body = std::string(a->body);
    r.content_type = a->content_type;
  }
  // Nothing of the page may come from elsewhere, nor run inline from elsewhere.
  r.headers.emplace_back("Content-Security-Policy",
                         "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                         "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

std::optional<HttpResponse> Server::AnswerHead(int route_code, const HttpRequest& req, uint64_t salt) {
  const Route route = static_cast<Route>(route_code);
  auto json_response = [](const nlohmann::json& j) {
    HttpResponse r;
    r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return r;
  };
  const ModelConfig& c = model_.config();
  nlohmann::json details = {{"parent_model", ""}, {"format", "gguf"}, {"family", c.arch},
                            {"families", nlohmann::json::array({c.arch})}, {"parameter_size", ""},
                            {"quantization_level", ""}};
  switch (route) {
    case Route::kProps: {
      const auto& eo = engine_.options();
      const int bos = tok_.bos_id(), eos = tok_.eos_id();
      return json_response({{"default_generation_settings",
                             {{"n_ctx", eo.n_ctx},
                              {"params", {{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05},
                                          {"repeat_penalty", 1.0}, {"repeat_last_n", 64}}}}},
                            {"total_slots", eo.max_running},
                            {"model_path", opts_.model_path},
                            {"model_alias", opts_.model_id},
                            {"n_ctx_train", c.n_ctx_train},
                            {"chat_template", chat_.source()},
                            {"bos_token", bos >= 0 ? tok_.TokenToPiece(bos, true) : ""},
                            {"eos_token", eos >= 0 ? tok_.TokenToPiece(eos, true) : ""},
                            {"modalities", {{"vision", false}, {"audio", false}}},
                            {"build_info", std::string("trellis ") + kServerVersion}});
    }
    case Route::kOllamaVersion: return json_response({{"version", kServerVersion}});
    case Route::kOllamaTags:
    case Route::kOllamaPs: {
      nlohmann::json m = {{"name", OllamaName(opts_.model_id)}, {"model", OllamaName(opts_.model_id)},
                          {"size", opts_.model_bytes}, {"digest", ""}, {"details", details}};
      if (route == Route::kOllamaTags) {
        m["modified_at"] = OllamaTime(std::chrono::system_clock::from_time_t(created_));
      } else {
        m["expires_at"] = "0001-01-01T00:00:00Z";  // never: it stays loaded while the server runs
        m["size_vram"] = 0;
      }
      return json_response({{"models", nlohmann::json::array({m})}});
    }
    case Route::kResponseById: {
      const std::string id(req.path.substr(kResponsesPrefix.size()));
      if (req.method == "DELETE") {
        if (responses_.Erase(id, salt)) return json_response({{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
      } else if (auto e = responses_.Get(id, salt)) {
        HttpResponse r;
        r.body = std::move(e->body);
        return r;
      }
      ApiError e = MakeError(404, "No response with id '" + LogSafe(id.substr(0, 64)) + "' found", "invalid_request_error",
                             "not_found");
      return OpenAiErrorResponse(e);
    }
    default: return std::nullopt;
  }
}

void Server::Handle(const HttpRequest& req, HttpExchange& ex) {
  uint64_t salt = 0;
  if (auto denied = Authorize(req, salt)) {  // OnHead checked already; cheap to be sure
    ex.Respond(*denied);
    return;
  }
  switch (FindRoute(req.path)) {
    case Route::kChat: return HandleChat(req, salt, ex);
    case Route::kCompletion: return HandleCompletion(req, salt, ex);
    case Route::kTokenize: return HandleTokenize(req, ex);
    case Route::kDetokenize: return HandleDetokenize(req, ex);
    case Route::kApplyTemplate: return HandleApplyTemplate(req, ex);
    case Route::kResponses: return HandleResponses(req, salt, ex);
    case Route::kMessages: return HandleMessages(req, salt, ex);
    case Route::kCountTokens: return HandleCountTokens(req, ex);
    case Route::kOllamaChat:
    case Route::kOllamaGenerate: return HandleOllama(req, salt, ex, FindRoute(req.path) == Route::kOllamaGenerate);
    case Route::kOllamaShow: return HandleOllamaShow(req, ex);
    case Route::kCacheView: return HandleCacheView(req, salt, ex);
    default: return SendError(ex, MakeError(404, "no route", "invalid_request_error", "not_found"));
  }
}

void Server::OnAnswered(const HttpRequest& req, int status, const AccessInfo& info, double seconds) {
  const std::string path(req.path);
  const Route route = FindRoute(path);
  metrics_.CountRequest(route == Route::kResponseById ? "/v1/responses/{id}"
                        : route == Route::kWebPage   ? "/"
                        : route != Route::kNone      ? path
                                                     : "other",
                        status);
  if (!opts_.access_log) return;
  std::string line;
  if (opts_.log_format == LogFormat::kJson) {
    nlohmann::json j = {{"ts", UnixNow()},
                        {"remote", req.remote},
                        {"method", req.method.empty() ? "-" : req.method},
                        {"path", req.path.empty() ? "-" : req.path.substr(0, 200)},
                        {"status", status},
                        {"duration_ms", std::round(seconds * 1e4) / 10},
                        {"request_id", req.request_id}};
    if (info.prompt_tokens >= 0) {
      j["prompt_tokens"] = info.prompt_tokens;
      j["cached_tokens"] = info.cached_tokens;
      j["completion_tokens"] = info.completion_tokens;
    } else {
      j["prompt_tokens"] = nullptr;
      j["cached_tokens"] = nullptr;
      j["completion_tokens"] = nullptr;
    }
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    line = fmt::format("access: {} {} {} {} {:.1f}ms id={}", req.remote.empty() ? "-" : req.remote,
                       req.method.empty() ? "-" : LogSafe(req.method), req.path.empty() ? "-" : LogSafe(req.path),
                       status, seconds * 1e3, req.request_id);
    if (info.prompt_tokens >= 0) {
      line += fmt::format(" prompt={} cached={} completion={}", info.prompt_tokens, info.cached_tokens,
                          info.completion_tokens);
    }
  }
  std::lock_guard<std::mutex> lock(log_mu_);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Server::HandleTokenize(const HttpRequest& req, HttpExchange& ex) {
  auto r = ParseTokenizeRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  const std::vector<int32_t> ids = tok_.Encode(r->content, r->add_special && tok_.add_bos(), r->parse_special);
  std::vector<std::string> pieces;
  if (r->with_pieces) {
    for (int32_t id : ids) pieces.push_back(tok_.TokenToPiece(id, true));
  }
  HttpResponse res;
  res.body = TokenizeJson(ids, r->with_pieces ? &pieces : nullptr);
  ex.Respond(res);
}

void Server::HandleDetokenize(const HttpRequest& req, HttpExchange& ex) {
  auto r = ParseDetokenizeRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  HttpResponse res;
  res.body = DetokenizeJson(tok_.Decode(r->tokens));
  ex.Respond(res);
}

void Server::HandleChat(const HttpRequest& req, uint64_t salt, HttpExchange& ex) {
  auto r = ParseChatCompletionRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  OpenAiWriter w(Endpoint::kChat, "chatcmpl-" + NewId(), UnixNow(), opts_.model_id, r->gen, "");
  ServeChat(*r, salt, "messages", ex, w);
}

Parsed<std::vector<int32_t>> Server::RenderChat(const ChatCompletionRequest& r, const char* prompt_param,
                                                std::string* prompt_text) const {
  // Template text is tokenized with special tokens recognized; message contents never are,
  // so a user typing "</s>" or "<|im_start|>" cannot forge a turn or an end of text.
  ChatVars vars(r.template_kwargs);
  vars.tools = r.tools_value;
  const bool set = std::any_of(vars.kwargs.begin(), vars.kwargs.end(), [](const auto& kv) { return kv.first == "enable_thinking"; });
  if (r.thinking_off && chat_.thinks() && !set) vars.kwargs.emplace_back("enable_thinking", jinja::Value::Bool(false));
  auto ids = EncodeChat(chat_, tok_, r.messages, /*add_generation_prompt=*/true, vars, prompt_text);
  if (!ids.ok()) {
    ApiError e = MakeError(400, ids.status().message());
    e.param = ids.status().message().starts_with("chat_template_kwargs") ? "chat_template_kwargs" : prompt_param;
    return e;
  }
  return std::move(*ids);
}

void Server::ServeChat(ChatCompletionRequest& req, uint64_t salt, const char* prompt_param, HttpExchange& ex,
                       AnswerWriter& w) {
  ChatCompletionRequest* r = &req;
  auto fail = [&](const ApiError& e) { ex.Respond(w.Error(e)); };
  std::string prompt_text;
  auto ids = RenderChat(req, prompt_param, &prompt_text);
  if (!ids.ok()) return fail(ids.error());
  std::vector<int32_t> prompt = std::move(*ids);
  const bool opens = ReasoningSplitter::PromptOpensReasoning(prompt_text);
  const bool calls = r->tool_choice != ToolChoice::kNone && !r->tools.empty();
  GenerationParams gen = r->gen;
  // A grammar that writes the reasoning block itself is used as it is.
  // A prompt that ends with a closed block (thinking switched off: Qwen3's and SmolLM3's
  // empty <think></think>) has the model answer at once.
  const bool closed = TrimSpace(prompt_text).ends_with("</think>");
  const bool reasons = chat_.thinks() && !closed && !(gen.grammar && grammar::IsPrefix(*gen.grammar, "<think>"));
  if (calls || (gen.grammar && reasons)) {
    // The grammar the answer is held to: the calls in the model's syntax, after any
    // reasoning (answer_grammar.h).
    AnswerSpec spec;
    spec.format = tool_format_;
    spec.choice = r->tool_choice;
    // Llama 3.1's template takes one call per turn back ("This model only supports single
    // tool-calls at once!"): its answers hold one.
    spec.parallel = r->parallel_tool_calls && tool_format_ != ToolCallFormat::kLlama3;
    spec.content = gen.grammar;
    spec.reasoning = !reasons ? ReasoningPrefix::kNone : opens ? ReasoningPrefix::kOpen : ReasoningPrefix::kOptional;
    for (const ToolDefinition& t : r->tools) {
      if (r->tool_choice == ToolChoice::kNamed && t.name != r->tool_choice_name) continue;
      spec.tools.push_back({t.name, t.arguments});
    }
    grammar::GrammarLimits limits;
    limits.max_source_bytes = kMaxGrammarBytes;
    auto g = BuildAnswerGrammar(spec, limits);
    if (!g.ok()) {
      ApiError e = MakeError(400, "the tools and output constraint make too large a grammar: " + g.status().message());
      e.param = calls ? "tools" : gen.grammar_param;
      return fail(e);
    }
    gen.grammar = *g;
    if (gen.grammar_param.empty()) gen.grammar_param = "tools";
  }
  const std::string& format = r->reasoning_format.empty() ? opts_.reasoning_format : r->reasoning_format;
  const bool split = (format == "deepseek" || !r->include_reasoning) && chat_.thinks();
  Generate(std::move(prompt), gen, salt, prompt_param, ex, w,
           ReasoningSplitter(split, split && opens, /*keep_reasoning=*/r->include_reasoning),
           calls ? ToolCallStream(tool_format_) : ToolCallStream());
}

void Server::HandleCompletion(const HttpRequest& req, uint64_t salt, HttpExchange& ex) {
  auto r = ParseCompletionRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  // A raw prompt is the client's whole input (no turns to forge): special tokens parse.
  std::vector<int32_t> prompt =
      r->prompt_text ? tok_.Encode(*r->prompt_text, tok_.add_bos() && r->add_special, /*parse_special=*/true)
                     : r->prompt_tokens;
  std::string echo;
  if (r->echo) echo = r->prompt_text ? *r->prompt_text : tok_.Decode(r->prompt_tokens);
  OpenAiWriter w(Endpoint::kCompletion, "cmpl-" + NewId(), UnixNow(), opts_.model_id, r->gen, std::move(echo));
  Generate(std::move(prompt), r->gen, salt, "prompt", ex, w);
}

void Server::Generate(std::vector<int32_t> prompt, const GenerationParams& gen, uint64_t salt, const char* prompt_param,
                      HttpExchange& ex, AnswerWriter& w, ReasoningSplitter reasoning, ToolCallStream tools) {
  auto fail = [&](const ApiError& e) { ex.Respond(w.Error(e)); };
  if (stopping_) return fail(MakeError(503, "the server is shutting down", "server_error"));
  Generation::Params p;
  p.gen = gen;
  if (gen.context_cap > 0) {
    const int room = gen.context_cap - static_cast<int>(prompt.size());
    if (room <= 0) {
      ApiError e = MakeError(400, "the prompt has " + std::to_string(prompt.size()) + " tokens; the request's context is " +
                                      std::to_string(gen.context_cap), "invalid_request_error", "context_length_exceeded");
      e.param = prompt_param;
      return fail(e);
    }
    p.gen.max_tokens = std::min(gen.max_tokens.value_or(room), room);
  }
  w.OnPrompt(static_cast<int>(prompt.size()));
  p.prompt = std::move(prompt);
  p.prompt_param = prompt_param;
  if (gen.grammar) p.grammar = grammars().Get(*gen.grammar);
  if (gen.ignore_eos) {
    // As llama.cpp: the end tokens are banned, and generation runs to max_tokens.
    size_t banned = 0;
    for (const auto& [id, b] : p.gen.logit_bias) banned += b <= -100.0f && !tok_.IsEog(id);
    for (int32_t id : grammars().vocab().eog()) p.gen.logit_bias.emplace_back(id, -100.0f);
    if (banned + grammars().vocab().eog().size() >= static_cast<size_t>(model_.config().n_vocab)) {
      ApiError e = MakeError(400, "'logit_bias' with 'ignore_eos' bans every token of the vocabulary");
      e.param = "logit_bias";
      return fail(e);
    }
  }
  // A request's own cache_salt narrows the API key's: blocks are shared only where both match.
  p.cache_salt = gen.cache_salt.empty() ? salt : Mix64(salt ^ SaltForKey("request:" + gen.cache_salt)) | 1;
  p.rendered = marker_tokens_;
  p.seed = Mix64(next_seed_.fetch_add(1));
  auto g = std::make_shared<Generation>(engine_, tok_, metrics_, std::move(p));
  if (auto err = g->Start()) return fail(*err);
  Track(g->id(), true);
  if (stopping_) g->Cancel();  // Stop() ran between the check above and Track
  struct Untrack {
    Server* s;
    RequestId id;
    ~Untrack() { s->Track(id, false); }
  } untrack{this, g->id()};

  auto account = [&] {
    if (!g->failed()) {
      const Usage u = g->usage();
      ex.access().prompt_tokens = u.prompt_tokens;
      ex.access().cached_tokens = u.cached_tokens;
      ex.access().completion_tokens = u.completion_tokens;
    }
  };
  auto failure = [&] { return MakeError(stopping_ ? 503 : g->error_status(), g->error_message(), "server_error"); };
  auto call_id = [&] { return CallId(tool_format_, w.CallIdPrefix()); };

  if (!gen.stream) {
    WholeAnswer out;
    // The body is written only at the end (with its Content-Length and the final status),
    // so a closed connection cannot show up as a failed write as it does for streams:
    // look at the socket every kPeerCheckInterval instead, and cancel when it is gone.
    bool client_gone = false;
    for (;;) {
      GenerationDelta d = g->Next(kPeerCheckInterval);
      ReasoningSplitter::Parts parts = reasoning.Feed(d.text);
      if (d.done) {
        ReasoningSplitter::Parts rest = reasoning.Flush();
        parts.reasoning += rest.reasoning;
        parts.content += rest.content;
      }
      out.text += tools.Feed(parts.content);
      out.reasoning += parts.reasoning;
      for (auto& lp : d.logprobs) out.logprobs.push_back(std::move(lp));
      if (d.done) {
        ToolCallStream::End end = tools.Finish();
        out.text += end.content;
        for (ParsedToolCall& c : end.calls) out.tool_calls.push_back({call_id(), std::move(c.name), std::move(c.arguments)});
        break;
      }
      if (!client_gone && ex.ClientGone()) {
        client_gone = true;
        metrics_.CountDisconnect();
        g->Cancel();  // Next() reports done once the engine has dropped the request
      }
    }
    if (client_gone) {
      // Nobody reads this; 499 (nginx's "client closed request") labels it in the metrics.
      ex.Respond(w.Error(MakeError(499, "the client closed the connection", "invalid_request_error", "client_closed_request")));
      return;
    }
    if (g->failed()) {
      ex.Respond(w.Error(failure()));
      return;
    }
    out.end.finish_reason = g->finish_reason();
    out.end.stop_string = g->stop_string();
    if (!out.tool_calls.empty()) {
      out.end.finish_reason = "tool_calls";
      out.text = std::string(TrimSpace(out.text));
    }
    out.end.usage = g->usage();
    account();
    ex.Respond(w.Whole(out));
    return;
  }

  // Streaming: the writer's events as text arrives; its keep-alive when nothing was
  // written for a second (a closed connection shows up at the write).
  auto send = [&](const std::string& bytes) { return bytes.empty() || ex.WriteChunk(bytes); };
  bool ok = ex.BeginStream(200, w.ContentType(), {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  if (ok) ok = send(w.Open());
  auto last_write = std::chrono::steady_clock::now();
  bool any_calls = false;
  while (ok) {
    GenerationDelta d = g->Next(250ms);
    ReasoningSplitter::Parts parts = reasoning.Feed(d.text);
    if (d.done) {
      ReasoningSplitter::Parts rest = reasoning.Flush();
      parts.reasoning += rest.reasoning;
      parts.content += rest.content;
    }
    AnswerDelta delta;
    delta.content = tools.Feed(parts.content);
    if (d.done) {
      ToolCallStream::End end = tools.Finish();
      delta.content += end.content;
      for (ParsedToolCall& call : end.calls) delta.calls.push_back({call_id(), std::move(call.name), std::move(call.arguments)});
      any_calls = any_calls || !end.calls.empty();
    }
    // Calls stream as OpenAI's do: the name once known, then pieces of the arguments.
    for (ToolCallStream::CallPiece& p : tools.TakeCallPieces()) {
      ToolCallOut out;
      out.index = p.index;
      out.first = p.first;
      if (p.first) {
        out.id = call_id();
        out.name = std::move(p.name);
      }
      out.arguments = std::move(p.arguments);
      delta.calls.push_back(std::move(out));
    }
    any_calls = any_calls || tools.streamed_calls_complete();
    delta.reasoning = std::move(parts.reasoning);
    delta.logprobs = std::move(d.logprobs);
    if (!delta.empty()) {
      ok = send(w.Delta(delta));
      last_write = std::chrono::steady_clock::now();
    }
    if (ok && d.done) {
      if (g->failed()) {
        ok = send(w.Failed(failure()));
      } else {
        AnswerEnd end;
        end.finish_reason = any_calls ? "tool_calls" : g->finish_reason();  // a call cut short: "length"
        end.stop_string = g->stop_string();
        end.usage = g->usage();
        ok = send(w.Close(end));
      }
      if (ok) ex.EndStream();
      account();
      return;
    }
    if (ok && std::chrono::steady_clock::now() - last_write > 1s) {
      ok = send(w.KeepAlive());
      last_write = std::chrono::steady_clock::now();
    }
  }
  metrics_.CountDisconnect();
  g->Cancel();
  while (!g->Next(250ms).done) {
  }
}

}  // namespace trellis::server

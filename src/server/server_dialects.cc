// The Server's routes for the other dialects (OpenAI Responses, Anthropic Messages,
// Ollama) and llama-server's utility endpoints (/apply-template, /props). Each parses
// its dialect into a chat or completion request (dialects.h) and runs it through the same
// ServeChat / Generate as the OpenAI routes, with its own AnswerWriter.
#include <chrono>
#include <random>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "server/dialects.h"
#include "server/server.h"

namespace trellis::server {

namespace {

using json = nlohmann::json;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

void Server::HandleApplyTemplate(const HttpRequest& req, HttpExchange& ex) {
  auto r = ParseChatCompletionRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  std::string text;
  auto ids = RenderChat(*r, "messages", &text);
  if (!ids.ok()) return SendError(ex, ids.error());
  HttpResponse res;
  res.body = Dumped(json{{"prompt", text}});
  ex.Respond(res);
}

void Server::HandleResponses(const HttpRequest& req, uint64_t salt, HttpExchange& ex) {
  auto r = ParseResponsesRequest(req.body, limits_);
  if (!r.ok()) return SendError(ex, r.error());
  std::string history;
  if (!r->previous_response_id.empty()) {
    auto prev = responses_.Get(r->previous_response_id, salt);
    if (!prev) {
      ApiError e;
      e.status = 404;
      e.message = "Previous response with id '" + r->previous_response_id.substr(0, 64) + "' not found (responses are kept " +
                  std::to_string(opts_.responses_ttl_s) + " s, in this server's memory)";
      e.param = "previous_response_id";
      e.code = "previous_response_not_found";
      return SendError(ex, e);
    }
    history = std::move(prev->conversation);
  }
  std::string conversation;
  auto chat = ResponsesChat(*r, history, limits_, &conversation);
  if (!chat.ok()) return SendError(ex, chat.error());
  // Not NewId (a scrambled counter, so one id would give away the others): whoever knows a
  // stored response's id can read and continue it (under the same API key).
  std::random_device rd;
  const std::string id = fmt::format("resp_{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
  auto on_done = [this, id, salt, store = r->store, conversation](const std::string& body, const std::string& answer) {
    if (!store) return;
    // The conversation so far: its messages and this answer, for a previous_response_id.
    std::string conv = conversation;
    conv.pop_back();  // ']'
    conv += (conv.size() > 1 ? "," : "") + answer + "]";
    responses_.Put(id, {salt, std::move(conv), body});
  };
  ResponsesWriter w(id, Now(), opts_.model_id, *r, on_done);
  ServeChat(*chat, salt, "input", ex, w);
}

void Server::HandleMessages(const HttpRequest& req, uint64_t salt, HttpExchange& ex) {
  auto r = ParseAnthropicRequest(req.body, limits_);
  if (!r.ok()) return (void)ex.Respond(AnthropicErrorResponse(r.error()));
  AnthropicWriter w("msg_" + NewId(), opts_.model_id);
  ServeChat(r->chat, salt, "messages", ex, w);
}

void Server::HandleCountTokens(const HttpRequest& req, HttpExchange& ex) {
  auto r = ParseAnthropicCountRequest(req.body, limits_);
  if (!r.ok()) return (void)ex.Respond(AnthropicErrorResponse(r.error()));
  auto ids = RenderChat(r->chat, "messages", nullptr);
  if (!ids.ok()) return (void)ex.Respond(AnthropicErrorResponse(ids.error()));
  HttpResponse res;
  res.body = AnthropicCountJson(static_cast<int>(ids->size()));
  ex.Respond(res);
}

void Server::HandleOllama(const HttpRequest& req, uint64_t salt, HttpExchange& ex, bool generate) {
  auto r = generate ? ParseOllamaGenerate(req.body, limits_) : ParseOllamaChat(req.body, limits_);
  if (!r.ok()) return (void)ex.Respond(OllamaErrorResponse(r.error()));
  OllamaWriter w(r->model, generate);
  if (r->load_only) {
    // Ollama loads the model and answers at once (done_reason "load"): it is loaded.
    json j = {{"model", r->model}, {"created_at", OllamaTime(std::chrono::system_clock::now())}, {"done", true},
              {"done_reason", "load"}};
    if (generate) {
      j["response"] = "";
    } else {
      j["message"] = {{"role", "assistant"}, {"content", ""}};
    }
    HttpResponse res;
    res.body = Dumped(j);
    return (void)ex.Respond(res);
  }
  if (r->raw) {
    CompletionRequest& c = *r->raw;
    c.gen.context_cap = r->num_ctx;
    std::vector<int32_t> prompt = tok_.Encode(*c.prompt_text, tok_.add_bos() && c.add_special, /*parse_special=*/true);
    return Generate(std::move(prompt), c.gen, salt, "prompt", ex, w);
  }
  r->chat.gen.context_cap = r->num_ctx;
  ServeChat(r->chat, salt, generate ? "prompt" : "messages", ex, w);
}

void Server::HandleOllamaShow(const HttpRequest& req, HttpExchange& ex) {
  auto r = ParseOllamaShow(req.body, limits_);
  if (!r.ok()) return (void)ex.Respond(OllamaErrorResponse(r.error()));
  const ModelConfig& c = model_.config();
  json info = {{"general.architecture", c.arch},
               {c.arch + ".context_length", c.n_ctx_train},
               {c.arch + ".embedding_length", c.n_embd},
               {c.arch + ".block_count", c.n_layer},
               {c.arch + ".attention.head_count", c.n_head},
               {c.arch + ".attention.head_count_kv", c.n_head_kv},
               {"trellis.context_length", engine_.options().n_ctx}};
  json caps = json::array({"completion", "tools"});  // tools: the template's, or the generic prompt
  if (chat_.thinks()) caps.push_back("thinking");
  json details = {{"parent_model", ""}, {"format", "gguf"}, {"family", c.arch}, {"families", json::array({c.arch})},
                  {"parameter_size", ""}, {"quantization_level", ""}};
  json j = {{"license", ""},
            {"modelfile", "# served by trellis\nFROM " + opts_.model_path + "\n"},
            {"parameters", ""},
            {"template", chat_.source()},
            {"details", std::move(details)},
            {"model_info", std::move(info)},
            {"capabilities", std::move(caps)},
            {"modified_at", OllamaTime(std::chrono::system_clock::from_time_t(created_))}};
  HttpResponse res;
  res.body = Dumped(j);
  ex.Respond(res);
}

// ---- the cache view -------------------------------------------------------------------

namespace {
constexpr size_t kViewMaxNodes = 2000;
constexpr size_t kViewEdgeTokens = 256;  // of an edge's text shown to its owner
constexpr auto kViewTimeout = std::chrono::seconds(5);

}  // namespace

void Server::HandleCacheView(const HttpRequest& req, uint64_t salt, HttpExchange& ex) {
  struct Snap {
    SchedulerMetrics m;
    std::vector<CacheNodeView> nodes;
    bool truncated = false;
  };
  auto snap = std::make_shared<Snap>();
  const bool ran = engine_.Inspect(
      [snap](Scheduler& s) {
        snap->m = s.metrics();
        snap->nodes = s.cache().Snapshot(kViewMaxNodes, kViewEdgeTokens, &snap->truncated);
      },
      kViewTimeout);
  if (!ran) {
    ApiError e;
    e.status = 503;
    e.message = "the engine did not answer within 5 s";
    e.type = "server_error";
    return SendError(ex, e);
  }
  // The viewer's own namespace: the one its key's requests use (without keys, everyone's).
  const uint64_t mine = RadixCache::NamespaceKey(model_.KvFingerprint(engine_.options().n_ctx), salt);
  const SchedulerMetrics& m = snap->m;
  const int bt = std::max(1, m.block_tokens);
  json nodes = json::array();
  for (const CacheNodeView& v : snap->nodes) {
    // A hash of the edge keyed by a per-process secret and the namespace: it follows a node
    // across snapshots, and says nothing about whether another tenant cached the same text.
    uint64_t h = Mix64(view_secret_ ^ v.ns);
    for (int32_t t : v.tokens) h = Mix64(h ^ static_cast<uint32_t>(t));
    h = Mix64(h ^ static_cast<uint64_t>(v.n_blocks));
    json n = {{"id", v.id},
              {"parent", v.parent < 0 ? json(nullptr) : json(v.parent)},
              {"mine", v.ns == mine},
              {"blocks", v.n_blocks},
              {"tokens", v.n_blocks * bt},
              {"depth_tokens", v.depth_blocks * bt},
              {"sessions", v.lock_ref},
              {"hits", v.hits},
              {"age", v.age},
              {"hash", fmt::format("{:016x}", h)}};
    if (v.ns == mine) {
      n["text"] = tok_.Decode(v.tokens);
      n["text_truncated"] = v.tokens.size() < static_cast<size_t>(v.n_blocks) * static_cast<size_t>(bt);
    }
    nodes.push_back(std::move(n));
  }
  json j = {{"version", 1},
            {"time", Now()},
            {"pool", {{"blocks", m.pool_total},
                      {"used", m.pool_used},
                      {"cached", m.tree.n_cached_blocks},
                      {"block_tokens", m.block_tokens},
                      {"kv_bytes_per_token", m.kv_bytes_per_token}}},
            {"tree", {{"nodes", m.tree.n_nodes},
                      {"leaves", m.tree.n_leaves},
                      {"namespaces", m.tree.n_namespaces},
                      {"evicted_blocks", m.tree.evicted_blocks},
                      {"evicted_nodes", m.tree.evicted_nodes},
                      {"splits", m.tree.splits}}},
            {"requests", {{"running", m.running},
                          {"waiting", m.waiting},
                          {"prompt_tokens", m.prompt_tokens},
                          {"cached_tokens", m.cached_tokens},
                          {"store_tokens", m.store_tokens}}},
            {"nodes", std::move(nodes)},
            {"truncated", snap->truncated}};
  if (opts_.cache_view_sections) {
    for (auto& [key, text] : opts_.cache_view_sections()) {
      json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!v.is_discarded()) j[key] = std::move(v);
    }
  }
  HttpResponse res;
  res.body = Dumped(j);
  ex.Respond(res);
}

}  // namespace trellis::server

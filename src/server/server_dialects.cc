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

}  // namespace trellis::server

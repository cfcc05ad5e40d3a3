// The other dialects a client may speak: OpenAI's Responses API, Anthropic's Messages
// API and Ollama's API. Each is one translation onto the chat request the OpenAI path
// runs (ChatCompletionRequest), built as an OpenAI body and read by
// ParseChatCompletionRequest, so every field check, limit, tool schema and output
// constraint is the same code; an error it reports is renamed into the dialect's own
// field names. What a dialect asks for that has no counterpart is refused with 400, as on
// the OpenAI path. Answers go out through each dialect's AnswerWriter.
//
// Thread safety: free functions over values; writers as AnswerWriter; ResponseStore is
// internally locked.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/answer_writer.h"
#include "server/api.h"

namespace trellis::server {

// ---- OpenAI Responses (/v1/responses) ------------------------------------------------

struct ResponsesRequest {
  // The request's own input as OpenAI chat messages (a JSON array), without instructions;
  // stored with the answer for a later previous_response_id.
  std::string input_messages;
  std::string instructions;           // "" -> none
  std::string previous_response_id;   // "" -> none
  bool store = true;
  std::string chat_rest;  // the OpenAI chat body's other members (a JSON object): tools, ...
  // Echoed in the response object, as the client sent them (JSON text; "null" if absent).
  std::string tools_json = "[]", tool_choice_json = "\"auto\"", text_json = "{\"format\":{\"type\":\"text\"}}",
              reasoning_json = "null", metadata_json = "{}";
  std::optional<int> max_output_tokens;
  float temperature = 0.8f, top_p = 0.95f;  // as the chat request uses them
  bool parallel_tool_calls = true;
  bool encrypted_reasoning = false;  // include: ["reasoning.encrypted_content"]
};
// Reads and checks the body (its own fields; the chat fields are checked by ResponsesChat).
Parsed<ResponsesRequest> ParseResponsesRequest(std::string_view body, const ApiLimits& limits);
// The chat request: instructions, then `history` (the previous response's conversation, a
// JSON array of chat messages, or "" for none), then the input. *conversation: history and
// input, for storing with the answer.
Parsed<ChatCompletionRequest> ResponsesChat(const ResponsesRequest& r, std::string_view history, const ApiLimits& limits,
                                            std::string* conversation);

// Responses kept for previous_response_id and GET /v1/responses/{id}: at most max_entries
// and max_bytes (oldest dropped first), each for ttl. A response belongs to the cache salt
// (API key) that made it: another key's lookup finds nothing.
class ResponseStore {
 public:
  struct Entry {
    uint64_t salt = 0;
    std::string conversation;  // chat messages, the answer included (JSON array)
    std::string body;          // the response object (JSON)
  };
  ResponseStore(size_t max_entries, size_t max_bytes, std::chrono::seconds ttl)
      : max_entries_(max_entries), max_bytes_(max_bytes), ttl_(ttl) {}
  void Put(const std::string& id, Entry e);
  std::optional<Entry> Get(const std::string& id, uint64_t salt);
  bool Erase(const std::string& id, uint64_t salt);

 private:
  struct Slot {
    Entry e;
    std::chrono::steady_clock::time_point expires;
    std::list<std::string>::iterator order;
  };
  void Drop(std::unordered_map<std::string, Slot>::iterator it);
  const size_t max_entries_, max_bytes_;
  const std::chrono::seconds ttl_;
  std::mutex mu_;
  std::unordered_map<std::string, Slot> map_;  // GUARDED_BY(mu_)
  std::list<std::string> order_;               // GUARDED_BY(mu_): oldest first
  size_t bytes_ = 0;                           // GUARDED_BY(mu_)
};

class ResponsesWriter : public AnswerWriter {
 public:
  // on_done(body, answer message): called once with the finished response object and the
  // answer as a chat message (JSON), when the answer completes (not on failure).
  ResponsesWriter(std::string id, int64_t created, std::string model, const ResponsesRequest& req,
                  std::function<void(const std::string&, const std::string&)> on_done);
  http::HttpResponse Error(const ApiError& e) const override { return OpenAiErrorResponse(e); }
  http::HttpResponse Whole(const WholeAnswer& a) override;
  std::string Open() override;
  std::string Delta(AnswerDelta& d) override;
  std::string Close(const AnswerEnd& e) override;
  std::string Failed(const ApiError& e) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// ---- Anthropic Messages (/v1/messages) -----------------------------------------------

struct AnthropicRequest {
  ChatCompletionRequest chat;
};
Parsed<AnthropicRequest> ParseAnthropicRequest(std::string_view body, const ApiLimits& limits);
// /v1/messages/count_tokens: the same body without max_tokens and the sampling fields.
Parsed<AnthropicRequest> ParseAnthropicCountRequest(std::string_view body, const ApiLimits& limits);
// {"type": "error", "error": {"type": ..., "message": ...}} with the status.
http::HttpResponse AnthropicErrorResponse(const ApiError& e);
std::string AnthropicCountJson(int input_tokens);

class AnthropicWriter : public AnswerWriter {
 public:
  AnthropicWriter(std::string id, std::string model);
  std::string CallIdPrefix() const override { return "toolu_"; }
  http::HttpResponse Error(const ApiError& e) const override { return AnthropicErrorResponse(e); }
  http::HttpResponse Whole(const WholeAnswer& a) override;
  std::string Open() override;
  std::string Delta(AnswerDelta& d) override;
  std::string Close(const AnswerEnd& e) override;
  std::string Failed(const ApiError& e) override;
  std::string KeepAlive() const override { return "event: ping\ndata: {\"type\": \"ping\"}\n\n"; }
  // message_start carries the prompt's length (the cache's share is known at the end).
  void OnPrompt(int tokens) override { input_ = tokens; }

 private:
  std::string Event(const char* type, const std::string& data);
  void CloseBlock(std::string& out);
  std::string id_, model_;
  int input_ = 0, cached_ = 0;
  int block_ = -1;          // index of the open content block (-1: none)
  std::string block_type_;  // "text", "thinking", "tool_use"
  size_t call_ = SIZE_MAX;  // the tool call the open tool_use block holds
  int blocks_ = 0;
};

// ---- Ollama (/api/chat, /api/generate, /api/tags, /api/show, /api/version) -----------

struct OllamaRequest {
  ChatCompletionRequest chat;        // /api/chat, and /api/generate without raw
  std::optional<CompletionRequest> raw;  // /api/generate with raw: true
  bool generate = false;             // /api/generate (its answer is "response", not "message")
  bool load_only = false;            // /api/generate with an empty prompt: loads, answers nothing
  std::string model;                 // as the client named it (echoed)
  int num_ctx = 0;                   // options.num_ctx (0: the server's)
};
// model_id + ":latest" and model_id both name the served model.
Parsed<OllamaRequest> ParseOllamaChat(std::string_view body, const ApiLimits& limits);
Parsed<OllamaRequest> ParseOllamaGenerate(std::string_view body, const ApiLimits& limits);
// /api/show {model}: the model named.
Parsed<std::string> ParseOllamaShow(std::string_view body, const ApiLimits& limits);
// {"error": "message"} with the status.
http::HttpResponse OllamaErrorResponse(const ApiError& e);
// The name /api/tags reports: model_id with ":latest" unless it has a tag.
std::string OllamaName(const std::string& model_id);
// RFC 3339 UTC with nanoseconds, as Ollama writes created_at.
std::string OllamaTime(std::chrono::system_clock::time_point t);

class OllamaWriter : public AnswerWriter {
 public:
  OllamaWriter(std::string model, bool generate);
  http::HttpResponse Error(const ApiError& e) const override { return OllamaErrorResponse(e); }
  http::HttpResponse Whole(const WholeAnswer& a) override;
  std::string ContentType() const override { return "application/x-ndjson"; }
  std::string Open() override { return {}; }
  std::string Delta(AnswerDelta& d) override;
  std::string Close(const AnswerEnd& e) override;
  std::string Failed(const ApiError& e) override;
  std::string KeepAlive() const override { return {}; }

 private:
  std::string Line(const std::string& content, const std::string& thinking, const std::string* calls, bool done,
                   const AnswerEnd* end);
  std::string model_;
  bool generate_;
  std::chrono::steady_clock::time_point start_, first_;
  bool any_ = false;
  struct Call {
    std::string name, arguments;
  };
  std::vector<Call> calls_;  // streamed calls, sent whole at the end (Ollama sends calls whole)
};

}  // namespace trellis::server

// AnswerWriter: how one API dialect writes an answer. The server's answer loop
// (Server::Generate) is the same for every dialect: it pulls text from the Generation,
// splits off reasoning and tool calls, and hands the pieces to the request's writer, which
// turns them into that dialect's JSON body, SSE events or NDJSON lines, and its errors.
//
//   OpenAI chat and legacy completions  OpenAiWriter (this file)
//   OpenAI Responses                    ResponsesWriter (dialects.h)
//   Anthropic Messages                  AnthropicWriter (dialects.h)
//   Ollama /api/chat and /api/generate  OllamaWriter (dialects.h)
//
// A writer is made per request and used by the one worker thread that serves it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "http/server.h"
#include "server/api.h"

namespace trellis::server {

// Text the answer loop produced since the last call. calls: streamed tool-call pieces
// (ToolCallOut with index/first; a first piece carries id and name).
struct AnswerDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallOut> calls;
  std::vector<TokenLogprob> logprobs;
  bool empty() const { return content.empty() && reasoning.empty() && calls.empty() && logprobs.empty(); }
};

// How the answer ended.
struct AnswerEnd {
  std::string finish_reason;  // "stop", "length" or "tool_calls"
  std::string stop_string;    // the stop string that ended it ("" if none did)
  Usage usage;
};

// A whole (non-streamed) answer.
struct WholeAnswer {
  std::string text;       // content; trimmed when there are tool calls
  std::string reasoning;
  std::vector<ToolCallOut> tool_calls;
  std::vector<TokenLogprob> logprobs;
  AnswerEnd end;
};

class AnswerWriter {
 public:
  virtual ~AnswerWriter() = default;

  // The prefix of the ids given to tool calls ("call_", Anthropic's "toolu_"); Mistral's
  // templates take only 9 letters and digits, which the server then uses whatever this says.
  virtual std::string CallIdPrefix() const { return "call_"; }
  // The prompt's length in tokens, once it is known (before Open).
  virtual void OnPrompt(int tokens) {}
  // An error answered before or instead of the answer (status and body).
  virtual http::HttpResponse Error(const ApiError& e) const = 0;
  // The non-streamed answer.
  virtual http::HttpResponse Whole(const WholeAnswer& a) = 0;

  // Streaming. Each returns the bytes to write (possibly empty).
  virtual std::string ContentType() const { return "text/event-stream"; }
  virtual std::string Open() = 0;
  virtual std::string Delta(AnswerDelta& d) = 0;
  virtual std::string Close(const AnswerEnd& e) = 0;
  // The stream's end after a failure (the status line has gone out: the error goes in-band).
  virtual std::string Failed(const ApiError& e) = 0;
  // Written when nothing else was for a second; clients ignore it ("" for none).
  virtual std::string KeepAlive() const { return ": ping\n\n"; }
};

// The OpenAI error body ({"error": {...}}) with its status; 503 carries Retry-After.
http::HttpResponse OpenAiErrorResponse(const ApiError& e);

// Chat completions (Endpoint::kChat) and legacy completions (kCompletion).
class OpenAiWriter : public AnswerWriter {
 public:
  // echo: the prompt text to repeat before the answer (legacy completions' echo).
  OpenAiWriter(Endpoint ep, std::string id, int64_t created, std::string model, const GenerationParams& gen,
               std::string echo);
  http::HttpResponse Error(const ApiError& e) const override { return OpenAiErrorResponse(e); }
  http::HttpResponse Whole(const WholeAnswer& a) override;
  std::string Open() override;
  std::string Delta(AnswerDelta& d) override;
  std::string Close(const AnswerEnd& e) override;
  std::string Failed(const ApiError& e) override;

 private:
  static std::string Event(const std::string& payload) { return "data: " + payload + "\n\n"; }
  StreamChunk Chunk() const;

  Endpoint ep_;
  std::string id_, model_, echo_;
  int64_t created_;
  bool logprobs_, include_usage_;
  size_t text_offset_;  // legacy logprobs: offsets run on across chunks
};

}  // namespace trellis::server

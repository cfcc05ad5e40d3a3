// OpenAI-compatible API types: JSON request bodies -> typed requests, typed responses ->
// JSON text. This is the only place the server touches JSON; everything past it works on
// the structs below.
//
// Parsing validates types and ranges and never throws: a body gives either a request or
// an ApiError carrying the HTTP status (400 for bad input, 404 for an unknown model) and
// the OpenAI error body {"error": {"message", "type", "param", "code"}}.
//
// Hostile input: every Parse* first runs CheckJsonShape over the raw text, so a body
// nested too deep, holding too many values or ill-formed UTF-8 is refused before any DOM
// is built. Error messages never echo a client value whole: numbers are printed, strings
// cut to kMaxEchoBytes, other values named by type.
//
// Thread safety: free functions over values; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "grammar/grammar.h"
#include "server/answer_grammar.h"
#include "server/chat_template.h"

namespace trellis::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};
std::string ErrorJson(const ApiError& e);

// Either a parsed value or the error to answer with.
template <typename T>
class Parsed {
 public:
  Parsed(T v) : v_(std::move(v)) {}        // NOLINT: implicit by design
  Parsed(ApiError e) : v_(std::move(e)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  T& operator*() { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const ApiError& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, ApiError> v_;
};

// The shape a request body may have, checked on the text before parsing.
inline constexpr int kMaxJsonDepth = 32;             // nested arrays/objects
inline constexpr size_t kMaxJsonValues = 1'000'000;  // array elements and object members
struct JsonShapeLimits {
  int max_depth = kMaxJsonDepth;
  size_t max_values = kMaxJsonValues;
};
// One pass over `body` (outside strings, honouring escapes): 400 if it nests arrays and
// objects deeper than max_depth, holds more than max_values elements/members (counted as
// commas plus containers), or is not well-formed UTF-8. nullopt otherwise; the body may
// still be invalid JSON, which the parser reports.
std::optional<ApiError> CheckJsonShape(std::string_view body, const JsonShapeLimits& limits = {});

// Client text quoted in an error message is cut to this many bytes.
inline constexpr size_t kMaxEchoBytes = 64;

// What the parser checks values against.
struct ApiLimits {
  std::string model_id;  // requests naming another model get 404 (an absent model is fine)
  int n_ctx = 2048;      // max_tokens above this is rejected; prompt token arrays must be shorter
  int n_vocab = 32000;   // token ids must be below this
  // Prompt text (chat: the messages' content bytes together; completions: the prompt;
  // tokenize: the content) above this is refused before tokenizing. 0 = no limit. The
  // server sets n_ctx * (the longest token's bytes), capped at its body limit: a text
  // longer than that cannot fit the context whatever it tokenizes to.
  size_t max_prompt_bytes = 0;
  JsonShapeLimits json = {};
};

// Sampling and output options shared by chat and completions. Defaults follow
// llama.cpp's server (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05).
struct GenerationParams {
  std::optional<int> max_tokens;  // absent: until the context is full
  float temperature = 0.8f;       // [0, 2]; 0 = greedy
  float top_p = 0.95f;            // (0, 1]
  int top_k = 40;                 // >= 0; 0 = off (extension)
  float min_p = 0.05f;            // [0, 1] (extension)
  float repeat_penalty = 1.0f;    // (0, 10] (extension)
  float presence_penalty = 0.0f;  // [-2, 2]; over the generated tokens (OpenAI)
  float frequency_penalty = 0.0f; // [-2, 2]; over the generated tokens (OpenAI)
  // (token id, bias in [-100, 100]) sorted by id; -100 bans the token (OpenAI)
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // at most kMaxStops non-empty strings
  bool logprobs = false;
  int top_logprobs = 0;           // [0, kMaxTopLogprobs]
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  std::string cache_salt;         // vLLM's: prefixes shared only with the same salt
  // Constrained output, compiled and checked (null: free text). From response_format
  // (json_object, json_schema), llama.cpp's grammar / json_schema, vLLM's guided_json /
  // guided_choice / guided_grammar / structured_outputs, SGLang's ebnf; at most one.
  std::shared_ptr<const grammar::Grammar> grammar;
  std::string grammar_param;      // the field it came from, for messages
  bool ignore_eos = false;        // llama.cpp: end tokens are never sampled
  int repeat_last_n = 64;         // llama.cpp (alias penalty_last_n): -1 = the whole context
  // A context smaller than the server's for this request (Ollama's options.num_ctx): the
  // prompt must fit it and the answer ends ("length") where it is full. 0: the server's.
  int context_cap = 0;
};
inline constexpr size_t kMaxGrammarBytes = 256 * 1024;  // GBNF text or schema JSON
inline constexpr size_t kMaxChoices = 256;              // guided_choice entries
inline constexpr int kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;  // per stop string
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr size_t kMaxLogitBias = 4096;  // logit_bias entries

// A function the model may call (tools[i].function, or functions[i]).
struct ToolDefinition {
  std::string name;        // [A-Za-z0-9_-]{1,64}, unique in the request
  std::string parameters;  // its JSON schema, as text in the client's key order; "" if none
  size_t description_bytes = 0;
  bool strict = false;
  // The grammar a call's arguments are held to (tool_choice other than none): its
  // parameters schema, {} for none; null when the schema has a keyword the converter
  // lacks and neither strict nor a forced choice asks for it (any JSON object then).
  std::shared_ptr<const grammar::Grammar> arguments;
};
inline constexpr size_t kMaxTools = 128;

struct ChatCompletionRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  GenerationParams gen;
  std::vector<ToolDefinition> tools;
  jinja::Value tools_value;  // the tools for the template, in the client's key order
  ToolChoice tool_choice = ToolChoice::kNone;  // auto when tools come without a tool_choice
  std::string tool_choice_name;                // kNamed
  bool parallel_tool_calls = true;
  // chat_template_kwargs: more variables for the model's template (enable_thinking, ...).
  // Strings are client input (never control tokens); the template's own variables
  // (messages, tools, add_generation_prompt, bos_token, eos_token) cannot be replaced.
  jinja::ValueDict template_kwargs;
  // Where a thinking model's reasoning goes: "" (the server's --reasoning-format), "none"
  // (left in content) or "deepseek" (reasoning_content); include_reasoning false drops it.
  std::string reasoning_format;
  bool include_reasoning = true;
  // Thinking switched off by a dialect (Anthropic's thinking disabled, Ollama's think
  // false): enable_thinking false for a template that thinks; nothing for one that does not.
  bool thinking_off = false;
};
inline constexpr size_t kMaxTemplateKwargs = 64;

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;  // exactly one of prompt_text / prompt_tokens
  std::vector<int32_t> prompt_tokens;
  bool echo = false;
  bool add_special = true;  // BOS before a text prompt, where the vocabulary wants one
  GenerationParams gen;
};

struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool parse_special = true;  // control-token texts become control tokens (llama-server's default)
  bool with_pieces = false;
};

struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

Parsed<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body, const ApiLimits& limits);
Parsed<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits);
// /tokenize: content above limits.max_prompt_bytes is a 400 (param "content"). The
// one-argument form checks no size.
Parsed<TokenizeRequest> ParseTokenizeRequest(std::string_view body, const ApiLimits& limits);
Parsed<TokenizeRequest> ParseTokenizeRequest(std::string_view body);
Parsed<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body, const ApiLimits& limits);

// ---- responses ----------------------------------------------------------------------

// Where the prompt's K/V came from, in tokens: usage.cache (docs/store.md "Receipt", docs/server.md).
struct CacheUsage {
  int local = 0, store = 0;  // this node's radix cache; the prefix store, of which:
  int store_memory = 0, store_replica = 0, store_ssd = 0, store_remote = 0;
  int waited_for = 0, computed = 0;
  std::vector<std::pair<std::string, int>> miss_reasons;  // tokens the store could not give, by reason
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt_tokens_details.cached_tokens: local + store
  std::optional<CacheUsage> cache;
};

struct TopLogprob {
  std::string token;  // raw bytes of the piece (may be a partial UTF-8 sequence)
  float logprob = 0;
};
struct TokenLogprob {
  std::string token;
  float logprob = 0;
  std::vector<TopLogprob> top;  // most likely first
};

enum class Endpoint { kChat, kCompletion };

// A call the answer made: message.tool_calls[i] / delta.tool_calls[i].
struct ToolCallOut {
  std::string id;         // "call_" + 24 characters
  std::string name;
  std::string arguments;  // JSON text of an object (OpenAI sends it as a string)
  // Streamed pieces: the call's index (SIZE_MAX: tool_call_index + position in the chunk)
  // and whether this is its first piece (index, id, type, name and arguments so far);
  // later pieces carry the index and the next arguments text only.
  size_t index = SIZE_MAX;
  bool first = true;
};

// Legacy completions logprobs carry text_offset: the byte offset of each token's text in
// the whole returned `text`. A response or chunk numbers its tokens from text_offset_base:
//   non-streamed: the length of the echoed prompt (0 without echo);
//   streamed: the echoed prompt's length plus the bytes of every token in earlier chunks
//             (NextTextOffset of the previous chunk), so offsets run on across chunks.
// Token bytes are the raw pieces (TokenLogprob::token).

// A whole non-streamed answer.
struct CompletionResponse {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;
  int64_t created = 0;
  std::string model;
  std::string text;
  std::string reasoning;      // kChat: message.reasoning_content (reasoning.h); "" -> absent
  std::vector<ToolCallOut> tool_calls;  // kChat: message.tool_calls (content null if text is "")
  std::string finish_reason;  // "stop", "length" or "tool_calls"
  Usage usage;
  bool with_logprobs = false;
  std::vector<TokenLogprob> logprobs;
  size_t text_offset_base = 0;  // kCompletion: text_offset of logprobs[0]
};
std::string ResponseJson(const CompletionResponse& r);

// One SSE event of a stream. role: the first chat chunk (delta.role = "assistant").
struct StreamChunk {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;
  int64_t created = 0;
  std::string model;
  bool role = false;
  std::string text;
  std::string reasoning;  // kChat: delta.reasoning_content
  std::vector<ToolCallOut> tool_calls;  // kChat: delta.tool_calls, numbered from tool_call_index
  size_t tool_call_index = 0;
  std::optional<std::string> finish_reason;
  bool with_logprobs = false;
  std::vector<TokenLogprob> logprobs;
  bool usage_null = false;  // include_usage: every chunk but the last carries "usage": null
  size_t text_offset_base = 0;  // kCompletion: text_offset of logprobs[0]
};
std::string ChunkJson(const StreamChunk& c);
// text_offset_base for the chunk after `c`: its base plus the bytes of its tokens.
size_t NextTextOffset(const StreamChunk& c);
// The final include_usage chunk: "choices": [] and the usage.
std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                           const Usage& u);

// n_ctx: the server's context; n_ctx_train: the model's trained one.
std::string ModelsJson(const std::string& model_id, int64_t created, int n_ctx, int n_ctx_train);
std::string TokenizeJson(const std::vector<int32_t>& ids, const std::vector<std::string>* pieces);
std::string DetokenizeJson(const std::string& content);

}  // namespace trellis::server

// libFuzzer target for the server's JSON request readers (built only with -DTRELLIS_FUZZ=ON
// and clang).
//
// Feeds the input as a request body to every parser in server/api.h
// (ParseChatCompletionRequest, ParseCompletionRequest, ParseTokenizeRequest,
// ParseDetokenizeRequest) and server/dialects.h (Responses, Anthropic Messages and
// count_tokens, Ollama chat, generate and show). A dialect's accepted request is answered
// through its writer (whole and streamed, with the request's own text): every body, SSE
// data line and NDJSON line must be valid JSON. A rejected body must carry a 400/404 ApiError with a message,
// and ErrorJson of it must be valid JSON. An accepted body must satisfy the ranges the
// parser promises (api.h), and the response serializers fed from it (ResponseJson,
// ChunkJson, TokenizeJson, DetokenizeJson) must produce valid JSON. An accepted chat
// request is then rendered with every chat template family: an error is fine, a crash or
// an empty error message is not. Any violation aborts.
//
// Run: api_fuzz -max_total_time=300 -max_len=65536 -dict=tests/data/api_corpus.dict \
//        /tmp/new-corpus tests/data/api_corpus
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "server/answer_grammar.h"
#include "server/chat_template.h"
#include "server/dialects.h"
#include "server/tool_calls.h"

namespace trellis::server {
namespace {

#define FUZZ_CHECK(cond)                                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "api_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

using json = nlohmann::json;

const ApiLimits& Limits() {
  static const ApiLimits limits = [] {
    ApiLimits l;  // fields set by name: ApiLimits may grow members with defaults
    l.model_id = "fuzz-model";
    l.n_ctx = 2048;
    l.n_vocab = 32000;
    return l;
  }();
  return limits;
}

constexpr const char* kFuzzFamilies[] = {"llama2", "llama3",  "llama3.1", "mistral",
                                     "mistral-nemo", "chatml", "zephyr", "phi3"};

// Serializer output must always be strict JSON (the serializers replace invalid UTF-8).
// Returns the parsed top level, which is shallow: checking it never recurses deeply.
json MustParse(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) std::fprintf(stderr, "api_fuzz: serializer produced invalid JSON: %.200s\n", text.c_str());
  FUZZ_CHECK(!j.is_discarded());
  return j;
}

void CheckError(const ApiError& e) {
  FUZZ_CHECK(e.status == 400 || e.status == 404);
  FUZZ_CHECK(!e.message.empty());
  FUZZ_CHECK(!e.type.empty());
  if (e.status == 404) FUZZ_CHECK(e.param == "model" && e.code == "model_not_found");
  json j = MustParse(ErrorJson(e));
  FUZZ_CHECK(j.is_object() && j.contains("error") && j["error"].is_object());
  FUZZ_CHECK(j["error"]["message"].is_string());
}

void CheckGeneration(const GenerationParams& g, bool chat) {
  if (g.max_tokens) FUZZ_CHECK(*g.max_tokens >= 0 && *g.max_tokens <= Limits().n_ctx);
  FUZZ_CHECK(g.temperature >= 0.0f && g.temperature <= 2.0f);
  FUZZ_CHECK(g.top_p > 0.0f && g.top_p <= 1.0f);
  FUZZ_CHECK(g.top_k >= 0 && g.top_k <= Limits().n_vocab);
  FUZZ_CHECK(g.min_p >= 0.0f && g.min_p <= 1.0f);
  FUZZ_CHECK(g.repeat_penalty > 0.0f && g.repeat_penalty <= 10.0f);
  FUZZ_CHECK(g.stop.size() <= static_cast<size_t>(kMaxStops));
  for (const std::string& s : g.stop) FUZZ_CHECK(!s.empty());
  FUZZ_CHECK(g.top_logprobs >= 0 && g.top_logprobs <= (chat ? kMaxTopLogprobs : 5));
  if (chat && g.top_logprobs > 0) FUZZ_CHECK(g.logprobs);
  if (g.include_usage) FUZZ_CHECK(g.stream);
}

void CheckModel(const std::string& model) { FUZZ_CHECK(model.empty() || model == Limits().model_id); }

// A response and a stream chunk carrying `text` (arbitrary bytes from the request).
void CheckResponses(Endpoint ep, const std::string& model, const std::string& text, const GenerationParams& g) {
  CompletionResponse r;
  r.endpoint = ep;
  r.id = "fuzz";
  r.model = model;
  r.text = text;
  r.finish_reason = "stop";
  r.with_logprobs = g.logprobs;
  if (g.logprobs) {
    TokenLogprob t{text.substr(0, 8), -0.5f, {}};
    for (int i = 0; i < g.top_logprobs; ++i) {
      t.top.push_back({text.substr(std::min<size_t>(i, text.size()), 3), -1.0f * i});
    }
    r.logprobs.push_back(t);
  }
  FUZZ_CHECK(MustParse(ResponseJson(r)).is_object());
  StreamChunk c;
  c.endpoint = ep;
  c.id = r.id;
  c.model = model;
  c.role = ep == Endpoint::kChat;
  c.text = text;
  c.with_logprobs = r.with_logprobs;
  c.logprobs = r.logprobs;
  c.usage_null = g.include_usage;
  FUZZ_CHECK(MustParse(ChunkJson(c)).is_object());
}

void FuzzChat(std::string_view body) {
  auto req = ParseChatCompletionRequest(body, Limits());
  if (!req.ok()) return CheckError(req.error());
  CheckModel(req->model);
  CheckGeneration(req->gen, /*chat=*/true);
  FUZZ_CHECK(!req->messages.empty());
  for (const ChatMessage& m : req->messages) {
    FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool");
    FUZZ_CHECK(!m.content_null || m.content.empty());
  }
  CheckResponses(Endpoint::kChat, req->model, req->messages.back().content, req->gen);

  // Tools: names unique and valid, a named choice among them, every forced tool's
  // arguments held to a grammar; the composed answer grammar builds or is refused cleanly
  // in every syntax, and the answer parser and stream take the content whatever it is.
  FUZZ_CHECK(req->tool_choice == ToolChoice::kNone || !req->tools.empty());
  for (const ToolDefinition& t : req->tools) {
    FUZZ_CHECK(!t.name.empty() && t.name.size() <= 64);
    FUZZ_CHECK(std::count_if(req->tools.begin(), req->tools.end(), [&](const ToolDefinition& o) { return o.name == t.name; }) == 1);
    const bool forced = req->tool_choice == ToolChoice::kRequired ||
                        (req->tool_choice == ToolChoice::kNamed && t.name == req->tool_choice_name);
    if (forced || (t.strict && req->tool_choice == ToolChoice::kAuto)) FUZZ_CHECK(t.arguments != nullptr);
  }
  if (req->tool_choice == ToolChoice::kNamed) {
    FUZZ_CHECK(std::any_of(req->tools.begin(), req->tools.end(),
                           [&](const ToolDefinition& t) { return t.name == req->tool_choice_name; }));
  }
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kGeneric}) {
    AnswerSpec spec;
    spec.format = f;
    spec.choice = req->tool_choice;
    spec.parallel = req->parallel_tool_calls;
    spec.content = req->gen.grammar;
    spec.reasoning = f == ToolCallFormat::kHermes ? ReasoningPrefix::kOptional : ReasoningPrefix::kNone;
    for (const ToolDefinition& t : req->tools) spec.tools.push_back({t.name, t.arguments});
    auto g = BuildAnswerGrammar(spec);
    if (!g.ok()) FUZZ_CHECK(!g.status().message().empty());
    const std::string& content = req->messages.back().content;
    ParsedAnswer a = ParseToolCalls(f, content);
    for (const ParsedToolCall& c : a.calls) FUZZ_CHECK(MustParse(c.arguments).is_object());
    ToolCallStream s(f);
    std::string sent = s.Feed(content);
    ToolCallStream::End end = s.Finish();
    if (end.calls.empty()) FUZZ_CHECK(sent + end.content == content);
  }
  ChatVars vars;  // the named families take no kwargs; the tools they polyfill
  vars.tools = req->tools_value;

  for (const char* name : kFuzzFamilies) {
    auto tmpl = ChatTemplate::FromName(name, TemplateTokens{});
    FUZZ_CHECK(tmpl.ok());
    for (bool add_generation_prompt : {true, false}) {
      auto prompt = tmpl->Render(req->messages, add_generation_prompt, vars);
      if (!prompt.ok()) {
        FUZZ_CHECK(!prompt.status().message().empty());
        continue;
      }
      volatile size_t sink = prompt->size();
      (void)sink;
    }
  }
}

void FuzzCompletion(std::string_view body) {
  auto req = ParseCompletionRequest(body, Limits());
  if (!req.ok()) return CheckError(req.error());
  CheckModel(req->model);
  CheckGeneration(req->gen, /*chat=*/false);
  // Exactly one of the two prompt forms.
  FUZZ_CHECK(req->prompt_text.has_value() != !req->prompt_tokens.empty());
  for (int32_t id : req->prompt_tokens) FUZZ_CHECK(id >= 0 && id < Limits().n_vocab);
  CheckResponses(Endpoint::kCompletion, req->model, req->prompt_text.value_or(""), req->gen);
  FUZZ_CHECK(MustParse(TokenizeJson(req->prompt_tokens, nullptr)).is_object());
}

void FuzzTokenize(std::string_view body) {
  auto req = ParseTokenizeRequest(body);
  if (!req.ok()) return CheckError(req.error());
  // The content as a detokenize answer and as a piece of a tokenize answer (raw bytes).
  FUZZ_CHECK(MustParse(DetokenizeJson(req->content)).is_object());
  std::vector<std::string> pieces = {req->content};
  FUZZ_CHECK(MustParse(TokenizeJson({1}, req->with_pieces ? &pieces : nullptr)).is_object());
}

void FuzzDetokenize(std::string_view body) {
  auto req = ParseDetokenizeRequest(body, Limits());
  if (!req.ok()) return CheckError(req.error());
  for (int32_t id : req->tokens) FUZZ_CHECK(id >= 0 && id < Limits().n_vocab);
  FUZZ_CHECK(MustParse(TokenizeJson(req->tokens, nullptr)).is_object());
}

// Every SSE data line / NDJSON line of a writer's output is one JSON object.
void CheckFrames(const std::string& out, bool ndjson) {
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t nl = out.find('\n', pos);
    FUZZ_CHECK(nl != std::string::npos);
    const std::string line = out.substr(pos, nl - pos);
    pos = nl + 1;
    if (ndjson) {
      FUZZ_CHECK(MustParse(line).is_object());
    } else if (line.starts_with("data: ")) {
      FUZZ_CHECK(MustParse(line.substr(6)).is_object());
    } else {
      FUZZ_CHECK(line.empty() || line.starts_with("event: "));
    }
  }
}

// A writer answering with `text` (request bytes) as content, reasoning and a call.
void CheckWriter(AnswerWriter& w, const std::string& text, bool ndjson) {
  WholeAnswer a;
  a.text = text;
  a.reasoning = text.substr(0, text.size() / 2);
  a.tool_calls.push_back({"call_1", "f", "{\"a\": 1}"});
  a.end = {"tool_calls", text.substr(0, 4), {}};
  FUZZ_CHECK(MustParse(w.Whole(a).body).is_object());
  std::string s = w.Open();
  AnswerDelta d;
  d.content = text;
  d.reasoning = a.reasoning;
  d.calls.push_back({"call_2", "g", text.substr(0, 3), 0, true});
  s += w.Delta(d);
  s += w.Close({"length", "", {}});
  ApiError failure;
  failure.status = 500;
  failure.message = text.substr(0, 64);
  s += w.Failed(failure);
  CheckFrames(s, ndjson);
}

void CheckDialectError(const ApiError& e, http::HttpResponse (*shape)(const ApiError&)) {
  CheckError(e);
  FUZZ_CHECK(MustParse(shape(e).body).is_object());
}

void CheckChat(const ChatCompletionRequest& c) {
  CheckGeneration(c.gen, /*chat=*/true);
  FUZZ_CHECK(!c.messages.empty());
  FUZZ_CHECK(c.tool_choice == ToolChoice::kNone || !c.tools.empty());
}

void FuzzDialects(std::string_view body) {
  if (auto r = ParseResponsesRequest(body, Limits()); !r.ok()) {
    CheckDialectError(r.error(), OpenAiErrorResponse);
  } else {
    std::string conversation, again;
    auto chat = ResponsesChat(*r, "", Limits(), &conversation);
    FUZZ_CHECK(chat.ok() || r->previous_response_id.size() > 0);
    if (chat.ok()) {
      CheckChat(*chat);
      // The next turn with this one as its history.
      auto next = ResponsesChat(*r, conversation, Limits(), &again);
      if (!next.ok()) CheckError(next.error());
      ResponsesWriter w("resp_fuzz", 0, "fuzz-model", *r, nullptr);
      CheckWriter(w, chat->messages.back().content, false);
    }
  }
  if (auto r = ParseAnthropicRequest(body, Limits()); !r.ok()) {
    CheckDialectError(r.error(), AnthropicErrorResponse);
  } else {
    CheckChat(r->chat);
    AnthropicWriter w("msg_fuzz", "fuzz-model");
    CheckWriter(w, r->chat.messages.back().content, false);
  }
  if (auto r = ParseAnthropicCountRequest(body, Limits()); !r.ok()) CheckDialectError(r.error(), AnthropicErrorResponse);
  for (bool generate : {false, true}) {
    auto r = generate ? ParseOllamaGenerate(body, Limits()) : ParseOllamaChat(body, Limits());
    if (!r.ok()) {
      CheckDialectError(r.error(), OllamaErrorResponse);
      continue;
    }
    FUZZ_CHECK(r->num_ctx >= 0 && r->num_ctx <= Limits().n_ctx);
    if (r->raw) {
      CheckGeneration(r->raw->gen, /*chat=*/false);
    } else {
      CheckChat(r->chat);
    }
    OllamaWriter w(r->model, generate);
    CheckWriter(w, r->raw ? r->raw->prompt_text.value_or("") : r->chat.messages.back().content, true);
  }
  if (auto r = ParseOllamaShow(body, Limits()); !r.ok()) CheckDialectError(r.error(), OllamaErrorResponse);
}

}  // namespace
}  // namespace trellis::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  trellis::server::FuzzChat(body);
  trellis::server::FuzzCompletion(body);
  trellis::server::FuzzTokenize(body);
  trellis::server::FuzzDetokenize(body);
  trellis::server::FuzzDialects(body);
  return 0;
}

// Response bodies: completions, stream chunks, usage, logprobs, models, tokenize.
#include "server/api.h"

#include "server/api_reader.h"

namespace trellis::server {

using namespace api_detail;

namespace api_detail {

void AddCacheReceipt(const Usage& u, json& usage) {
  if (!u.cache) return;
  const CacheUsage& c = *u.cache;
  json reasons = json::object();
  for (const auto& [why, n] : c.miss_reasons) reasons[why] = n;
  usage["cache"] = {{"local", c.local},
                    {"store", c.store},
                    {"store_tiers", {{"memory", c.store_memory}, {"replica", c.store_replica}, {"ssd", c.store_ssd},
                                     {"remote", c.store_remote}}},
                    {"waited_for", c.waited_for},
                    {"computed", c.computed},
                    {"miss_reasons", std::move(reasons)}};
}

}  // namespace api_detail

// ---- responses ----------------------------------------------------------------------

namespace {

json UsageJson(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  AddCacheReceipt(u, j);
  return j;
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json ChatLogprobs(const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    json top = json::array();
    for (const TopLogprob& x : t.top) top.push_back({{"token", x.token}, {"logprob", x.logprob}, {"bytes", Bytes(x.token)}});
    content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Legacy completions format; text_offset counts token bytes from `offset` (see
// CompletionResponse::text_offset_base).
json CompletionLogprobs(const std::vector<TokenLogprob>& lps, size_t offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const TopLogprob& x : t.top) top[x.token] = x.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.token.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json Envelope(Endpoint ep, bool chunk, const std::string& id, int64_t created, const std::string& model) {
  const char* object = ep == Endpoint::kChat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}, {"system_fingerprint", "trellis"}};
}

}  // namespace

std::string ResponseJson(const CompletionResponse& r) {
  json j = Envelope(r.endpoint, false, r.id, r.created, r.model);
  json choice = {{"index", 0}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}};
  if (r.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    if (!r.reasoning.empty()) choice["message"]["reasoning_content"] = r.reasoning;
    if (!r.tool_calls.empty()) {
      if (r.text.empty()) choice["message"]["content"] = nullptr;
      json calls = json::array();
      for (const ToolCallOut& c : r.tool_calls) {
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      choice["message"]["tool_calls"] = std::move(calls);
    }
    if (r.with_logprobs) choice["logprobs"] = ChatLogprobs(r.logprobs);
  } else {
    choice["text"] = r.text;
    if (r.with_logprobs) choice["logprobs"] = CompletionLogprobs(r.logprobs, r.text_offset_base);
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(r.usage);
  return Dump(j);
}

std::string ChunkJson(const StreamChunk& c) {
  json j = Envelope(c.endpoint, true, c.id, c.created, c.model);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (c.finish_reason) choice["finish_reason"] = *c.finish_reason;
  if (c.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (c.role) delta["role"] = "assistant";
    if (c.role || !c.text.empty()) delta["content"] = c.text;
    if (!c.reasoning.empty()) delta["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      json calls = json::array();
      for (size_t i = 0; i < c.tool_calls.size(); ++i) {
        const ToolCallOut& t = c.tool_calls[i];
        const size_t index = t.index != SIZE_MAX ? t.index : c.tool_call_index + i;
        if (t.first) {
          calls.push_back({{"index", index}, {"id", t.id}, {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        } else {
          calls.push_back({{"index", index}, {"function", {{"arguments", t.arguments}}}});
        }
      }
      delta["tool_calls"] = std::move(calls);
    }
    choice["delta"] = delta;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = ChatLogprobs(c.logprobs);
  } else {
    choice["text"] = c.text;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = CompletionLogprobs(c.logprobs, c.text_offset_base);
  }
  j["choices"] = json::array({choice});
  if (c.usage_null) j["usage"] = nullptr;
  return Dump(j);
}

size_t NextTextOffset(const StreamChunk& c) {
  size_t offset = c.text_offset_base;
  for (const TokenLogprob& t : c.logprobs) offset += t.token.size();
  return offset;
}

std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                           const Usage& u) {
  json j = Envelope(endpoint, true, id, created, model);
  j["choices"] = json::array();
  j["usage"] = UsageJson(u);
  return Dump(j);
}

std::string ModelsJson(const std::string& model_id, int64_t created, int n_ctx, int n_ctx_train) {
  // max_model_len: vLLM's name for the context a request may fill; meta: llama-server's.
  json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "trellis"},
            {"max_model_len", n_ctx}, {"meta", {{"n_ctx", n_ctx}, {"n_ctx_train", n_ctx_train}}}};
  return Dump(json{{"object", "list"}, {"data", json::array({m})}});
}

std::string TokenizeJson(const std::vector<int32_t>& ids, const std::vector<std::string>* pieces) {
  json tokens = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (pieces) {
      tokens.push_back({{"id", ids[i]}, {"piece", (*pieces)[i]}});
    } else {
      tokens.push_back(ids[i]);
    }
  }
  return Dump(json{{"tokens", tokens}});
}

std::string DetokenizeJson(const std::string& content) { return Dump(json{{"content", content}}); }

}  // namespace trellis::server

#include "server/api.h"

#include <cmath>
#include <exception>

#include <nlohmann/json.hpp>

namespace trellis::server {
namespace {

using json = nlohmann::json;

// Model output and token pieces may hold partial UTF-8: replace, never throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError Bad(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

// Reads optional fields of one JSON object with type and range checks. The first error
// sticks; later reads are no-ops. null counts as absent (the OpenAI API allows it).
class Reader {
 public:
  explicit Reader(const json& obj) : obj_(obj) {}
  bool ok() const { return !error_.has_value(); }
  ApiError error() const { return *error_; }
  void Fail(std::string param, std::string msg) {
    if (!error_) error_ = Bad(std::move(param), std::move(msg));
  }
  const json* Get(const char* key) {
    if (error_) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void Bool(const char* key, bool& out) {
    if (const json* v = Get(key)) {
      if (!v->is_boolean()) return Fail(key, std::string("'") + key + "' must be a boolean");
      out = v->get<bool>();
    }
  }
  void String(const char* key, std::string& out) {
    if (const json* v = Get(key)) {
      if (!v->is_string()) return Fail(key, std::string("'") + key + "' must be a string");
      out = v->get<std::string>();
    }
  }
  // A float in [lo, hi] (lo excluded if lo_open).
  void Float(const char* key, float& out, double lo, double hi, bool lo_open = false) {
    if (const json* v = Get(key)) {
      if (!v->is_number()) return Fail(key, std::string("'") + key + "' must be a number");
      const double d = v->get<double>();
      if (!std::isfinite(d) || d > hi || (lo_open ? d <= lo : d < lo)) {
        return Fail(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") + Num(lo) + ", " + Num(hi) +
                             "], got " + v->dump());
      }
      out = static_cast<float>(d);
    }
  }
  // An integer in [lo, hi].
  bool Int(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    if (const json* v = Get(key)) {
      if (!v->is_number_integer()) {
        Fail(key, std::string("'") + key + "' must be an integer");
        return false;
      }
      if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : v->get<int64_t>() > hi) {
        Fail(key, std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + v->dump());
        return false;
      }
      const int64_t x = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
      if (x < lo) {
        Fail(key, std::string("'") + key + "' must be at least " + std::to_string(lo) + ", got " + v->dump());
        return false;
      }
      out = x;
      return true;
    }
    return false;
  }

 private:
  static std::string Num(double d) {
    std::string s = std::to_string(d);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  const json& obj_;
  std::optional<ApiError> error_;
};

std::optional<ApiError> ParseObject(std::string_view body, json& out) {
  out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) return Bad("", "the request body is not valid JSON");
  if (!out.is_object()) return Bad("", "the request body must be a JSON object");
  return std::nullopt;
}

void ReadModel(Reader& r, const ApiLimits& limits, std::string& model, std::optional<ApiError>& not_found) {
  r.String("model", model);
  if (r.ok() && !model.empty() && model != limits.model_id) {
    ApiError e;
    e.status = 404;
    e.message = "The model '" + model + "' does not exist (this server serves '" + limits.model_id + "')";
    e.param = "model";
    e.code = "model_not_found";
    not_found = e;
  }
}

// Options common to chat and completions. `chat`: logprobs is a boolean with
// top_logprobs; otherwise (legacy completions) logprobs is the number of top entries.
void ReadGeneration(Reader& r, const ApiLimits& limits, bool chat, GenerationParams& g) {
  int64_t n = 1;
  if (r.Int("n", n, 1, 1000) && n != 1) r.Fail("n", "only n = 1 is supported");
  int64_t best_of = 1;
  if (!chat && r.Int("best_of", best_of, 1, 1000) && best_of != 1) r.Fail("best_of", "only best_of = 1 is supported");
  int64_t v = 0;
  const char* max_key = chat && r.Get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (r.Int(max_key, v, 0, limits.n_ctx)) g.max_tokens = static_cast<int>(v);
  r.Float("temperature", g.temperature, 0.0, 2.0);
  r.Float("top_p", g.top_p, 0.0, 1.0, /*lo_open=*/true);
  r.Float("min_p", g.min_p, 0.0, 1.0);
  r.Float("repeat_penalty", g.repeat_penalty, 0.0, 10.0, /*lo_open=*/true);
  float ignored = 0;
  r.Float("presence_penalty", ignored, -2.0, 2.0);
  r.Float("frequency_penalty", ignored, -2.0, 2.0);
  if (r.Int("top_k", v, 0, limits.n_vocab)) g.top_k = static_cast<int>(v);
  if (const json* s = r.Get("seed")) {
    if (!s->is_number_integer()) {
      r.Fail("seed", "'seed' must be an integer");
    } else {
      g.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
    }
  }
  if (const json* s = r.Get("stop")) {
    auto add = [&](const json& x) {
      if (!x.is_string()) return r.Fail("stop", "'stop' must be a string or an array of strings");
      if (x.get_ref<const std::string&>().empty()) return r.Fail("stop", "stop strings must not be empty");
      g.stop.push_back(x.get<std::string>());
    };
    if (s->is_array()) {
      if (s->size() > kMaxStops) r.Fail("stop", "at most " + std::to_string(kMaxStops) + " stop strings");
      for (const json& x : *s) add(x);
    } else {
      add(*s);
    }
  }
  if (chat) {
    r.Bool("logprobs", g.logprobs);
    if (r.Int("top_logprobs", v, 0, kMaxTopLogprobs)) {
      if (!g.logprobs) r.Fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      g.top_logprobs = static_cast<int>(v);
    }
  } else if (r.Int("logprobs", v, 0, 5)) {
    g.logprobs = true;
    g.top_logprobs = static_cast<int>(v);
  }
  r.Bool("stream", g.stream);
  if (const json* so = r.Get("stream_options")) {
    if (!so->is_object()) return r.Fail("stream_options", "'stream_options' must be an object");
    if (!g.stream) return r.Fail("stream_options", "'stream_options' is only allowed with 'stream': true");
    Reader sr(*so);
    sr.Bool("include_usage", g.include_usage);
    if (!sr.ok()) r.Fail("stream_options.include_usage", sr.error().message);
  }
  if (const json* t = r.Get("tools"); t && !(t->is_array() && t->empty())) {
    r.Fail("tools", "tools are not supported by this server");
  }
  if (const json* lb = r.Get("logit_bias"); lb && !(lb->is_object() && lb->empty())) {
    r.Fail("logit_bias", "logit_bias is not supported by this server");
  }
}

Result<std::string> MessageContent(const json& c) {
  if (c.is_null()) return std::string();
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return InvalidArgument("message content must be a string or an array of text parts");
  std::string out;
  for (const json& part : c) {
    if (!part.is_object()) return InvalidArgument("content parts must be objects");
    auto type = part.find("type");
    auto text = part.find("text");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return InvalidArgument("only content parts of type 'text' are supported");
    }
    if (text == part.end() || !text->is_string()) return InvalidArgument("a text content part needs a string 'text'");
    out += text->get<std::string>();
  }
  return out;
}

template <typename T, typename F>
Parsed<T> Guard(F&& f) {
  // Every access above is type-checked; this only keeps a missed case from crossing the layer.
  try {
    return f();
  } catch (const std::exception& e) {
    return Bad("", std::string("malformed request: ") + e.what());
  }
}

}  // namespace

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Dump(json{{"error", err}});
}

Parsed<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<ChatCompletionRequest>([&]() -> Parsed<ChatCompletionRequest> {
    json j;
    if (auto e = ParseObject(body, j)) return *e;
    ChatCompletionRequest req;
    Reader r(j);
    std::optional<ApiError> not_found;
    ReadModel(r, limits, req.model, not_found);
    const json* msgs = r.Get("messages");
    if (r.ok() && (!msgs || !msgs->is_array() || msgs->empty())) {
      return Bad("messages", "'messages' must be a non-empty array");
    }
    if (msgs) {
      for (size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        const std::string param = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return Bad(param, param + " must be an object");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string()) return Bad(param + ".role", param + ".role must be a string");
        auto content = m.find("content");
        if (content == m.end()) return Bad(param + ".content", param + " has no content");
        auto text = MessageContent(*content);
        if (!text.ok()) return Bad(param + ".content", text.status().message());
        const std::string& rs = role->get_ref<const std::string&>();
        if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer") {
          return Bad(param + ".role", "unsupported role '" + rs + "' (system, user, assistant)");
        }
        req.messages.push_back({rs == "developer" ? "system" : rs, std::move(text).value()});
      }
    }
    ReadGeneration(r, limits, /*chat=*/true, req.gen);
    if (!r.ok()) return r.error();
    if (not_found) return *not_found;
    return req;
  });
}

Parsed<CompletionRequest> ParseCompletionRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<CompletionRequest>([&]() -> Parsed<CompletionRequest> {
    json j;
    if (auto e = ParseObject(body, j)) return *e;
    CompletionRequest req;
    Reader r(j);
    std::optional<ApiError> not_found;
    ReadModel(r, limits, req.model, not_found);
    const json* p = r.Get("prompt");
    if (r.ok() && !p) return Bad("prompt", "'prompt' is required");
    if (p) {
      const json* one = p;
      if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
        if (p->size() != 1) return Bad("prompt", "only one prompt per request is supported");
        one = &(*p)[0];
      }
      if (one->is_string()) {
        req.prompt_text = one->get<std::string>();
      } else if (one->is_array() && !one->empty()) {
        for (const json& t : *one) {
          if (!t.is_number_integer()) return Bad("prompt", "'prompt' must be a string or an array of token ids");
          const int64_t id = t.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX))
                                                    : t.get<int64_t>();
          if (id < 0 || id >= limits.n_vocab) {
            return Bad("prompt", "token id " + t.dump() + " is outside the vocabulary (0.." +
                                     std::to_string(limits.n_vocab - 1) + ")");
          }
          req.prompt_tokens.push_back(static_cast<int32_t>(id));
        }
      } else {
        return Bad("prompt", "'prompt' must be a string or a non-empty array of token ids");
      }
    }
    r.Bool("echo", req.echo);
    if (const json* s = r.Get("suffix"); s && !(s->is_string() && s->get_ref<const std::string&>().empty())) {
      r.Fail("suffix", "'suffix' is not supported");
    }
    ReadGeneration(r, limits, /*chat=*/false, req.gen);
    if (!r.ok()) return r.error();
    if (not_found) return *not_found;
    return req;
  });
}

Parsed<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  return Guard<TokenizeRequest>([&]() -> Parsed<TokenizeRequest> {
    json j;
    if (auto e = ParseObject(body, j)) return *e;
    TokenizeRequest req;
    Reader r(j);
    if (!r.Get("content")) return Bad("content", "'content' is required");
    r.String("content", req.content);
    r.Bool("add_special", req.add_special);
    r.Bool("with_pieces", req.with_pieces);
    if (!r.ok()) return r.error();
    return req;
  });
}

Parsed<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<DetokenizeRequest>([&]() -> Parsed<DetokenizeRequest> {
    json j;
    if (auto e = ParseObject(body, j)) return *e;
    DetokenizeRequest req;
    Reader r(j);
    const json* t = r.Get("tokens");
    if (!t || !t->is_array()) return Bad("tokens", "'tokens' must be an array of token ids");
    for (const json& x : *t) {
      if (!x.is_number_integer() || (x.is_number_unsigned() ? x.get<uint64_t>() >= static_cast<uint64_t>(limits.n_vocab)
                                                              : (x.get<int64_t>() < 0 || x.get<int64_t>() >= limits.n_vocab))) {
        return Bad("tokens", "token " + x.dump() + " is not an id in 0.." + std::to_string(limits.n_vocab - 1));
      }
      req.tokens.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return req;
  });
}

// ---- responses ----------------------------------------------------------------------

namespace {

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
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

// Legacy completions format; text_offset counts bytes from `offset`.
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
    if (r.with_logprobs) choice["logprobs"] = ChatLogprobs(r.logprobs);
  } else {
    choice["text"] = r.text;
    if (r.with_logprobs) choice["logprobs"] = CompletionLogprobs(r.logprobs, 0);
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
    choice["delta"] = delta;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = ChatLogprobs(c.logprobs);
  } else {
    choice["text"] = c.text;
    if (c.with_logprobs && !c.logprobs.empty()) choice["logprobs"] = CompletionLogprobs(c.logprobs, 0);
  }
  j["choices"] = json::array({choice});
  if (c.usage_null) j["usage"] = nullptr;
  return Dump(j);
}

std::string UsageChunkJson(Endpoint endpoint, const std::string& id, int64_t created, const std::string& model,
                           const Usage& u) {
  json j = Envelope(endpoint, true, id, created, model);
  j["choices"] = json::array();
  j["usage"] = UsageJson(u);
  return Dump(j);
}

std::string ModelsJson(const std::string& model_id, int64_t created, int n_ctx) {
  json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "trellis"},
            {"meta", {{"n_ctx", n_ctx}}}};
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

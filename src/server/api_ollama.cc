// Ollama's API (/api/chat, /api/generate, /api/show; the GET routes are in
// server_dialects.cc) onto the chat and completion requests: messages with tool calls and
// thinking, format (json or a schema), options, think; answers as one JSON object or
// NDJSON lines. Ollama's sampling defaults apply where the request says nothing (top_p
// 0.9, min_p 0, repeat_penalty 1.1 over the last 64 tokens). docs/server.md, "Ollama".
#include <ctime>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "server/api_reader.h"
#include "server/dialects.h"

namespace trellis::server {

using namespace api_detail;

namespace {

ApiError OllamaNotFound(const std::string& model) {
  ApiError e;
  e.status = 404;
  e.message = "model '" + Clip(model) + "' not found";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

// model: required; the served model's id, with or without ":latest".
std::optional<ApiError> ReadOllamaModel(OReader& r, const ApiLimits& limits, std::string& model) {
  r.String("model", model);
  if (!r.ok()) return r.error();
  if (model.empty()) return Bad("model", "'model' is required");
  std::string_view name = model;
  if (name.ends_with(":latest")) name.remove_suffix(7);
  if (name != limits.model_id && model != limits.model_id) return OllamaNotFound(model);
  return std::nullopt;
}

// options -> OpenAI body fields (Ollama's defaults where absent). num_ctx is returned.
std::optional<ApiError> ReadOllamaOptions(OReader& r, const ApiLimits& limits, ojson& out, Renames& renames, int& num_ctx) {
  // Ollama's defaults (api/types.go DefaultOptions) for what it and the chat path both have.
  out["top_p"] = 0.9;
  out["min_p"] = 0.0;
  out["repeat_penalty"] = 1.1;
  out["repeat_last_n"] = 64;
  const ojson* o = r.Get("options");
  if (!o) return std::nullopt;
  if (!o->is_object()) return Bad("options", "'options' must be an object");
  struct Map {
    const char* ollama;
    const char* openai;
  };
  static const Map kSame[] = {
      {"temperature", "temperature"}, {"top_k", "top_k"}, {"top_p", "top_p"}, {"min_p", "min_p"}, {"seed", "seed"},
      {"stop", "stop"}, {"repeat_penalty", "repeat_penalty"}, {"repeat_last_n", "repeat_last_n"},
      {"presence_penalty", "presence_penalty"}, {"frequency_penalty", "frequency_penalty"}, {"typical_p", "typical_p"},
      {"mirostat", "mirostat"}, {"mirostat_tau", "mirostat_tau"}, {"mirostat_eta", "mirostat_eta"}, {"num_keep", "n_keep"},
  };
  OReader orr(*o);
  for (const Map& m : kSame) {
    if (const ojson* v = orr.Get(m.ollama)) {
      out[m.openai] = *v;
      renames.emplace_back(m.openai, std::string("options.") + m.ollama);
    }
  }
  if (const ojson* v = orr.Get("num_predict")) {
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(limits.n_ctx)) ||
        (v->get<int64_t>() < 1 && v->get<int64_t>() != -1 && v->get<int64_t>() != -2)) {
      return Bad("options.num_predict", "'options.num_predict' must be -1 (no limit), -2 (until the context is full) or at least 1, got " + Describe(*v));
    }
    if (v->get<int64_t>() > 0) out["max_tokens"] = *v;
    renames.emplace_back("max_tokens", "options.num_predict");
  }
  if (const ojson* v = orr.Get("num_ctx")) {
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(limits.n_ctx)) ||
        v->get<int64_t>() < 1 || v->get<int64_t>() > limits.n_ctx) {
      return Bad("options.num_ctx", "'options.num_ctx' must be in [1, " + std::to_string(limits.n_ctx) +
                                        "] (this server's context; it is set when the server starts), got " + Describe(*v));
    }
    num_ctx = v->get<int>();
  }
  if (const ojson* v = orr.Get("tfs_z"); v && !(v->is_number() && v->get<double>() == 1.0)) {
    return Bad("options.tfs_z", "'options.tfs_z' is not supported (it would change the output)");
  }
  for (const char* k : {"vocab_only", "logits_all", "embedding_only"}) {
    if (const ojson* v = orr.Get(k); v && *v != false) return Bad(std::string("options.") + k, std::string("'options.") + k + "' is not supported");
  }
  // How the runtime runs, not what it answers: threads, batch, memory mapping, GPU layers.
  for (const char* k : {"num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap", "use_mlock", "low_vram", "f16_kv",
                        "numa", "penalize_newline"}) {
    orr.Get(k);
  }
  orr.RefuseUnread("options.");
  if (!orr.ok()) return orr.error();
  return std::nullopt;
}

// format: "json", a JSON schema, or "" (none).
std::optional<ApiError> ReadOllamaFormat(OReader& r, ojson& out, Renames& renames) {
  const ojson* f = r.Get("format");
  if (!f || (f->is_string() && f->get_ref<const std::string&>().empty())) return std::nullopt;
  if (*f == "json") {
    out["response_format"] = {{"type", "json_object"}};
  } else if (f->is_object()) {
    out["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "format"}, {"schema", *f}}}};
  } else {
    return Bad("format", "'format' must be \"json\" or a JSON schema object");
  }
  renames.emplace_back("response_format.json_schema.schema", "format");
  renames.emplace_back("response_format", "format");
  return std::nullopt;
}

// think: true / false / "low" | "medium" | "high".
std::optional<ApiError> ReadOllamaThink(OReader& r, ojson& out, bool& thinking_off) {
  const ojson* t = r.Get("think");
  if (!t) return std::nullopt;
  if (t->is_boolean()) {
    if (*t == false) {
      thinking_off = true;
      out["reasoning_format"] = "none";
    } else {
      out["reasoning_format"] = "deepseek";
    }
  } else if (*t == "low" || *t == "medium" || *t == "high") {
    out["reasoning_effort"] = *t;
    out["reasoning_format"] = "deepseek";
  } else {
    return Bad("think", "'think' must be a boolean or one of low, medium, high");
  }
  return std::nullopt;
}

std::optional<ApiError> TranslateOllamaMessages(const ojson& msgs, ojson& out, Renames& renames) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& m = msgs[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Bad(p, p + " must be an object");
    OReader r(m);
    std::string role, content, thinking, tool_name;
    r.String("role", role);
    r.String("content", content);
    r.String("thinking", thinking);
    r.String("tool_name", tool_name);
    if (const ojson* im = r.Get("images"); im && !(im->is_array() && im->empty())) {
      return Bad(p + ".images", "images are not supported: this server serves text models");
    }
    ojson msg = {{"role", role}, {"content", content}};
    if (const ojson* tc = r.Get("tool_calls"); tc && !(tc->is_array() && tc->empty())) {
      if (!tc->is_array()) return Bad(p + ".tool_calls", p + ".tool_calls must be an array");
      ojson calls = ojson::array();
      for (size_t k = 0; k < tc->size(); ++k) {
        const ojson& c = (*tc)[k];
        const std::string cp = p + ".tool_calls[" + std::to_string(k) + "]";
        const ojson* fn = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
        if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
          return Bad(cp, cp + " must be {\"function\": {\"name\": ..., \"arguments\": {...}}}");
        }
        ojson call = {{"type", "function"}, {"function", {{"name", (*fn)["name"]}}}};
        if (c.contains("id") && c["id"].is_string()) call["id"] = c["id"];
        if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
          if (!a->is_object()) return Bad(cp + ".function.arguments", cp + ".function.arguments must be an object");
          call["function"]["arguments"] = Dump(*a);
        } else {
          call["function"]["arguments"] = "{}";
        }
        calls.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(calls);
    }
    std::string tool_call_id;
    r.String("tool_call_id", tool_call_id);
    if (!tool_call_id.empty()) msg["tool_call_id"] = tool_call_id;
    if (!thinking.empty()) msg["reasoning_content"] = thinking;
    if (!tool_name.empty()) msg["name"] = tool_name;
    r.RefuseUnread(p + ".");
    if (!r.ok()) return r.error();
    renames.emplace_back("messages[" + std::to_string(out.size()) + "]", p);
    out.push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadOllamaTools(OReader& r, ojson& out) {
  const ojson* tools = r.Get("tools");
  if (!tools) return std::nullopt;
  // Ollama's tools are OpenAI's: {"type": "function", "function": {name, description, parameters}}.
  if (!tools->is_array()) return Bad("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return Bad(p, p + " must be an object");
    OReader tr(t);
    tr.Get("type");
    const ojson* fn = tr.Get("function");
    tr.RefuseUnread(p + ".");
    if (!tr.ok()) return tr.error();
    if (fn && fn->is_object()) {
      OReader fr(*fn);
      for (const char* k : {"name", "description", "parameters", "strict"}) fr.Get(k);
      fr.RefuseUnread(p + ".function.");
      if (!fr.ok()) return fr.error();
    }
  }
  out["tools"] = *tools;
  return std::nullopt;
}

}  // namespace

Parsed<OllamaRequest> ParseOllamaChat(std::string_view body, const ApiLimits& limits) {
  return Guard<OllamaRequest>([&]() -> Parsed<OllamaRequest> {
    ojson j;
    if (auto e = ParseOrdered(body, limits.json, j)) return *e;
    OReader r(j);
    OllamaRequest req;
    if (auto e = ReadOllamaModel(r, limits, req.model)) return *e;
    ojson out = ojson::object();
    Renames renames;
    const ojson* msgs = r.Get("messages");
    if (msgs && !msgs->is_array()) return Bad("messages", "'messages' must be an array");
    ojson list = ojson::array();
    if (msgs) {
      if (auto e = TranslateOllamaMessages(*msgs, list, renames)) return *e;
    }
    req.load_only = list.empty();
    if (req.load_only) list.push_back({{"role", "user"}, {"content", ""}});  // checked like any
    out["messages"] = std::move(list);
    if (auto e = ReadOllamaTools(r, out)) return *e;
    if (auto e = ReadOllamaFormat(r, out, renames)) return *e;
    if (auto e = ReadOllamaOptions(r, limits, out, renames, req.num_ctx)) return *e;
    bool thinking_off = false;
    if (auto e = ReadOllamaThink(r, out, thinking_off)) return *e;
    bool stream = true;  // Ollama streams unless told not to
    r.Bool("stream", stream);
    out["stream"] = stream;
    r.Get("keep_alive");  // the model stays loaded while the server runs
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    auto chat = ChatFromOpenAi(out, limits, renames);
    if (!chat.ok()) return chat.error();
    req.chat = std::move(*chat);
    req.chat.thinking_off = thinking_off;
    return req;
  });
}

Parsed<OllamaRequest> ParseOllamaGenerate(std::string_view body, const ApiLimits& limits) {
  return Guard<OllamaRequest>([&]() -> Parsed<OllamaRequest> {
    ojson j;
    if (auto e = ParseOrdered(body, limits.json, j)) return *e;
    OReader r(j);
    OllamaRequest req;
    req.generate = true;
    if (auto e = ReadOllamaModel(r, limits, req.model)) return *e;
    std::string prompt, system;
    bool raw = false;
    r.String("prompt", prompt);
    r.String("system", system);
    r.Bool("raw", raw);
    for (const char* key : {"suffix", "template"}) {
      if (const ojson* v = r.Get(key); v && !(v->is_string() && v->get_ref<const std::string&>().empty())) {
        return Bad(key, std::string("'") + key + "' is not supported (the model's own chat template is used)");
      }
    }
    if (const ojson* v = r.Get("context"); v && !(v->is_array() && v->empty())) {
      return Bad("context", "'context' (the tokens of an earlier answer) is not supported: send the conversation to /api/chat");
    }
    if (const ojson* v = r.Get("images"); v && !(v->is_array() && v->empty())) {
      return Bad("images", "images are not supported: this server serves text models");
    }
    if (raw && !system.empty()) return Bad("system", "'system' with 'raw': a raw prompt is sent as it is");
    ojson out = ojson::object();
    Renames renames;
    if (auto e = ReadOllamaFormat(r, out, renames)) return *e;
    if (auto e = ReadOllamaOptions(r, limits, out, renames, req.num_ctx)) return *e;
    bool stream = true;
    r.Bool("stream", stream);
    out["stream"] = stream;
    r.Get("keep_alive");
    bool thinking_off = false;
    if (!raw) {
      if (auto e = ReadOllamaThink(r, out, thinking_off)) return *e;
    }
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    req.load_only = prompt.empty() && system.empty();
    if (raw) {
      out["prompt"] = prompt.empty() ? " " : prompt;  // load_only answers before it is used
      renames.emplace_back("prompt", "prompt");
      auto c = ParseCompletionRequest(Dump(out), limits);
      if (!c.ok()) return Rename(c.error(), renames);
      req.raw = std::move(*c);
      return req;
    }
    ojson msgs = ojson::array();
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    out["messages"] = std::move(msgs);
    renames.emplace_back("messages", "prompt");
    auto chat = ChatFromOpenAi(out, limits, renames);
    if (!chat.ok()) return chat.error();
    req.chat = std::move(*chat);
    req.chat.thinking_off = thinking_off;
    return req;
  });
}

Parsed<std::string> ParseOllamaShow(std::string_view body, const ApiLimits& limits) {
  return Guard<std::string>([&]() -> Parsed<std::string> {
    ojson j;
    if (auto e = ParseOrdered(body, limits.json, j)) return *e;
    OReader r(j);
    std::string model;
    if (!r.Get("model") && r.Get("name")) {  // the older name of the field
      r.String("name", model);
      j["model"] = model;
    }
    OReader r2(j);
    r2.Get("name");
    if (auto e = ReadOllamaModel(r2, limits, model)) return *e;
    r2.Get("verbose");
    r2.RefuseUnread();
    if (!r2.ok()) return r2.error();
    return model;
  });
}

http::HttpResponse OllamaErrorResponse(const ApiError& e) {
  http::HttpResponse r;
  r.status = e.status;
  r.body = Dump(json{{"error", e.message}});
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string OllamaName(const std::string& model_id) {
  return model_id.find(':') == std::string::npos ? model_id + ":latest" : model_id;
}

std::string OllamaTime(std::chrono::system_clock::time_point t) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ns % 1'000'000'000);
}

// ---- the answer ----------------------------------------------------------------------

OllamaWriter::OllamaWriter(std::string model, bool generate)
    : model_(std::move(model)), generate_(generate), start_(std::chrono::steady_clock::now()), first_(start_) {}

std::string OllamaWriter::Line(const std::string& content, const std::string& thinking, const std::string* calls,
                               bool done, const AnswerEnd* end) {
  json j = {{"model", model_}, {"created_at", OllamaTime(std::chrono::system_clock::now())}};
  if (generate_) {
    j["response"] = content;
    if (!thinking.empty()) j["thinking"] = thinking;
  } else {
    json msg = {{"role", "assistant"}, {"content", content}};
    if (!thinking.empty()) msg["thinking"] = thinking;
    if (calls) msg["tool_calls"] = json::parse(*calls);
    j["message"] = std::move(msg);
  }
  j["done"] = done;
  if (end) {
    const auto now = std::chrono::steady_clock::now();
    const auto ns = [](auto d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
    const Usage& u = end->usage;
    j["done_reason"] = end->finish_reason == "length" ? "length" : "stop";
    j["total_duration"] = ns(now - start_);
    j["load_duration"] = 0;
    j["prompt_eval_count"] = u.prompt_tokens - u.cached_tokens;  // what was computed (Ollama's count)
    j["prompt_eval_duration"] = ns((any_ ? first_ : now) - start_);
    j["eval_count"] = u.completion_tokens;
    j["eval_duration"] = ns(now - (any_ ? first_ : now));
    // Trellis's receipt (docs/store.md "Receipt"), as a field of its own: Ollama has no usage object.
    json usage = json::object();
    AddCacheReceipt(u, usage);
    if (usage.contains("cache")) j["cache"] = std::move(usage["cache"]);
  }
  return Dump(j) + "\n";
}

namespace {
std::string OllamaCalls(const std::vector<ToolCallOut>& calls) {
  json list = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json args = json::parse(calls[i].arguments, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) args = json::object();
    list.push_back({{"function", {{"index", i}, {"name", calls[i].name}, {"arguments", std::move(args)}}}});
  }
  return Dump(list);
}
}  // namespace

http::HttpResponse OllamaWriter::Whole(const WholeAnswer& a) {
  if (!a.text.empty() || !a.reasoning.empty()) {
    if (!any_) first_ = std::chrono::steady_clock::now();
    any_ = true;
  }
  const std::string calls = OllamaCalls(a.tool_calls);
  http::HttpResponse r;
  r.body = Line(a.text, a.reasoning, a.tool_calls.empty() ? nullptr : &calls, true, &a.end);
  r.body.pop_back();  // no line end on a whole body
  return r;
}

std::string OllamaWriter::Delta(AnswerDelta& d) {
  if (!any_) first_ = std::chrono::steady_clock::now();
  any_ = true;
  for (ToolCallOut& c : d.calls) {
    if (c.first) calls_.push_back({c.name, ""});
    if (!calls_.empty()) calls_.back().arguments += c.arguments;
  }
  if (d.content.empty() && d.reasoning.empty()) return {};
  return Line(d.content, d.reasoning, nullptr, false, nullptr);
}

std::string OllamaWriter::Close(const AnswerEnd& e) {
  std::string out;
  if (!calls_.empty()) {
    std::vector<ToolCallOut> calls;
    for (Call& c : calls_) calls.push_back({"", c.name, c.arguments});
    const std::string list = OllamaCalls(calls);
    out += Line("", "", &list, false, nullptr);
  }
  return out + Line("", "", nullptr, true, &e);
}

std::string OllamaWriter::Failed(const ApiError& e) { return Dump(json{{"error", e.message}}) + "\n"; }

}  // namespace trellis::server

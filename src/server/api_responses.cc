// OpenAI's Responses API (/v1/responses) onto the chat request: input as a string or
// items (messages, function_call, function_call_output, reasoning), instructions,
// function tools, tool_choice, text.format, previous_response_id; answers as a response
// object or the Responses event stream. docs/server.md, "OpenAI Responses".
#include <nlohmann/json.hpp>

#include "server/api_reader.h"
#include "server/dialects.h"
#include "util/base64.h"

namespace trellis::server {

using namespace api_detail;

namespace {

constexpr size_t kMaxResponseIdBytes = 128;

// input items -> chat messages. function_call items join the assistant message before
// them (or start one); reasoning items give the next assistant message its
// reasoning_content.
std::optional<ApiError> TranslateResponsesInput(const ojson& input, ojson& out, Renames& renames) {
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input}});
    renames.emplace_back("messages[0]", "input");
    return std::nullopt;
  }
  if (!input.is_array() || input.empty()) return Bad("input", "'input' must be a string or a non-empty array of items");
  std::string reasoning;
  auto assistant = [&]() -> ojson& {
    if (out.empty() || out.back()["role"] != "assistant" || out.back().contains("tool_call_id")) {
      out.push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    if (!reasoning.empty()) {
      out.back()["reasoning_content"] = reasoning;
      reasoning.clear();
    }
    return out.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return Bad(p, p + " must be an object");
    OReader r(item);
    std::string type = "message";
    r.String("type", type);
    r.Get("id");      // ids of earlier output items: identity only
    r.Get("status");  // "completed" etc.: nothing to do with the prompt
    const std::string at = "messages[" + std::to_string(out.size()) + "]";
    if (type == "message") {
      std::string role;
      r.String("role", role);
      if (r.ok() && role != "user" && role != "assistant" && role != "system" && role != "developer") {
        return Bad(p + ".role", p + ".role must be user, assistant, system or developer");
      }
      const ojson* c = r.Get("content");
      if (r.ok() && !c) return Bad(p + ".content", p + " needs 'content'");
      std::string text;
      if (c) {
        auto t = TextParts(*c, {"input_text", "output_text", "text"});
        if (!t.ok()) return Bad(p + ".content", p + ".content: " + t.status().message());
        text = *t;
      }
      r.RefuseUnread(p + ".");
      if (!r.ok()) return r.error();
      renames.emplace_back(at, p);
      if (role == "assistant") {
        ojson& m = assistant();
        if (m["content"].is_null()) {
          m["content"] = text;
        } else {
          m["content"] = m["content"].get<std::string>() + text;
        }
      } else {
        out.push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      r.String("call_id", call_id);
      r.String("name", name);
      r.String("arguments", arguments);
      r.RefuseUnread(p + ".");
      if (!r.ok()) return r.error();
      if (call_id.empty() || name.empty()) return Bad(p, p + " (function_call) needs 'call_id', 'name' and 'arguments'");
      ojson& m = assistant();
      renames.emplace_back("messages[" + std::to_string(out.size() - 1) + "]", p);
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}});
    } else if (type == "function_call_output") {
      std::string call_id;
      r.String("call_id", call_id);
      const ojson* o = r.Get("output");
      r.RefuseUnread(p + ".");
      if (!r.ok()) return r.error();
      if (call_id.empty() || !o) return Bad(p, p + " (function_call_output) needs 'call_id' and 'output'");
      auto t = TextParts(*o, {"input_text", "output_text", "text"});
      if (!t.ok()) return Bad(p + ".output", p + ".output: " + t.status().message());
      renames.emplace_back(at, p);
      out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", *t}});
    } else if (type == "reasoning") {
      // Reasoning we wrote: its text (content), or encrypted_content (ours is base64 of it).
      r.Get("summary");
      std::string text;
      if (const ojson* c = r.Get("content")) {
        auto t = TextParts(*c, {"reasoning_text"});
        if (!t.ok()) return Bad(p + ".content", p + ".content: " + t.status().message());
        text = *t;
      }
      if (const ojson* e = r.Get("encrypted_content"); e && text.empty()) {
        std::optional<std::string> plain = e->is_string() ? Base64Decode(e->get<std::string>()) : std::nullopt;
        if (!plain) return Bad(p + ".encrypted_content", p + ".encrypted_content is not one this server wrote");
        text = *plain;
      }
      r.RefuseUnread(p + ".");
      if (!r.ok()) return r.error();
      reasoning += text;
    } else {
      return Bad(p + ".type", "input items of type '" + Clip(type) +
                                  "' are not supported (message, function_call, function_call_output, reasoning)");
    }
  }
  return std::nullopt;
}

}  // namespace

Parsed<ResponsesRequest> ParseResponsesRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<ResponsesRequest>([&]() -> Parsed<ResponsesRequest> {
    ojson j;
    if (auto e = ParseOrdered(body, limits.json, j)) return *e;
    OReader r(j);
    ResponsesRequest req;
    ojson rest = ojson::object();
    if (const ojson* m = r.Get("model")) rest["model"] = *m;
    const ojson* input = r.Get("input");
    if (r.ok() && !input) return Bad("input", "'input' is required");
    Renames renames;  // checked again in ResponsesChat, with the history's offsets
    ojson msgs = ojson::array();
    if (input) {
      if (auto e = TranslateResponsesInput(*input, msgs, renames)) return *e;
    }
    req.input_messages = Dump(msgs);
    r.String("instructions", req.instructions);
    r.String("previous_response_id", req.previous_response_id);
    if (req.previous_response_id.size() > kMaxResponseIdBytes) {
      return Bad("previous_response_id", "'previous_response_id' is not an id this server gave", "previous_response_not_found");
    }
    r.Bool("store", req.store);
    if (const ojson* tools = r.Get("tools")) {
      if (!tools->is_array()) return Bad("tools", "'tools' must be an array");
      ojson list = ojson::array();
      for (size_t i = 0; i < tools->size(); ++i) {
        const ojson& t = (*tools)[i];
        const std::string p = "tools[" + std::to_string(i) + "]";
        if (!t.is_object()) return Bad(p, p + " must be an object");
        OReader tr(t);
        std::string type;
        tr.String("type", type);
        if (tr.ok() && type != "function") {
          return Bad(p + ".type", "built-in tools ('" + Clip(type) + "') are not supported: only function tools");
        }
        ojson fn = ojson::object();
        for (const char* k : {"name", "description", "parameters", "strict"}) {
          if (const ojson* v = tr.Get(k)) fn[k] = *v;
        }
        tr.RefuseUnread(p + ".");
        if (!tr.ok()) return tr.error();
        list.push_back({{"type", "function"}, {"function", std::move(fn)}});
      }
      rest["tools"] = std::move(list);
      req.tools_json = Dump(*tools);
    }
    if (const ojson* tc = r.Get("tool_choice")) {
      if (tc->is_string()) {
        rest["tool_choice"] = *tc;
      } else if (tc->is_object() && tc->value("type", "") == "function" && tc->contains("name")) {
        for (auto it = tc->begin(); it != tc->end(); ++it) {
          if (it.key() != "type" && it.key() != "name") {
            return Bad("tool_choice." + Clip(it.key()), "unknown field 'tool_choice." + Clip(it.key()) + "'", "unknown_parameter");
          }
        }
        rest["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
      } else {
        return Bad("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...} "
                                  "and nothing else (hosted and allowed_tools choices are not supported)");
      }
      req.tool_choice_json = Dump(*tc);
    }
    if (const ojson* text = r.Get("text")) {
      if (!text->is_object()) return Bad("text", "'text' must be an object");
      OReader xr(*text);
      if (const ojson* f = xr.Get("format")) {
        if (!f->is_object()) return Bad("text.format", "'text.format' must be an object");
        OReader fr(*f);
        std::string type;
        fr.String("type", type);
        if (type == "json_schema") {
          ojson js = ojson::object();
          for (const char* k : {"name", "schema", "strict", "description"}) {
            if (const ojson* v = fr.Get(k)) js[k] = *v;
          }
          rest["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
        } else if (type == "json_object" || type == "text") {
          rest["response_format"] = {{"type", type}};
        } else if (fr.ok()) {
          return Bad("text.format.type", "'text.format.type' must be text, json_object or json_schema");
        }
        fr.RefuseUnread("text.format.");
        if (!fr.ok()) return fr.error();
      }
      if (const ojson* v = xr.Get("verbosity"); v && *v != "medium") {
        return Bad("text.verbosity", "'text.verbosity' other than medium is not supported");
      }
      xr.RefuseUnread("text.");
      if (!xr.ok()) return xr.error();
      req.text_json = Dump(*text);
    }
    if (const ojson* v = r.Get("max_output_tokens")) {
      rest["max_completion_tokens"] = *v;
      if (v->is_number_integer()) req.max_output_tokens = v->get<int>();
    }
    for (const char* key : {"temperature", "top_p"}) {
      if (const ojson* v = r.Get(key)) rest[key] = *v;
    }
    if (const ojson* v = r.Get("parallel_tool_calls")) {
      rest["parallel_tool_calls"] = *v;
      if (v->is_boolean()) req.parallel_tool_calls = v->get<bool>();
    }
    if (const ojson* v = r.Get("stream")) rest["stream"] = *v;
    if (const ojson* so = r.Get("stream_options")) {
      // include_obfuscation: padding against length side channels; these events carry none.
      if (!so->is_object() || (so->size() > 0 && !(so->size() == 1 && so->contains("include_obfuscation")))) {
        return Bad("stream_options", "'stream_options' may hold only include_obfuscation");
      }
    }
    if (const ojson* rs = r.Get("reasoning")) {
      if (!rs->is_object()) return Bad("reasoning", "'reasoning' must be an object");
      OReader rr(*rs);
      if (const ojson* e = rr.Get("effort")) rest["reasoning_effort"] = *e;
      rr.Get("summary");  // the reasoning comes back whole (reasoning_text), not summarized
      rr.Get("generate_summary");
      rr.RefuseUnread("reasoning.");
      if (!rr.ok()) return rr.error();
      req.reasoning_json = Dump(*rs);
    }
    if (const ojson* inc = r.Get("include")) {
      if (!inc->is_array()) return Bad("include", "'include' must be an array");
      for (const ojson& x : *inc) {
        if (x == "reasoning.encrypted_content") {
          req.encrypted_reasoning = true;
        } else {
          return Bad("include", "'include' may only hold reasoning.encrypted_content, got " + Describe(x));
        }
      }
    }
    if (const ojson* t = r.Get("truncation"); t && *t != "disabled") {
      return Bad("truncation", "'truncation' must be \"disabled\": a conversation over the context is refused, not cut");
    }
    if (const ojson* v = r.Get("top_logprobs"); v && !(v->is_number_integer() && v->get<int64_t>() == 0)) {
      return Bad("top_logprobs", "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions)");
    }
    if (const ojson* b = r.Get("background"); b && *b != false) {
      return Bad("background", "'background' responses are not supported");
    }
    for (const char* key : {"conversation", "prompt", "max_tool_calls"}) {
      if (r.Get(key)) return Bad(key, std::string("'") + key + "' is not supported by this server");
    }
    if (const ojson* md = r.Get("metadata")) {
      if (!md->is_object() || md->size() > 16 ||
          std::any_of(md->begin(), md->end(), [](const ojson& v) { return !v.is_string() || v.get_ref<const std::string&>().size() > 512; })) {
        return Bad("metadata", "'metadata' must be an object of at most 16 strings of at most 512 bytes");
      }
      req.metadata_json = Dump(*md);
    }
    for (const char* key : {"user", "safety_identifier", "prompt_cache_key", "service_tier", "prompt_cache_retention"}) {
      r.Get(key);  // identity and routing: nothing the answer holds
    }
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    req.chat_rest = Dump(rest);
    // The chat fields are checked here already (ResponsesChat runs the same check with the
    // history): a bad tool schema is a 400 before any lookup.
    std::string ignored;
    auto chat = ResponsesChat(req, "", limits, &ignored);
    if (!chat.ok()) return chat.error();
    req.temperature = chat->gen.temperature;  // echoed as used: the server's defaults where absent
    req.top_p = chat->gen.top_p;
    return req;
  });
}

Parsed<ChatCompletionRequest> ResponsesChat(const ResponsesRequest& r, std::string_view history, const ApiLimits& limits,
                                            std::string* conversation) {
  return Guard<ChatCompletionRequest>([&]() -> Parsed<ChatCompletionRequest> {
    ojson body = ojson::parse(r.chat_rest);
    ojson past = history.empty() ? ojson::array() : ojson::parse(history);
    ojson input = ojson::parse(r.input_messages);
    ojson msgs = ojson::array();
    if (!r.instructions.empty()) msgs.push_back({{"role", "system"}, {"content", r.instructions}});
    const size_t first_input = msgs.size() + past.size();
    ojson conv = ojson::array();
    for (ojson& m : past) conv.push_back(m), msgs.push_back(std::move(m));
    for (ojson& m : input) conv.push_back(m), msgs.push_back(std::move(m));
    *conversation = Dump(conv);
    // Every function_call_output answers a call made earlier in the conversation.
    std::vector<std::string> calls;
    for (size_t k = 0; k < msgs.size(); ++k) {
      const ojson& m = msgs[k];
      if (m.contains("tool_calls")) {
        for (const ojson& c : m["tool_calls"]) calls.push_back(c.value("id", ""));
      }
      const bool unknown_past = history.empty() && !r.previous_response_id.empty();  // the pre-check, before the lookup
      if (!unknown_past && m.value("role", "") == "tool" &&
          std::find(calls.begin(), calls.end(), m.value("tool_call_id", "")) == calls.end()) {
        const std::string p = k >= first_input ? "input[" + std::to_string(k - first_input) + "]" : "previous_response_id";
        return Bad(p, "No tool call found for function call output with call_id '" + Clip(m.value("tool_call_id", "")) + "'");
      }
    }
    body["messages"] = std::move(msgs);
    Renames renames;
    for (size_t k = first_input; k < body["messages"].size(); ++k) {
      renames.emplace_back("messages[" + std::to_string(k) + "]", "input[" + std::to_string(k - first_input) + "]");
    }
    renames.emplace_back("messages", "input");
    renames.emplace_back("max_completion_tokens", "max_output_tokens");
    renames.emplace_back("response_format", "text.format");
    renames.emplace_back("reasoning_effort", "reasoning.effort");
    const size_t n_tools = body.contains("tools") && body["tools"].is_array() ? body["tools"].size() : 0;
    for (size_t i = 0; i < n_tools; ++i) {  // tools[i].function.x -> tools[i].x
      const std::string p = "tools[" + std::to_string(i) + "]";
      renames.emplace_back(p + ".function", p);
    }
    return ChatFromOpenAi(body, limits, renames);
  });
}

// ---- the answer ------------------------------------------------------------------------

struct ResponsesWriter::Impl {
  std::string id, model;
  int64_t created;
  const ResponsesRequest* req;  // valid while the request is served
  std::string instructions, previous, tools, tool_choice, text, reasoning_cfg, metadata;
  std::optional<int> max_output_tokens;
  float temperature, top_p;
  bool parallel, store, encrypted;
  std::function<void(const std::string&, const std::string&)> on_done;
  uint64_t seq = 0;
  uint64_t next_item = 0;

  // Output items as they form.
  struct Item {
    std::string type;  // reasoning, message, function_call
    std::string id;
    std::string text;  // reasoning / message text, or the call's arguments
    std::string call_id, name;
    size_t call = SIZE_MAX;  // ToolCallOut index
    bool open = true;
  };
  std::vector<Item> items;

  std::string ItemId(const char* prefix) { return prefix + fmt(next_item++); }
  std::string fmt(uint64_t n) const { return id.substr(5) + "_" + std::to_string(n); }

  json ItemJson(const Item& it) const {
    const char* status = it.open ? "in_progress" : "completed";
    if (it.type == "reasoning") {
      json j = {{"type", "reasoning"}, {"id", it.id}, {"summary", json::array()}};
      j["content"] = json::array({{{"type", "reasoning_text"}, {"text", it.text}}});
      if (encrypted) j["encrypted_content"] = Base64Encode(it.text);  // not encrypted: opaque, and it round-trips
      return j;
    }
    if (it.type == "message") {
      json content = json::array();
      if (!it.open || !it.text.empty()) {
        content.push_back({{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()}, {"logprobs", json::array()}});
      }
      return {{"type", "message"}, {"id", it.id}, {"status", status}, {"role", "assistant"}, {"content", content}};
    }
    return {{"type", "function_call"}, {"id", it.id},       {"call_id", it.call_id},
            {"name", it.name},         {"arguments", it.text}, {"status", status}};
  }

  json Response(const char* status, const AnswerEnd* end) const {
    json output = json::array();
    for (const Item& it : items) output.push_back(ItemJson(it));
    json j = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", nullptr},
              {"instructions", instructions.empty() ? json(nullptr) : json(instructions)},
              {"max_output_tokens", max_output_tokens ? json(*max_output_tokens) : json(nullptr)},
              {"model", model},
              {"output", std::move(output)},
              {"parallel_tool_calls", parallel},
              {"previous_response_id", previous.empty() ? json(nullptr) : json(previous)},
              {"reasoning", json::parse(reasoning_cfg)},
              {"store", store},
              {"temperature", temperature},
              {"text", json::parse(text)},
              {"tool_choice", json::parse(tool_choice)},
              {"tools", json::parse(tools)},
              {"top_p", top_p},
              {"truncation", "disabled"},
              {"usage", nullptr},
              {"metadata", json::parse(metadata)}};
    if (end) {
      if (end->finish_reason == "length") {
        j["status"] = "incomplete";
        j["incomplete_details"] = {{"reason", "max_output_tokens"}};
      }
      const Usage& u = end->usage;
      int reasoning_tokens = 0;  // not counted apart: the answer's tokens are one count
      j["usage"] = {{"input_tokens", u.prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                    {"output_tokens", u.completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                    {"total_tokens", u.prompt_tokens + u.completion_tokens}};
      AddCacheReceipt(u, j["usage"]);
    }
    return j;
  }

  std::string Event(const char* type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq++;
    return std::string("event: ") + type + "\ndata: " + Dump(data) + "\n\n";
  }

  // Closes the open item (its .done events).
  std::string CloseOpen() {
    std::string out;
    if (items.empty() || !items.back().open) return out;
    Item& it = items.back();
    it.open = false;
    const size_t index = items.size() - 1;
    if (it.type == "message") {
      out += Event("response.output_text.done",
                   {{"item_id", it.id}, {"output_index", index}, {"content_index", 0}, {"text", it.text}, {"logprobs", json::array()}});
      out += Event("response.content_part.done",
                   {{"item_id", it.id}, {"output_index", index}, {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()}}}});
    } else if (it.type == "reasoning") {
      out += Event("response.reasoning_text.done", {{"item_id", it.id}, {"output_index", index}, {"content_index", 0}, {"text", it.text}});
    } else {
      out += Event("response.function_call_arguments.done", {{"item_id", it.id}, {"output_index", index}, {"arguments", it.text}});
    }
    out += Event("response.output_item.done", {{"output_index", index}, {"item", ItemJson(it)}});
    return out;
  }

  std::string Begin(Item it) {
    std::string out = CloseOpen();
    items.push_back(std::move(it));
    const size_t index = items.size() - 1;
    out += Event("response.output_item.added", {{"output_index", index}, {"item", ItemJson(items.back())}});
    if (items.back().type == "message") {
      out += Event("response.content_part.added", {{"item_id", items.back().id}, {"output_index", index}, {"content_index", 0},
                                                   {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    }
    return out;
  }

  // The answer as a chat message, for the conversation kept with it.
  std::string AnswerMessage() const {
    ojson m = {{"role", "assistant"}};
    std::string text, reasoning;
    ojson calls = ojson::array();
    for (const Item& it : items) {
      if (it.type == "message") text += it.text;
      if (it.type == "reasoning") reasoning += it.text;
      if (it.type == "function_call") {
        calls.push_back({{"id", it.call_id}, {"type", "function"}, {"function", {{"name", it.name}, {"arguments", it.text}}}});
      }
    }
    m["content"] = calls.empty() || !text.empty() ? ojson(text) : ojson(nullptr);
    if (!calls.empty()) m["tool_calls"] = std::move(calls);
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    return Dump(m);
  }
};

ResponsesWriter::ResponsesWriter(std::string id, int64_t created, std::string model, const ResponsesRequest& req,
                                 std::function<void(const std::string&, const std::string&)> on_done)
    : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  m.id = std::move(id);
  m.model = std::move(model);
  m.created = created;
  m.instructions = req.instructions;
  m.previous = req.previous_response_id;
  m.tools = req.tools_json;
  m.tool_choice = req.tool_choice_json;
  m.text = req.text_json;
  m.reasoning_cfg = req.reasoning_json;
  m.metadata = req.metadata_json;
  m.max_output_tokens = req.max_output_tokens;
  m.temperature = req.temperature;
  m.top_p = req.top_p;
  m.parallel = req.parallel_tool_calls;
  m.store = req.store;
  m.encrypted = req.encrypted_reasoning;
  m.on_done = std::move(on_done);
}

http::HttpResponse ResponsesWriter::Whole(const WholeAnswer& a) {
  Impl& m = *impl_;
  if (!a.reasoning.empty()) m.items.push_back({"reasoning", m.ItemId("rs_"), a.reasoning, "", "", SIZE_MAX, false});
  if (!a.text.empty() || a.tool_calls.empty()) m.items.push_back({"message", m.ItemId("msg_"), a.text, "", "", SIZE_MAX, false});
  for (const ToolCallOut& c : a.tool_calls) m.items.push_back({"function_call", m.ItemId("fc_"), c.arguments, c.id, c.name, SIZE_MAX, false});
  const std::string body = Dump(m.Response("completed", &a.end));
  if (m.on_done) m.on_done(body, m.AnswerMessage());
  http::HttpResponse r;
  r.body = body;
  return r;
}

std::string ResponsesWriter::Open() {
  Impl& m = *impl_;
  json resp = m.Response("in_progress", nullptr);
  std::string out = m.Event("response.created", {{"response", resp}});
  out += m.Event("response.in_progress", {{"response", resp}});
  return out;
}

std::string ResponsesWriter::Delta(AnswerDelta& d) {
  Impl& m = *impl_;
  std::string out;
  auto open_is = [&](const char* type) { return !m.items.empty() && m.items.back().open && m.items.back().type == type; };
  if (!d.reasoning.empty()) {
    if (!open_is("reasoning")) out += m.Begin({"reasoning", m.ItemId("rs_"), "", "", "", SIZE_MAX, true});
    m.items.back().text += d.reasoning;
    out += m.Event("response.reasoning_text.delta", {{"item_id", m.items.back().id}, {"output_index", m.items.size() - 1},
                                                     {"content_index", 0}, {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (!open_is("message")) out += m.Begin({"message", m.ItemId("msg_"), "", "", "", SIZE_MAX, true});
    m.items.back().text += d.content;
    out += m.Event("response.output_text.delta", {{"item_id", m.items.back().id}, {"output_index", m.items.size() - 1},
                                                  {"content_index", 0}, {"delta", d.content}, {"logprobs", json::array()}});
  }
  for (ToolCallOut& c : d.calls) {
    if (c.first) out += m.Begin({"function_call", m.ItemId("fc_"), "", c.id, c.name, c.index, true});
    if (!open_is("function_call") || c.arguments.empty()) continue;
    m.items.back().text += c.arguments;
    out += m.Event("response.function_call_arguments.delta",
                   {{"item_id", m.items.back().id}, {"output_index", m.items.size() - 1}, {"delta", c.arguments}});
  }
  return out;
}

std::string ResponsesWriter::Close(const AnswerEnd& e) {
  Impl& m = *impl_;
  std::string out;
  // An answer with no text and no call still has its (empty) message, as the whole answer does.
  if (std::none_of(m.items.begin(), m.items.end(), [](const Impl::Item& it) { return it.type != "reasoning"; })) {
    out += m.Begin({"message", m.ItemId("msg_"), "", "", "", SIZE_MAX, true});
  }
  out += m.CloseOpen();
  json resp = m.Response("completed", &e);
  const bool complete = resp["status"] == "completed";
  if (m.on_done) m.on_done(Dump(resp), m.AnswerMessage());
  out += m.Event(complete ? "response.completed" : "response.incomplete", {{"response", std::move(resp)}});
  return out;
}

std::string ResponsesWriter::Failed(const ApiError& e) {
  Impl& m = *impl_;
  json resp = m.Response("failed", nullptr);
  resp["error"] = {{"code", e.status == 503 ? "server_is_overloaded" : "server_error"}, {"message", e.message}};
  return m.Event("response.failed", {{"response", std::move(resp)}});
}

}  // namespace trellis::server

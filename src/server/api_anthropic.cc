// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) onto the chat
// request: system, messages with text, tool_use, tool_result and thinking blocks, tools
// and tool_choice, stop_sequences; answers as a message object or Anthropic's event
// stream. docs/server.md, "Anthropic Messages".
#include <nlohmann/json.hpp>

#include "server/api_reader.h"
#include "server/dialects.h"

namespace trellis::server {

using namespace api_detail;

namespace {

// Anthropic's message: tool_result blocks become tool messages (first, as the API orders
// them), the rest of a user turn one user message; an assistant turn's text, tool_use
// blocks (tool_calls) and thinking (reasoning_content) one assistant message.
std::optional<ApiError> TranslateAnthropicMessage(const ojson& m, size_t i, ojson& out, Renames& renames) {
  const std::string param = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return Bad(param, param + " must be an object");
  for (auto it = m.begin(); it != m.end(); ++it) {
    if (it.key() != "role" && it.key() != "content") return Bad(param + "." + Clip(it.key()), "unknown field '" + Clip(it.key()) + "' in " + param);
  }
  auto role = m.find("role");
  if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant")) {
    return Bad(param + ".role", param + ".role must be \"user\" or \"assistant\"");
  }
  const bool user = *role == "user";
  auto content = m.find("content");
  if (content == m.end() || (!content->is_string() && !content->is_array())) {
    return Bad(param + ".content", param + ".content must be a string or an array of content blocks");
  }
  auto add = [&](ojson msg) {
    renames.emplace_back("messages[" + std::to_string(out.size()) + "]", param);
    out.push_back(std::move(msg));
  };
  if (content->is_string()) {
    add(ojson{{"role", *role}, {"content", *content}});
    return std::nullopt;
  }
  std::string text, thinking;
  ojson calls = ojson::array();
  for (size_t k = 0; k < content->size(); ++k) {
    const ojson& b = (*content)[k];
    const std::string bp = param + ".content[" + std::to_string(k) + "]";
    if (!b.is_object()) return Bad(bp, bp + " must be a content block object");
    auto type = b.find("type");
    if (type == b.end() || !type->is_string()) return Bad(bp + ".type", bp + " needs a string 'type'");
    const std::string& t = type->get_ref<const std::string&>();
    OReader br(b);
    br.Get("type");
    br.Get("cache_control");  // prompt caching is automatic here: every prefix is cached
    if (t == "text") {
      std::string s;
      if (!br.Get("text")) return Bad(bp + ".text", bp + " needs a string 'text'");
      br.String("text", s);
      br.Get("citations");
      text += s;
    } else if (t == "tool_use" && !user) {
      std::string id, name;
      br.String("id", id);
      br.String("name", name);
      const ojson* input = br.Get("input");
      if (br.ok() && (id.empty() || name.empty() || !input || !input->is_object())) {
        return Bad(bp, bp + " (tool_use) needs a string 'id', a string 'name' and an object 'input'");
      }
      if (br.ok()) {
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", Dump(*input)}}}});
      }
    } else if (t == "thinking" && !user) {
      std::string s;
      br.String("thinking", s);
      br.Get("signature");  // ours are empty; theirs mean nothing here
      thinking += s;
    } else if (t == "tool_result" && user) {
      std::string id;
      br.String("tool_use_id", id);
      if (br.ok() && id.empty()) return Bad(bp + ".tool_use_id", bp + " (tool_result) needs a string 'tool_use_id'");
      std::string result;
      if (const ojson* c = br.Get("content")) {
        auto s = TextParts(*c, {"text"});
        if (!s.ok()) return Bad(bp + ".content", bp + ".content: " + s.status().message());
        result = *s;
      }
      bool is_error = false;
      br.Bool("is_error", is_error);
      if (br.ok()) {
        if (is_error) result = "Error: " + result;
        add(ojson{{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
      }
    } else {
      return Bad(bp + ".type", "content blocks of type '" + Clip(t) + "' are not supported in " + (user ? "user" : "assistant") +
                                   " messages (text, " + (user ? "tool_result" : "tool_use, thinking") + ")");
    }
    br.RefuseUnread(bp + ".");
    if (!br.ok()) return br.error();
  }
  if (user) {
    if (!text.empty() || calls.empty()) {
      // A turn of tool results alone has no user message; an empty one is still a turn.
      bool only_results = false;
      for (const ojson& b : *content) only_results = only_results || (b.is_object() && b.value("type", "") == "tool_result");
      if (!(only_results && text.empty())) add(ojson{{"role", "user"}, {"content", text}});
    }
    return std::nullopt;
  }
  ojson msg = {{"role", "assistant"}, {"content", calls.empty() || !text.empty() ? ojson(text) : ojson(nullptr)}};
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  add(std::move(msg));
  return std::nullopt;
}

Parsed<AnthropicRequest> AnthropicParse(std::string_view body, const ApiLimits& limits, bool count) {
  return Guard<AnthropicRequest>([&]() -> Parsed<AnthropicRequest> {
    ojson j;
    if (auto e = ParseOrdered(body, limits.json, j)) return *e;
    OReader r(j);
    ojson out = ojson::object();
    Renames renames;
    bool thinking_off = false;
    if (const ojson* m = r.Get("model")) out["model"] = *m;
    ojson messages = ojson::array();
    if (const ojson* s = r.Get("system")) {
      auto text = TextParts(*s, {"text"});
      if (!text.ok()) return Bad("system", "'system': " + text.status().message());
      if (!text->empty()) messages.push_back({{"role", "system"}, {"content", *text}});
    }
    const ojson* msgs = r.Get("messages");
    if (!msgs || !msgs->is_array() || msgs->empty()) return Bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < msgs->size(); ++i) {
      if (auto e = TranslateAnthropicMessage((*msgs)[i], i, messages, renames)) return *e;
    }
    // Every tool_result answers a tool_use of an earlier assistant turn.
    std::vector<std::string> uses;
    for (size_t k = 0; k < messages.size(); ++k) {
      const ojson& m = messages[k];
      if (m.contains("tool_calls")) {
        for (const ojson& c : m["tool_calls"]) uses.push_back(c.value("id", ""));
      }
      if (m.value("role", "") == "tool" && std::find(uses.begin(), uses.end(), m.value("tool_call_id", "")) == uses.end()) {
        std::string p = "messages";
        for (const auto& [from, to] : renames) {
          if (from == "messages[" + std::to_string(k) + "]") p = to;
        }
        return Bad(p, "unexpected tool_use_id '" + Clip(m.value("tool_call_id", "")) +
                          "' in a tool_result block: no earlier tool_use has it");
      }
    }
    out["messages"] = std::move(messages);
    if (const ojson* tools = r.Get("tools")) {
      if (!tools->is_array()) return Bad("tools", "'tools' must be an array");
      ojson list = ojson::array();
      for (size_t i = 0; i < tools->size(); ++i) {
        const ojson& t = (*tools)[i];
        const std::string p = "tools[" + std::to_string(i) + "]";
        if (!t.is_object()) return Bad(p, p + " must be an object");
        OReader tr(t);
        std::string type = "custom";
        tr.String("type", type);
        if (type != "custom") {
          return Bad(p + ".type", "server tools ('" + Clip(type) + "') are not supported: only client tools (name, description, input_schema)");
        }
        ojson fn = ojson::object();
        if (const ojson* n = tr.Get("name")) fn["name"] = *n;
        if (const ojson* d = tr.Get("description")) fn["description"] = *d;
        const ojson* schema = tr.Get("input_schema");
        if (tr.ok() && !schema) return Bad(p + ".input_schema", p + " needs an 'input_schema'");
        if (schema) fn["parameters"] = *schema;
        tr.Get("cache_control");
        tr.RefuseUnread(p + ".");
        if (!tr.ok()) return tr.error();
        renames.emplace_back(p + ".function.parameters", p + ".input_schema");
        renames.emplace_back(p + ".function", p);
        list.push_back({{"type", "function"}, {"function", std::move(fn)}});
      }
      out["tools"] = std::move(list);
    }
    if (const ojson* tc = r.Get("tool_choice")) {
      if (!tc->is_object()) return Bad("tool_choice", "'tool_choice' must be an object with a 'type'");
      OReader cr(*tc);
      std::string type, name;
      bool no_parallel = false;
      cr.String("type", type);
      cr.String("name", name);
      cr.Bool("disable_parallel_tool_use", no_parallel);
      cr.RefuseUnread("tool_choice.");
      if (!cr.ok()) return cr.error();
      if (type == "auto") {
        out["tool_choice"] = "auto";
      } else if (type == "any") {
        out["tool_choice"] = "required";
      } else if (type == "none") {
        out["tool_choice"] = "none";
      } else if (type == "tool") {
        if (name.empty()) return Bad("tool_choice.name", "'tool_choice' of type tool needs a 'name'");
        out["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
      } else {
        return Bad("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none");
      }
      if (no_parallel) out["parallel_tool_calls"] = false;
    }
    if (!count) {
      const ojson* mt = r.Get("max_tokens");
      if (r.ok() && !mt) return Bad("max_tokens", "'max_tokens' is required");
      // Anthropic's clients size max_tokens for Claude's context (Claude Code sends 32000):
      // above this server's context it means "until the context is full", which is what
      // the answer can give (stop_reason max_tokens when it is).
      const bool over = mt && ((mt->is_number_unsigned() && mt->get<uint64_t>() > static_cast<uint64_t>(limits.n_ctx)) ||
                               (mt->is_number_integer() && mt->get<int64_t>() > limits.n_ctx));
      if (mt && !over) out["max_tokens"] = *mt;
      if (const ojson* t = r.Get("temperature")) {
        if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 1) {
          return Bad("temperature", "'temperature' must be a number in [0, 1], got " + Describe(*t));
        }
        out["temperature"] = *t;
      }
      for (const char* key : {"top_p", "top_k", "stream"}) {
        if (const ojson* v = r.Get(key)) out[key] = *v;
      }
      if (const ojson* s = r.Get("stop_sequences")) out["stop"] = *s;
      renames.emplace_back("stop", "stop_sequences");
      r.Get("metadata");      // user_id: identity only
      r.Get("service_tier");  // routing only
    }
    if (const ojson* th = r.Get("thinking")) {
      const std::string type = th->is_object() ? th->value("type", "") : "";
      if (type == "disabled") {
        thinking_off = true;
      } else if (type == "enabled") {
        return Bad("thinking", "'thinking' with a token budget is not supported: a thinking model thinks by default "
                               "(its reasoning comes back as thinking blocks); send {\"type\": \"disabled\"} to turn it off");
      } else {
        return Bad("thinking", "'thinking' must be {\"type\": \"disabled\"} (or absent)");
      }
    }
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    auto chat = ChatFromOpenAi(out, limits, renames);
    if (!chat.ok()) return chat.error();
    chat->thinking_off = thinking_off;
    return AnthropicRequest{std::move(*chat)};
  });
}

json AnthropicUsage(int prompt, int cached, int output) {
  return {{"input_tokens", prompt - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", output}};
}

const char* AnthropicStopReason(const AnswerEnd& e) {
  if (e.finish_reason == "tool_calls") return "tool_use";
  if (e.finish_reason == "length") return "max_tokens";
  return e.stop_string.empty() ? "end_turn" : "stop_sequence";
}

json AnthropicErrorBody(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

// A call's arguments as the object tool_use.input holds ({} if the text is not one).
json AnthropicInput(const std::string& arguments) {
  json v = json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return v.is_object() ? v : json::object();
}

}  // namespace

Parsed<AnthropicRequest> ParseAnthropicRequest(std::string_view body, const ApiLimits& limits) {
  return AnthropicParse(body, limits, /*count=*/false);
}
Parsed<AnthropicRequest> ParseAnthropicCountRequest(std::string_view body, const ApiLimits& limits) {
  return AnthropicParse(body, limits, /*count=*/true);
}

http::HttpResponse AnthropicErrorResponse(const ApiError& e) {
  http::HttpResponse r;
  r.status = e.status;
  r.body = Dump(AnthropicErrorBody(e));
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string AnthropicCountJson(int input_tokens) { return Dump(json{{"input_tokens", input_tokens}}); }

AnthropicWriter::AnthropicWriter(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}

http::HttpResponse AnthropicWriter::Whole(const WholeAnswer& a) {
  json content = json::array();
  if (!a.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", a.reasoning}, {"signature", ""}});
  if (!a.text.empty() || (a.tool_calls.empty() && a.reasoning.empty())) content.push_back({{"type", "text"}, {"text", a.text}});
  for (const ToolCallOut& c : a.tool_calls) {
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", AnthropicInput(c.arguments)}});
  }
  const Usage& u = a.end.usage;
  json j = {{"id", id_},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", std::move(content)},
            {"stop_reason", AnthropicStopReason(a.end)},
            {"stop_sequence", a.end.stop_string.empty() ? json(nullptr) : json(a.end.stop_string)},
            {"usage", AnthropicUsage(u.prompt_tokens, u.cached_tokens, u.completion_tokens)}};
  AddCacheReceipt(u, j["usage"]);
  http::HttpResponse r;
  r.body = Dump(j);
  return r;
}

std::string AnthropicWriter::Event(const char* type, const std::string& data) {
  return std::string("event: ") + type + "\ndata: " + data + "\n\n";
}

std::string AnthropicWriter::Open() {
  json msg = {{"id", id_},     {"type", "message"},         {"role", "assistant"},
              {"model", model_}, {"content", json::array()}, {"stop_reason", nullptr},
              {"stop_sequence", nullptr}, {"usage", AnthropicUsage(input_, cached_, 0)}};
  return Event("message_start", Dump(json{{"type", "message_start"}, {"message", std::move(msg)}}));
}

void AnthropicWriter::CloseBlock(std::string& out) {
  if (block_ < 0) return;
  out += Event("content_block_stop", Dump(json{{"type", "content_block_stop"}, {"index", block_}}));
  block_ = -1;
  block_type_.clear();
}

std::string AnthropicWriter::Delta(AnswerDelta& d) {
  std::string out;
  auto start = [&](const char* type, json block) {
    CloseBlock(out);
    block_ = blocks_++;
    block_type_ = type;
    out += Event("content_block_start",
                 Dump(json{{"type", "content_block_start"}, {"index", block_}, {"content_block", std::move(block)}}));
  };
  auto delta = [&](json d) {
    out += Event("content_block_delta", Dump(json{{"type", "content_block_delta"}, {"index", block_}, {"delta", std::move(d)}}));
  };
  if (!d.reasoning.empty()) {
    if (block_type_ != "thinking") start("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (block_type_ != "text") start("text", {{"type", "text"}, {"text", ""}});
    delta({{"type", "text_delta"}, {"text", d.content}});
  }
  for (ToolCallOut& c : d.calls) {
    if (c.first) {
      start("tool_use", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}});
      call_ = c.index;
    }
    if (!c.arguments.empty() && block_type_ == "tool_use") delta({{"type", "input_json_delta"}, {"partial_json", c.arguments}});
  }
  return out;
}

std::string AnthropicWriter::Close(const AnswerEnd& e) {
  std::string out;
  if (blocks_ == 0) {  // an empty answer is one empty text block, as the API's
    block_ = blocks_++;
    out += Event("content_block_start", Dump(json{{"type", "content_block_start"}, {"index", block_},
                                                  {"content_block", {{"type", "text"}, {"text", ""}}}}));
  }
  CloseBlock(out);
  const Usage& u = e.usage;
  json usage = AnthropicUsage(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  AddCacheReceipt(u, usage);
  out += Event("message_delta",
               Dump(json{{"type", "message_delta"},
                         {"delta", {{"stop_reason", AnthropicStopReason(e)},
                                    {"stop_sequence", e.stop_string.empty() ? json(nullptr) : json(e.stop_string)}}},
                         {"usage", std::move(usage)}}));
  out += Event("message_stop", R"({"type":"message_stop"})");
  return out;
}

std::string AnthropicWriter::Failed(const ApiError& e) { return Event("error", Dump(AnthropicErrorBody(e))); }

}  // namespace trellis::server

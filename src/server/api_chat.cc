// Chat completion requests: messages (contents, tool calls, tool results), tools and
// tool_choice, reasoning switches, chat_template_kwargs.
#include "server/api.h"

#include <algorithm>
#include <exception>
#include <map>
#include <unordered_map>

#include "server/api_reader.h"

namespace trellis::server {
namespace api_detail {

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
    out += text->get_ref<const std::string&>();
  }
  return out;
}

// A client JSON value as a template value; strings are marked as input (content, never
// template text). Depth is bounded by the body's shape check.
jinja::Value ToTemplateValue(const json& v) {
  switch (v.type()) {
    case json::value_t::boolean: return jinja::Value::Bool(v.get<bool>());
    case json::value_t::number_integer: return jinja::Value::Int(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) ? jinja::Value::Int(static_cast<int64_t>(v.get<uint64_t>()))
                                                                   : jinja::Value::Float(v.get<double>());
    case json::value_t::number_float: return jinja::Value::Float(v.get<double>());
    case json::value_t::string: return jinja::Value::Str(v.get<std::string>(), /*input=*/true);
    case json::value_t::array: {
      jinja::ValueList l;
      for (const json& e : v) l.push_back(ToTemplateValue(e));
      return jinja::Value::List(std::move(l));
    }
    case json::value_t::object: {
      jinja::ValueDict d;
      for (const auto& [k, e] : v.items()) d.emplace_back(k, ToTemplateValue(e));
      return jinja::Value::Dict(std::move(d));
    }
    default: return jinja::Value::None();
  }
}


// JSON text as a template value with objects in the text's key order (what Hugging Face
// hands a template: Python dicts keep the client's order, and tojson writes it back). A
// repeated key keeps its first place and its last value, as Python's json.loads does.
// nullopt if the text is not JSON. Strings are input.
class TemplateValueBuilder {
 public:
  using J = nlohmann::json;
  bool null() { return Add(jinja::Value::None()); }
  bool boolean(bool b) { return Add(jinja::Value::Bool(b)); }
  bool number_integer(J::number_integer_t i) { return Add(jinja::Value::Int(i)); }
  bool number_unsigned(J::number_unsigned_t u) {
    return Add(u <= static_cast<uint64_t>(INT64_MAX) ? jinja::Value::Int(static_cast<int64_t>(u))
                                                      : jinja::Value::Float(static_cast<double>(u)));
  }
  bool number_float(J::number_float_t f, const J::string_t&) { return Add(jinja::Value::Float(f)); }
  bool string(J::string_t& s) { return Add(jinja::Value::Str(std::move(s), /*input=*/true)); }
  bool binary(J::binary_t&) { return false; }
  bool start_object(std::size_t) { return Open(jinja::Value::Dict()); }
  bool key(J::string_t& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(jinja::Value::List()); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  std::optional<jinja::Value> result;

 private:
  struct Frame {
    jinja::Value v;
    std::string key;
    std::unordered_map<std::string, size_t> index;  // dict: key -> position
  };
  bool Add(jinja::Value v) {
    if (stack_.empty()) {
      result = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (f.v.kind() == jinja::Value::Kind::kList) {
      f.v.list().push_back(std::move(v));
      return true;
    }
    auto [it, fresh] = f.index.emplace(f.key, f.v.dict().size());
    if (fresh) {
      f.v.dict().emplace_back(std::move(f.key), std::move(v));
    } else {
      f.v.dict()[it->second].second = std::move(v);
    }
    return true;
  }
  bool Open(jinja::Value v) {
    stack_.push_back({std::move(v), {}, {}});
    return true;
  }
  bool Close() {
    jinja::Value v = std::move(stack_.back().v);
    stack_.pop_back();
    return Add(std::move(v));
  }
  std::vector<Frame> stack_;
};

std::optional<jinja::Value> TemplateValueFromText(std::string_view text) {
  if (text.empty()) return std::nullopt;
  TemplateValueBuilder b;
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &b);
  } catch (const nlohmann::json::exception&) {
    ok = false;
  }
  if (!ok) return std::nullopt;
  return std::move(b.result);
}


// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": a JSON string (OpenAI) or an object}}].
std::optional<ApiError> CheckToolCalls(const json& tc, const std::string& param) {
  if (!tc.is_array()) return Bad(param, "'" + param + "' must be an array of tool calls");
  if (tc.size() > kMaxTools) return Bad(param, "'" + param + "' holds at most " + std::to_string(kMaxTools) + " calls");
  for (size_t k = 0; k < tc.size(); ++k) {
    const std::string p = param + "[" + std::to_string(k) + "]";
    const json& c = tc[k];
    if (!c.is_object()) return Bad(p, p + " must be an object");
    if (auto id = c.find("id"); id != c.end() && !id->is_null() && !id->is_string()) return Bad(p + ".id", p + ".id must be a string");
    if (auto t = c.find("type"); t != c.end() && !t->is_null() && *t != "function") {
      return Bad(p + ".type", p + ".type must be \"function\"");
    }
    auto f = c.find("function");
    if (f == c.end() || !f->is_object()) return Bad(p + ".function", p + " needs a 'function' object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) return Bad(p + ".function.name", p + ".function.name must be a string");
    auto args = f->find("arguments");
    if (args != f->end() && !args->is_null() && !args->is_string() && !args->is_object()) {
      return Bad(p + ".function.arguments", p + ".function.arguments must be a string of JSON (or an object)");
    }
  }
  return std::nullopt;
}

// A tool call's function.arguments given as JSON text becomes the object it holds, for
// the template (text that is not a JSON object stays a string).
void ArgumentsAsObject(const jinja::Value& call) {
  const jinja::Value* f = call.Find("function");
  const jinja::Value* a = f ? f->Find("arguments") : nullptr;
  if (!a || a->kind() != jinja::Value::Kind::kString) return;
  std::optional<jinja::Value> v = TemplateValueFromText(a->text());
  if (v && v->kind() == jinja::Value::Kind::kDict) f->Set("arguments", std::move(*v));
}

bool ValidToolName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// tools (or the deprecated functions), tool_choice (function_call), parallel_tool_calls;
// each tool's parameters compiled to the grammar its calls are held to.
std::optional<ApiError> ReadTools(Reader& r, std::string_view body, ChatCompletionRequest& req) {
  const char* key = "tools";
  const json* tools = r.Get("tools");
  bool legacy = false;
  if (!tools || (tools->is_array() && tools->empty())) {
    tools = nullptr;
    if (const json* f = r.Get("functions"); f && !(f->is_array() && f->empty())) {
      tools = f;
      key = "functions";
      legacy = true;
    }
  }
  std::vector<const json*> params_dom;
  if (tools) {
    if (!tools->is_array()) return Bad(key, std::string("'") + key + "' must be an array");
    if (tools->size() > kMaxTools) {
      return Bad(key, std::string("'") + key + "' holds at most " + std::to_string(kMaxTools) + " tools");
    }
    std::optional<jinja::Value> ordered = TemplateValueFromText(RawMember(body, key));
    if (ordered && (ordered->kind() != jinja::Value::Kind::kList || ordered->list().size() != tools->size())) {
      ordered.reset();
    }
    jinja::ValueList for_template;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string param = std::string(key) + "[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) return Bad(param, param + " must be an object");
      const json* fn = &t;
      std::string fparam = param;
      if (!legacy) {
        auto type = t.find("type");
        if (type == t.end() || *type != "function") return Bad(param + ".type", param + ".type must be \"function\"");
        auto f = t.find("function");
        if (f == t.end() || !f->is_object()) return Bad(param + ".function", param + " needs a 'function' object");
        fn = &*f;
        fparam += ".function";
      }
      ToolDefinition def;
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !ValidToolName(name->get_ref<const std::string&>())) {
        return Bad(fparam + ".name", fparam + ".name must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -");
      }
      def.name = name->get<std::string>();
      for (const ToolDefinition& d : req.tools) {
        if (d.name == def.name) return Bad(fparam + ".name", "two tools are named '" + def.name + "'");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
        if (!d->is_string()) return Bad(fparam + ".description", fparam + ".description must be a string");
        def.description_bytes = d->get_ref<const std::string&>().size();
      }
      if (auto st = fn->find("strict"); st != fn->end() && !st->is_null()) {
        if (!st->is_boolean()) return Bad(fparam + ".strict", fparam + ".strict must be a boolean");
        def.strict = st->get<bool>();
      }
      jinja::Value tv = ordered ? ordered->list()[i] : ToTemplateValue(t);
      if (legacy) tv = jinja::Value::Dict({{"type", jinja::Value::Str("function")}, {"function", tv}});
      const json* pd = nullptr;
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object() && !p->is_boolean()) return Bad(fparam + ".parameters", fparam + ".parameters must be a JSON schema object");
        pd = &*p;
        const jinja::Value* f = tv.Find("function");
        const jinja::Value* pv = f ? f->Find("parameters") : nullptr;
        def.parameters = pv ? jinja::ToJson(*pv) : Dump(*p);
      }
      params_dom.push_back(pd);
      req.tools.push_back(std::move(def));
      for_template.push_back(std::move(tv));
    }
    req.tools_value = jinja::Value::List(std::move(for_template));
  }

  req.tool_choice = tools ? ToolChoice::kAuto : ToolChoice::kNone;
  const char* ckey = "tool_choice";
  const json* tc = r.Get("tool_choice");
  if (!tc && (tc = r.Get("function_call"))) ckey = "function_call";
  if (tc) {
    const std::string cparam = ckey;
    if (tc->is_string()) {
      const std::string& c = tc->get_ref<const std::string&>();
      if (c == "none") {
        req.tool_choice = ToolChoice::kNone;
      } else if (c == "auto") {
        req.tool_choice = tools ? ToolChoice::kAuto : ToolChoice::kNone;
      } else if (c == "required" && cparam == "tool_choice") {
        req.tool_choice = ToolChoice::kRequired;
      } else {
        return Bad(cparam, "'" + cparam + "' must be \"none\", \"auto\", \"required\" or a named function, got " + Describe(*tc));
      }
    } else if (tc->is_object()) {
      const json* f = tc;
      if (cparam == "tool_choice") {
        auto type = tc->find("type");
        auto fn = tc->find("function");
        if (type == tc->end() || *type != "function" || fn == tc->end() || !fn->is_object()) {
          return Bad(cparam, "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
        f = &*fn;
      }
      auto name = f->find("name");
      if (name == f->end() || !name->is_string()) return Bad(cparam, "'" + cparam + "' names no function");
      req.tool_choice = ToolChoice::kNamed;
      req.tool_choice_name = name->get<std::string>();
      if (std::none_of(req.tools.begin(), req.tools.end(), [&](const ToolDefinition& d) { return d.name == req.tool_choice_name; })) {
        return Bad(cparam, "'" + cparam + "' names '" + Clip(req.tool_choice_name) + "', which is not among the tools");
      }
    } else {
      return Bad(cparam, "'" + cparam + "' must be a string or an object, got " + Describe(*tc));
    }
    if (req.tool_choice == ToolChoice::kRequired && !tools) {
      return Bad(cparam, "'" + cparam + "' is \"required\" but the request has no tools");
    }
  }
  r.Bool("parallel_tool_calls", req.parallel_tool_calls);

  // The grammars of the arguments, for the tools the answer may call.
  if (req.tool_choice != ToolChoice::kNone) {
    for (size_t i = 0; i < req.tools.size(); ++i) {
      ToolDefinition& d = req.tools[i];
      if (req.tool_choice == ToolChoice::kNamed && d.name != req.tool_choice_name) continue;
      const std::string param = std::string(key) + "[" + std::to_string(i) + "]" + (legacy ? "" : ".function") + ".parameters";
      if (!params_dom[i]) {  // no parameters: OpenAI's empty parameter list
        static const json kNoParameters = {{"type", "object"}, {"additionalProperties", false}};
        auto g = SchemaGrammar(param, kNoParameters);
        if (!g.ok()) return g.error();
        d.arguments = *g;
        continue;
      }
      auto g = SchemaGrammar(param, *params_dom[i], d.parameters);
      if (g.ok()) {
        d.arguments = *g;
      } else if (g.error().code != "unsupported_schema" || d.strict || req.tool_choice != ToolChoice::kAuto) {
        return g.error();
      }
      // Otherwise (auto, not strict, a keyword the converter lacks): the call's syntax is
      // held to, its arguments to any JSON object (docs/server.md).
    }
  }
  return std::nullopt;
}

}  // namespace api_detail

using namespace api_detail;

// Reasoning switches of the three servers' clients, read into one setting: llama-server's
// reasoning_format (none / deepseek / auto), SGLang's separate_reasoning (false: the
// reasoning stays in content, as none), vLLM's include_reasoning (false: split off and
// dropped); and OpenAI's reasoning_effort, a variable for templates that read it (gpt-oss)
// unless chat_template_kwargs sets it.
void ReadReasoningFields(Reader& r, ChatCompletionRequest& req) {
  if (const json* f = r.Get("reasoning_format")) {
    if (!f->is_string() || (*f != "none" && *f != "deepseek" && *f != "auto")) {
      return r.Fail("reasoning_format", "'reasoning_format' must be \"none\", \"deepseek\" or \"auto\", got " + Describe(*f));
    }
    req.reasoning_format = *f == "none" ? "none" : "deepseek";
  }
  bool separate = true;
  r.Bool("separate_reasoning", separate);
  if (!separate) {
    if (req.reasoning_format == "deepseek") {
      return r.Fail("separate_reasoning", "'separate_reasoning': false and 'reasoning_format' disagree");
    }
    req.reasoning_format = "none";
  }
  r.Bool("include_reasoning", req.include_reasoning);
  if (const json* e = r.Get("reasoning_effort")) {
    if (!e->is_string() || (*e != "none" && *e != "minimal" && *e != "low" && *e != "medium" && *e != "high")) {
      return r.Fail("reasoning_effort",
                    "'reasoning_effort' must be one of none, minimal, low, medium, high, got " + Describe(*e));
    }
    const bool set = std::any_of(req.template_kwargs.begin(), req.template_kwargs.end(),
                                 [](const auto& kv) { return kv.first == "reasoning_effort"; });
    if (!set) req.template_kwargs.emplace_back("reasoning_effort", jinja::Value::Str(e->get<std::string>(), /*input=*/true));
  }
}

Parsed<ChatCompletionRequest> ParseChatCompletionRequest(std::string_view body, const ApiLimits& limits) {
  return Guard<ChatCompletionRequest>([&]() -> Parsed<ChatCompletionRequest> {
    json j;
    if (auto e = ParseObject(body, limits.json, j)) return *e;
    ChatCompletionRequest req;
    Reader r(j);
    std::optional<ApiError> not_found;
    ReadModel(r, limits, req.model, not_found);
    const json* msgs = r.Get("messages");
    if (r.ok() && (!msgs || !msgs->is_array() || msgs->empty())) {
      return Bad("messages", "'messages' must be a non-empty array");
    }
    size_t prompt_bytes = 0;
    // The messages in the client's key order, for the template (DOM: keys sorted).
    std::optional<jinja::Value> ordered;
    if (msgs) ordered = TemplateValueFromText(RawMember(body, "messages"));
    if (ordered && (ordered->kind() != jinja::Value::Kind::kList || ordered->list().size() != msgs->size())) {
      ordered.reset();
    }
    if (msgs) {
      for (size_t i = 0; i < msgs->size(); ++i) {
        const json& m = (*msgs)[i];
        const std::string param = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) return Bad(param, param + " must be an object");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string()) return Bad(param + ".role", param + ".role must be a string");
        const std::string& rs = role->get_ref<const std::string&>();
        if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer" && rs != "tool") {
          return Bad(param + ".role", "unsupported role '" + Clip(rs) + "' (system, developer, user, assistant, tool)");
        }
        if (auto fc = m.find("function_call"); fc != m.end() && !fc->is_null()) {
          return Bad(param + ".function_call", "'function_call' in messages is the deprecated form: send 'tool_calls'");
        }
        ChatMessage msg;
        msg.role = rs == "developer" ? "system" : rs;
        const bool has_calls = rs == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
                               !(m["tool_calls"].is_array() && m["tool_calls"].empty());
        if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !(tc->is_array() && tc->empty())) {
          if (rs != "assistant") return Bad(param + ".tool_calls", "only assistant messages hold 'tool_calls'");
          if (auto e = CheckToolCalls(*tc, param + ".tool_calls")) return *e;
          prompt_bytes += Dump(*tc).size();
        }
        if (rs == "tool") {
          auto id = m.find("tool_call_id");
          if (id != m.end() && !id->is_null() && !id->is_string()) {
            return Bad(param + ".tool_call_id", param + ".tool_call_id must be a string");
          }
        }
        auto content = m.find("content");
        if (content == m.end() || content->is_null()) {
          if (!has_calls) return Bad(param + ".content", param + " has no content");
          msg.content_null = true;
        } else {
          auto text = MessageContent(*content);
          if (!text.ok()) return Bad(param + ".content", text.status().message());
          msg.content = std::move(text).value();
        }
        prompt_bytes += msg.content.size();
        if (limits.max_prompt_bytes > 0 && prompt_bytes > limits.max_prompt_bytes) {
          return PromptTooLong("messages", prompt_bytes, limits);
        }
        // Everything else the client sent, for the template; tool-call arguments as
        // objects (templates write them with tojson, as vLLM and llama.cpp hand them over).
        const jinja::Value full = ordered ? ordered->list()[i] : ToTemplateValue(m);
        if (full.kind() == jinja::Value::Kind::kDict) {
          for (const auto& [k, v] : full.dict()) {
            if (k == "role" || k == "content") continue;
            if (k == "tool_calls" && v.kind() == jinja::Value::Kind::kList) {
              for (const jinja::Value& call : v.list()) ArgumentsAsObject(call);
            }
            msg.extra.emplace_back(k, v);
          }
        }
        req.messages.push_back(std::move(msg));
      }
    }
    if (auto e = ReadTools(r, body, req)) return *e;
    for (const ToolDefinition& t : req.tools) {
      prompt_bytes += t.parameters.size() + t.description_bytes;
      if (limits.max_prompt_bytes > 0 && prompt_bytes > limits.max_prompt_bytes) {
        return PromptTooLong("tools", prompt_bytes, limits);
      }
    }
    ReadGeneration(r, body, limits, /*chat=*/true, req.gen);
    if (r.ok() && req.gen.ignore_eos && req.tool_choice != ToolChoice::kNone && !req.tools.empty()) {
      return Bad("ignore_eos", "'ignore_eos' with tools: an answer of calls ends with the end token");
    }
    if (const json* kw = r.Get("chat_template_kwargs")) {
      if (!kw->is_object()) return Bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      if (kw->size() > kMaxTemplateKwargs) {
        return Bad("chat_template_kwargs", "'chat_template_kwargs' holds at most " + std::to_string(kMaxTemplateKwargs) + " entries");
      }
      for (const auto& [k, v] : kw->items()) {
        for (const char* reserved : {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}) {
          if (k == reserved) {
            return Bad("chat_template_kwargs." + k, "'chat_template_kwargs' may not set the template's own '" + k + "'");
          }
        }
        req.template_kwargs.emplace_back(k, ToTemplateValue(v));
      }
    }
    ReadReasoningFields(r, req);
    bool flag = false;
    r.Bool("add_special_tokens", flag);  // vLLM: the template writes the special tokens
    if (flag) r.Fail("add_special_tokens", "'add_special_tokens' must be false for chat: the chat template writes them");
    flag = false;
    r.Bool("echo", flag);  // vLLM: the last message repeated in the answer
    if (flag) r.Fail("echo", "'echo' is not supported for chat completions");
    r.RefuseUnread();
    if (!r.ok()) return r.error();
    if (not_found) return *not_found;
    return req;
  });
}


}  // namespace trellis::server

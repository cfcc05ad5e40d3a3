#include "server/chat_template.h"

#include <cctype>

#include <algorithm>

#include <fmt/core.h>

#include <array>
#include <utility>

namespace trellis::server {
namespace {

struct NamedFamily {
  std::string_view name;
  TemplateFamily family;
};
constexpr std::array<NamedFamily, 8> kFamilies{{
    {"llama2", TemplateFamily::kLlama2},
    {"llama3", TemplateFamily::kLlama3},
    {"llama3.1", TemplateFamily::kLlama31},
    {"mistral", TemplateFamily::kMistral},
    {"mistral-nemo", TemplateFamily::kMistralNemo},
    {"chatml", TemplateFamily::kChatMl},
    {"zephyr", TemplateFamily::kZephyr},
    {"phi3", TemplateFamily::kPhi3},
}};

bool Has(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// `word` in `s` as a whole identifier ("tools", not "xml_tools" or "tools_in_user_message").
bool HasWord(std::string_view s, std::string_view word) {
  const auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t p = s.find(word); p != std::string_view::npos; p = s.find(word, p + 1)) {
    const size_t e = p + word.size();
    if ((p == 0 || !ident(s[p - 1])) && (e == s.size() || !ident(s[e]))) return true;
  }
  return false;
}

// Python's str.strip() / Jinja's |trim: ASCII whitespace at both ends.
std::string Trim(std::string_view s) {
  constexpr std::string_view kWs = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(kWs);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(kWs);
  return std::string(s.substr(b, e - b + 1));
}

// ChatML templates may carry a default system prompt, rendered when the conversation has
// none (Qwen 2.5: '<|im_start|>system\nYou are Qwen, ...<|im_end|>\n'). Finds the literal
// text between "<|im_start|>system\n" and "<|im_end|>" inside one string literal.
std::string ChatMlDefaultSystem(std::string_view jinja) {
  constexpr std::string_view kOpen = "<|im_start|>system\\n";
  size_t pos = 0;
  while ((pos = jinja.find(kOpen, pos)) != std::string_view::npos) {
    pos += kOpen.size();
    const size_t end = jinja.find("<|im_end|>", pos);
    if (end == std::string_view::npos) break;
    std::string_view body = jinja.substr(pos, end - pos);
    // A literal, not an expression: no quote (string concatenation) inside.
    if (!body.empty() && body.find_first_of("'\"{}+") == std::string_view::npos) return std::string(body);
  }
  return {};
}

Status CheckRoles(std::span<const ChatMessage> messages) {
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return InvalidArgument("unsupported message role '" + m.role + "' (system, user, assistant, tool)");
    }
  }
  return Status::Ok();
}

// After an optional leading system message, roles must go user, assistant, user, ...
Status CheckAlternating(std::span<const ChatMessage> messages, bool allow_system_first) {
  size_t i = 0;
  if (allow_system_first && !messages.empty() && messages[0].role == "system") i = 1;
  for (size_t k = 0; i < messages.size(); ++i, ++k) {
    const bool want_user = k % 2 == 0;
    if ((messages[i].role == "user") != want_user || messages[i].role == "system") {
      return InvalidArgument(
          "this model's chat template needs roles to alternate user/assistant/user/... after an optional "
          "system message");
    }
  }
  return Status::Ok();
}

// Builds a rendering as segments: Special() for what the template writes, Content() for
// message text. Adjacent pieces of one kind merge; empty pieces are dropped.
class Segments {
 public:
  void Special(std::string_view s) { Add(s, true); }
  void Content(std::string_view s) { Add(s, false); }
  void Append(const std::vector<PromptSegment>& segs) {
    for (const PromptSegment& p : segs) Add(p.text, p.special);
  }
  std::vector<PromptSegment> Take() { return std::move(out_); }

 private:
  void Add(std::string_view s, bool special) {
    if (s.empty()) return;
    if (!out_.empty() && out_.back().special == special) {
      out_.back().text += s;
    } else {
      out_.push_back({std::string(s), special});
    }
  }
  std::vector<PromptSegment> out_;
};

// Trim() of the concatenation of `segs`, segment by segment.
std::vector<PromptSegment> TrimSegments(std::vector<PromptSegment> segs) {
  constexpr std::string_view kWs = " \t\n\r\v\f";
  while (!segs.empty()) {
    std::string& t = segs.front().text;
    t.erase(0, std::min(t.size(), t.find_first_not_of(kWs)));
    if (!t.empty()) break;
    segs.erase(segs.begin());
  }
  while (!segs.empty()) {
    std::string& t = segs.back().text;
    const size_t last = t.find_last_not_of(kWs);
    t.erase(last == std::string::npos ? 0 : last + 1);
    if (!t.empty()) break;
    segs.pop_back();
  }
  return segs;
}

std::vector<PromptSegment> RenderLlama2(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  Segments out;
  std::span<const ChatMessage> loop = msgs;
  const ChatMessage* system = nullptr;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = &msgs[0];
    loop = msgs.subspan(1);
  }
  for (size_t i = 0; i < loop.size(); ++i) {
    // The template builds `content` (with the system block on the first turn), then strips it.
    Segments content;
    if (i == 0 && system) {
      content.Special("<<SYS>>\n");
      content.Content(system->content);
      content.Special("\n<</SYS>>\n\n");
    }
    content.Content(loop[i].content);
    const std::vector<PromptSegment> trimmed = TrimSegments(content.Take());
    if (loop[i].role == "user") {
      out.Special(t.bos + "[INST] ");
      out.Append(trimmed);
      out.Special(" [/INST]");
    } else if (loop[i].role == "assistant") {
      out.Special(" ");
      out.Append(trimmed);
      out.Special(" " + t.eos);
    }
  }
  return out.Take();
}

std::vector<PromptSegment> RenderLlama3(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t,
                                        bool v31) {
  Segments out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out.Special("<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n");
    out.Content(Trim(content));
    out.Special("<|eot_id|>");
  };
  if (v31) {
    std::span<const ChatMessage> loop = msgs;
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = Trim(msgs[0].content);
      loop = msgs.subspan(1);
    }
    out.Special(t.bos + "<|start_header_id|>system<|end_header_id|>\n\n");
    out.Special("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    out.Content(system);
    out.Special("<|eot_id|>");
    for (const ChatMessage& m : loop) turn(m.role, m.content);
  } else {
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0) out.Special(t.bos);
      turn(msgs[i].role, msgs[i].content);
    }
  }
  if (gen) out.Special("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out.Take();
}

std::vector<PromptSegment> RenderMistral(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  // v0.1 raises on a system message; like llama.cpp we fold it into the first user turn.
  Segments out;
  out.Special(t.bos);
  std::string_view system;
  std::span<const ChatMessage> loop = msgs;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    loop = msgs.subspan(1);
  }
  for (size_t i = 0; i < loop.size(); ++i) {
    if (loop[i].role == "user") {
      out.Special("[INST] ");
      if (i == 0 && !system.empty()) {
        out.Content(system);
        out.Special("\n\n");
      }
      out.Content(loop[i].content);
      out.Special(" [/INST]");
    } else {
      out.Content(loop[i].content);
      out.Special(t.eos);
    }
  }
  return out.Take();
}

std::vector<PromptSegment> RenderMistralNemo(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  Segments out;
  out.Special(t.bos);
  std::span<const ChatMessage> loop = msgs;
  const bool has_system = !msgs.empty() && msgs[0].role == "system";
  if (has_system) loop = msgs.subspan(1);
  for (size_t i = 0; i < loop.size(); ++i) {
    if (loop[i].role == "user") {
      out.Special("[INST]");
      if (i + 1 == loop.size() && has_system) {
        out.Content(msgs[0].content);
        out.Special("\n\n");
      }
      out.Content(loop[i].content);
      out.Special("[/INST]");
    } else {
      out.Content(loop[i].content);
      out.Special(t.eos);
    }
  }
  return out.Take();
}

std::vector<PromptSegment> RenderChatMl(std::span<const ChatMessage> msgs, bool gen, const std::string& default_system) {
  Segments out;
  if (!default_system.empty() && (msgs.empty() || msgs[0].role != "system")) {
    // The default system prompt is the template's (the GGUF's) text, not a client's.
    out.Special("<|im_start|>system\n" + default_system + "<|im_end|>\n");
  }
  for (const ChatMessage& m : msgs) {
    out.Special("<|im_start|>" + m.role + "\n");
    out.Content(m.content);
    out.Special("<|im_end|>\n");
  }
  if (gen) out.Special("<|im_start|>assistant\n");
  return out.Take();
}

std::vector<PromptSegment> RenderZephyr(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t) {
  Segments out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    out.Special("<|" + msgs[i].role + "|>\n");
    out.Content(msgs[i].content);
    out.Special(t.eos + "\n");
    if (i + 1 == msgs.size() && gen) out.Special("<|assistant|>\n");
  }
  return out.Take();
}

std::vector<PromptSegment> RenderPhi3(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t) {
  Segments out;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    out.Special("<|" + m.role + "|>\n");
    out.Content(m.content);
    out.Special("<|end|>\n");
  }
  out.Special(gen ? "<|assistant|>\n" : t.eos);
  return out.Take();
}

bool HasTools(const jinja::Value& tools) {
  return tools.kind() == jinja::Value::Kind::kList && !tools.list().empty();
}

bool HasToolCalls(const ChatMessage& m) {
  for (const auto& [k, v] : m.extra) {
    if (k == "tool_calls") return v.kind() == jinja::Value::Kind::kList && !v.list().empty();
  }
  return false;
}

const jinja::Value* Extra(const ChatMessage& m, std::string_view key) {
  for (const auto& [k, v] : m.extra) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool NeedsPolyfill(const ChatTemplate& t, std::span<const ChatMessage> messages, const jinja::Value& tools) {
  if (HasTools(tools) && (!t.renders_tools() || t.tools_on_system())) return true;
  for (const ChatMessage& m : messages) {
    if (m.role == "tool" && !t.renders_tool_role()) return true;
    if (HasToolCalls(m) && !t.renders_tool_calls()) return true;
  }
  return false;
}

}  // namespace

std::vector<ChatMessage> PolyfillTools(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                                       const jinja::Value& tools) {
  std::vector<ChatMessage> out;
  std::string system;
  if (HasTools(tools) && !tmpl.renders_tools()) {
    system =
        "You can call functions. To call one or more, answer with only this JSON and nothing else:\n"
        "{\"tool_calls\": [{\"name\": \"<function name>\", \"arguments\": {<its arguments>}}]}\n"
        "Otherwise answer normally.\n\nThe functions:";
    for (const jinja::Value& t : tools.list()) {
      const jinja::Value* f = t.Find("function");
      system += "\n" + jinja::ToJson(f ? *f : t);
    }
  }
  // A template that reads the definitions from the system message's `tools` field: a JSON
  // string of the function objects, as its model card writes them.
  std::string on_system;
  if (HasTools(tools) && tmpl.tools_on_system()) {
    jinja::ValueList fns;
    for (const jinja::Value& t : tools.list()) {
      const jinja::Value* f = t.Find("function");
      fns.push_back(f ? *f : t);
    }
    on_system = jinja::ToJson(jinja::Value::List(std::move(fns)));
    if (messages.empty() || messages.front().role != "system") {
      out.push_back({"system", "", false, {{"tools", jinja::Value::Str(on_system, /*input=*/true)}}});
      on_system.clear();
    }
  }
  bool placed = system.empty();
  for (const ChatMessage& m : messages) {
    ChatMessage c = m;
    if (!on_system.empty() && m.role == "system") {
      std::erase_if(c.extra, [](const auto& kv) { return kv.first == "tools"; });
      c.extra.emplace_back("tools", jinja::Value::Str(on_system, /*input=*/true));
      on_system.clear();
    }
    if (!placed && m.role == "system") {
      c.content = c.content.empty() ? system : c.content + "\n\n" + system;
      c.content_null = false;
      placed = true;
    } else if (!placed && !tmpl.takes_system()) {
      c.content = system + "\n\n" + c.content;  // Gemma and others without a system turn
      c.content_null = false;
      placed = true;
    } else if (!placed) {
      out.push_back({"system", system, false, {}});
      placed = true;
    }
    if (HasToolCalls(m) && !tmpl.renders_tool_calls()) {
      jinja::ValueList calls;
      for (const jinja::Value& tc : Extra(m, "tool_calls")->list()) {
        const jinja::Value* f = tc.Find("function");
        const jinja::Value* name = f ? f->Find("name") : nullptr;
        const jinja::Value* args = f ? f->Find("arguments") : nullptr;
        calls.push_back(jinja::Value::Dict({{"name", name ? *name : jinja::Value::None()},
                                            {"arguments", args ? *args : jinja::Value::Dict()}}));
      }
      const std::string json =
          tmpl.tools_on_system()
              ? "<|tool_call|>" + jinja::ToJson(jinja::Value::List(std::move(calls))) + "<|/tool_call|>"
              : jinja::ToJson(jinja::Value::Dict({{"tool_calls", jinja::Value::List(std::move(calls))}}));
      c.content = c.content.empty() ? json : c.content + "\n" + json;
      c.content_null = false;
      std::erase_if(c.extra, [](const auto& kv) { return kv.first == "tool_calls"; });
    }
    if (m.role == "tool" && !tmpl.renders_tool_role()) {
      jinja::ValueDict r;
      if (const jinja::Value* id = Extra(m, "tool_call_id")) r.emplace_back("tool_call_id", *id);
      if (const jinja::Value* n = Extra(m, "name")) r.emplace_back("name", *n);
      r.emplace_back("content", jinja::Value::Str(m.content, true));
      c.role = "user";
      c.content = jinja::ToJson(jinja::Value::Dict({{"tool_response", jinja::Value::Dict(std::move(r))}}));
      c.content_null = false;
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::string ChatTemplate::KnownNames() {
  std::string s;
  for (const NamedFamily& f : kFamilies) {
    if (!s.empty()) s += ", ";
    s += f.name;
  }
  return s;
}

Result<ChatTemplate> ChatTemplate::FromName(std::string_view name, TemplateTokens tokens) {
  for (const NamedFamily& f : kFamilies) {
    if (f.name == name) return ChatTemplate(f.family, std::move(tokens));
  }
  return InvalidArgument("unknown chat template '" + std::string(name) + "' (known: " + KnownNames() + ")");
}

Result<ChatTemplate> ChatTemplate::Detect(std::string_view jinja, TemplateTokens tokens) {
  auto make = [&](TemplateFamily f) { return ChatTemplate(f, std::move(tokens)); };
  if (Has(jinja, "<|start_header_id|>")) {
    return make(Has(jinja, "Cutting Knowledge Date") ? TemplateFamily::kLlama31 : TemplateFamily::kLlama3);
  }
  if (Has(jinja, "<|im_start|>")) {
    // SmolLM3-style templates build the system block from metadata (reasoning modes,
    // dates); rendering them as plain ChatML would drop it.
    if (Has(jinja, "reasoning_mode") || Has(jinja, "enable_thinking")) {
      return InvalidArgument("unsupported chat template: ChatML with reasoning/thinking system blocks (use --chat-template)");
    }
    ChatTemplate t = make(TemplateFamily::kChatMl);
    t.default_system_ = ChatMlDefaultSystem(jinja);
    return t;
  }
  if (Has(jinja, "<|user|>")) {
    if (Has(jinja, "<|end|>")) return make(TemplateFamily::kPhi3);
    if (Has(jinja, "eos_token")) return make(TemplateFamily::kZephyr);
  }
  if (Has(jinja, "[INST]")) {
    if (Has(jinja, "<<SYS>>")) return make(TemplateFamily::kLlama2);
    if (Has(jinja, "'[INST] '") || Has(jinja, "\"[INST] \"")) return make(TemplateFamily::kMistral);
    return make(TemplateFamily::kMistralNemo);
  }
  return InvalidArgument("the model's chat template is not one Trellis can render (families: " + KnownNames() +
                         "); pass --chat-template NAME");
}

Result<ChatTemplate> ChatTemplate::FromJinja(std::string_view source, TemplateTokens tokens) {
  auto parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) {
    return InvalidArgument(fmt::format("{} (or pass --chat-template NAME|FILE; names: {})", parsed.status().message(),
                                       KnownNames()));
  }
  ChatTemplate t(TemplateFamily::kJinja, std::move(tokens));
  t.jinja_ = std::make_shared<const jinja::Template>(std::move(parsed).value());
  // Probe: what every chat sends. Errors a template raises on purpose for the system
  // role (Gemma's "System role not supported") are the template's rule, not a failure.
  const ChatMessage probe[] = {{"user", "Hello"}, {"assistant", "Hi."}, {"user", "How are you?"}};
  auto r = t.RenderJinja(probe, true, {});
  t.thinks_ = source.find("</think>") != std::string_view::npos;
  t.source_ = std::string(source);
  t.renders_tools_ = HasWord(source, "tools");
  t.tools_on_system_ = Has(source, "message['tools']") || Has(source, "message[\"tools\"]") || Has(source, "message.tools");
  t.renders_tool_calls_ = HasWord(source, "tool_calls");
  t.renders_tool_role_ = Has(source, "\"tool\"") || Has(source, "'tool'");
  if (r.ok()) {
    const ChatMessage with_system[] = {{"system", "Be brief."}, {"user", "Hello"}};
    t.takes_system_ = t.RenderJinja(with_system, true, {}).ok();
  }
  if (r.ok() && t.renders_tool_calls_) {
    // An assistant turn of only tool calls has content null (OpenAI's form). Qwen3's
    // template tests '</think>' in the content and fails on null; llama.cpp's template
    // probe then hands such templates "" instead, and so do we.
    jinja::ValueDict fn = {{"name", jinja::Value::Str("f", true)}, {"arguments", jinja::Value::Dict({})}};
    jinja::Value calls = jinja::Value::List({jinja::Value::Dict(
        {{"id", jinja::Value::Str("c1", true)}, {"type", jinja::Value::Str("function", true)},
         {"function", jinja::Value::Dict(std::move(fn))}})});
    ChatMessage call{"assistant", "", true, {{"tool_calls", calls}}};
    const ChatMessage with_call[] = {{"user", "Hello"}, call};
    if (!t.RenderJinja(with_call, false, {}).ok()) {
      t.null_content_as_empty_ = true;
      if (!t.RenderJinja(with_call, false, {}).ok()) t.null_content_as_empty_ = false;  // fails either way: as it is
    }
  }
  if (!r.ok()) {
    return InvalidArgument(fmt::format("{} (on a probe conversation; or pass --chat-template NAME|FILE; names: {})",
                                       r.status().message(), KnownNames()));
  }
  return t;
}

Result<std::vector<PromptSegment>> ChatTemplate::RenderJinja(std::span<const ChatMessage> messages,
                                                             bool add_generation_prompt,
                                                             const ChatVars& chat_vars) const {
  jinja::ValueList list;
  for (const ChatMessage& m : messages) {
    // Only the content and the extras are the user's: the role is one of the checked names.
    jinja::ValueDict d = {{"role", jinja::Value::Str(m.role)},
                          {"content", m.content_null && !null_content_as_empty_ ? jinja::Value::None()
                                                                                : jinja::Value::Str(m.content, true)}};
    for (const auto& kv : m.extra) {
      if (kv.first != "role" && kv.first != "content") d.push_back(kv);
    }
    list.push_back(jinja::Value::Dict(std::move(d)));
  }
  auto tok = [](const std::string& s) { return s.empty() ? jinja::Value::None() : jinja::Value::Str(s); };
  const jinja::ValueDict& kwargs = chat_vars.kwargs;
  jinja::ValueDict vars = {{"messages", jinja::Value::List(std::move(list))},
                           {"tools", HasTools(chat_vars.tools) ? chat_vars.tools : jinja::Value::None()},
                           {"add_generation_prompt", jinja::Value::Bool(add_generation_prompt)},
                           {"bos_token", tok(tokens_.bos)},
                           {"eos_token", tok(tokens_.eos)}};
  // The API refuses kwargs that would replace these (api_chat.cc); skip any here all the same.
  for (const auto& kv : kwargs) {
    if (std::none_of(vars.begin(), vars.begin() + 5, [&](const auto& e) { return e.first == kv.first; })) vars.push_back(kv);
  }
  const jinja::Value globals = jinja::Value::Dict(std::move(vars));
  TRELLIS_ASSIGN_OR_RETURN(std::vector<jinja::Piece> pieces, jinja_->Render(globals));
  std::vector<PromptSegment> segs;
  for (jinja::Piece& p : pieces) {
    if (p.text.empty()) continue;
    if (!segs.empty() && segs.back().special == !p.input) {
      segs.back().text += p.text;
    } else {
      segs.push_back({std::move(p.text), !p.input});
    }
  }
  return segs;
}

std::string_view ChatTemplate::name() const {
  if (family_ == TemplateFamily::kJinja) return "jinja (the model's own template)";
  for (const NamedFamily& f : kFamilies) {
    if (f.family == family_) return f.name;
  }
  return "?";
}

Result<std::vector<PromptSegment>> ChatTemplate::RenderSegments(std::span<const ChatMessage> messages,
                                                                bool add_generation_prompt,
                                                                const ChatVars& vars) const {
  std::vector<ChatMessage> polyfilled;
  if (NeedsPolyfill(*this, messages, vars.tools)) {
    polyfilled = PolyfillTools(*this, messages, vars.tools);
    messages = polyfilled;
  }
  TRELLIS_RETURN_IF_ERROR(CheckRoles(messages));
  for (const ChatMessage& m : messages) {
    if (m.role == "tool" && family_ != TemplateFamily::kJinja) {
      return InvalidArgument(fmt::format("the '{}' template has no tool role", name()));
    }
  }
  const jinja::ValueDict& kwargs = vars.kwargs;
  if (!kwargs.empty() && family_ != TemplateFamily::kJinja) {
    return InvalidArgument(fmt::format("chat_template_kwargs need the model's own chat template; the '{}' template "
                                       "takes none", name()));
  }
  switch (family_) {
    case TemplateFamily::kLlama2: return RenderLlama2(messages, tokens_);
    case TemplateFamily::kLlama3: return RenderLlama3(messages, add_generation_prompt, tokens_, false);
    case TemplateFamily::kLlama31: return RenderLlama3(messages, add_generation_prompt, tokens_, true);
    case TemplateFamily::kMistral:
      TRELLIS_RETURN_IF_ERROR(CheckAlternating(messages, true));
      return RenderMistral(messages, tokens_);
    case TemplateFamily::kMistralNemo:
      TRELLIS_RETURN_IF_ERROR(CheckAlternating(messages, true));
      return RenderMistralNemo(messages, tokens_);
    case TemplateFamily::kChatMl: return RenderChatMl(messages, add_generation_prompt, default_system_);
    case TemplateFamily::kZephyr: return RenderZephyr(messages, add_generation_prompt, tokens_);
    case TemplateFamily::kPhi3: return RenderPhi3(messages, add_generation_prompt, tokens_);
    case TemplateFamily::kJinja: return RenderJinja(messages, add_generation_prompt, vars);
  }
  return Internal("unhandled template family");
}

Result<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                         const ChatVars& vars) const {
  TRELLIS_ASSIGN_OR_RETURN(std::vector<PromptSegment> segs, RenderSegments(messages, add_generation_prompt, vars));
  return JoinSegments(segs);
}

std::string JoinSegments(std::span<const PromptSegment> segments) {
  std::string out;
  for (const PromptSegment& s : segments) out += s.text;
  return out;
}

std::vector<int32_t> EncodeSegments(const Tokenizer& tok, std::span<const PromptSegment> segments, bool add_bos) {
  std::string text;
  std::vector<ByteRange> special;
  for (const PromptSegment& s : segments) {
    if (s.special && !s.text.empty()) special.push_back({text.size(), text.size() + s.text.size()});
    text += s.text;
  }
  return tok.EncodeWithSpecialRanges(text, add_bos, special);
}

Result<std::vector<int32_t>> EncodeChat(const ChatTemplate& tmpl, const Tokenizer& tok,
                                        std::span<const ChatMessage> messages, bool add_generation_prompt,
                                        const ChatVars& vars, std::string* prompt_text) {
  TRELLIS_ASSIGN_OR_RETURN(std::vector<PromptSegment> segs, tmpl.RenderSegments(messages, add_generation_prompt, vars));
  if (prompt_text) *prompt_text = JoinSegments(segs);
  // Templates that spell out bos_token (llama2/3, mistral) must not get a second one.
  const std::string& bos = tmpl.tokens().bos;
  const bool has_bos = !bos.empty() && !segs.empty() && segs[0].special && segs[0].text.starts_with(bos);
  return EncodeSegments(tok, segs, tok.add_bos() && !has_bos);
}

}  // namespace trellis::server

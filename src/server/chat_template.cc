#include "server/chat_template.h"

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
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return InvalidArgument("unsupported message role '" + m.role + "' (system, user, assistant)");
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

std::string RenderLlama2(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  std::string out;
  std::span<const ChatMessage> loop = msgs;
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    loop = msgs.subspan(1);
  }
  for (size_t i = 0; i < loop.size(); ++i) {
    std::string content = loop[i].content;
    if (i == 0 && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (loop[i].role == "user") {
      out += t.bos + "[INST] " + Trim(content) + " [/INST]";
    } else if (loop[i].role == "assistant") {
      out += " " + Trim(content) + " " + t.eos;
    }
  }
  return out;
}

std::string RenderLlama3(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t, bool v31) {
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out += "<|start_header_id|>";
    out += role;
    out += "<|end_header_id|>\n\n";
    out += Trim(content);
    out += "<|eot_id|>";
  };
  if (v31) {
    std::span<const ChatMessage> loop = msgs;
    std::string system;
    if (!msgs.empty() && msgs[0].role == "system") {
      system = Trim(msgs[0].content);
      loop = msgs.subspan(1);
    }
    out += t.bos;
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
    out += system;
    out += "<|eot_id|>";
    for (const ChatMessage& m : loop) turn(m.role, m.content);
  } else {
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (i == 0) out += t.bos;
      turn(msgs[i].role, msgs[i].content);
    }
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string RenderMistral(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  // v0.1 raises on a system message; like llama.cpp we fold it into the first user turn.
  std::string out = t.bos;
  std::string system;
  std::span<const ChatMessage> loop = msgs;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    loop = msgs.subspan(1);
  }
  for (size_t i = 0; i < loop.size(); ++i) {
    if (loop[i].role == "user") {
      out += "[INST] " + (i == 0 && !system.empty() ? system + "\n\n" : std::string()) + loop[i].content + " [/INST]";
    } else {
      out += loop[i].content + t.eos;
    }
  }
  return out;
}

std::string RenderMistralNemo(std::span<const ChatMessage> msgs, const TemplateTokens& t) {
  std::string out = t.bos;
  std::span<const ChatMessage> loop = msgs;
  const bool has_system = !msgs.empty() && msgs[0].role == "system";
  if (has_system) loop = msgs.subspan(1);
  for (size_t i = 0; i < loop.size(); ++i) {
    if (loop[i].role == "user") {
      if (i + 1 == loop.size() && has_system) {
        out += "[INST]" + msgs[0].content + "\n\n" + loop[i].content + "[/INST]";
      } else {
        out += "[INST]" + loop[i].content + "[/INST]";
      }
    } else {
      out += loop[i].content + t.eos;
    }
  }
  return out;
}

std::string RenderChatMl(std::span<const ChatMessage> msgs, bool gen, const std::string& default_system) {
  std::string out;
  if (!default_system.empty() && (msgs.empty() || msgs[0].role != "system")) {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string RenderZephyr(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    out += "<|" + msgs[i].role + "|>\n" + msgs[i].content + t.eos + "\n";
    if (i + 1 == msgs.size() && gen) out += "<|assistant|>\n";
  }
  return out;
}

std::string RenderPhi3(std::span<const ChatMessage> msgs, bool gen, const TemplateTokens& t) {
  std::string out;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
  }
  out += gen ? "<|assistant|>\n" : t.eos;
  return out;
}

}  // namespace

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

std::string_view ChatTemplate::name() const {
  for (const NamedFamily& f : kFamilies) {
    if (f.family == family_) return f.name;
  }
  return "?";
}

Result<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  TRELLIS_RETURN_IF_ERROR(CheckRoles(messages));
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
  }
  return Internal("unhandled template family");
}

}  // namespace trellis::server

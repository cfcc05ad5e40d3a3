// ChatTemplate: turns a list of chat messages into the prompt text a model was trained on.
//
// A model's own `tokenizer.chat_template` is run by the Jinja interpreter (jinja/jinja.h):
// FromJinja parses it and renders a probe conversation at start-up, so a template it
// cannot handle fails there, with the template's line and the construct, before any
// request. Rendering is what Hugging Face's apply_chat_template gives (golden strings:
// tests/data/templates/golden.json).
//
// Hand-written renderers of the common families remain, chosen by name (--chat-template
// NAME, or for a model without a template): each produces exactly what the family's
// Jinja produces (HF rendering: trim_blocks and lstrip_blocks on, no tools). Detect
// recognizes a family from marker strings in a template's text:
//
//   llama2      <s>[INST] <<SYS>>\n{sys}\n<</SYS>>\n\n{user} [/INST] {asst} </s>
//   llama3      <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>
//   llama3.1    llama3 plus the mandatory system header with the knowledge/today dates
//   mistral     <s>[INST] {user} [/INST]{asst}</s>   (v0.1/v0.2; no system block)
//   mistral-nemo <s>[INST]{user}[/INST]{asst}</s>   (v3-tekken; system before the last user)
//   chatml      <|im_start|>{role}\n{content}<|im_end|>\n  (a default system prompt in the
//               template, as Qwen 2.5's, is used when the first message is not a system)
//   zephyr      <|{role}|>\n{content}</s>\n           (TinyLlama-Chat, Zephyr)
//   phi3        <|{role}|>\n{content}<|end|>\n
//
// Anything else is an error naming the families, so an unknown template never produces
// a garbage prompt. See docs/server.md.
//
// Special-token injection: RenderSegments marks which text the template wrote (markers,
// role headers, bos/eos: special) and which came from messages (content). EncodeChat /
// EncodeSegments let control-token texts become control tokens only in the template's
// text, so a user writing "</s>" or "<|im_start|>" in a message gets those characters,
// not a forged turn. Benign prompts tokenize exactly as the rendered text with
// parse_special did (Tokenizer::EncodeWithSpecialRanges).
//
// Thread safety: immutable after construction; Render may be called concurrently.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/jinja.h"
#include "model/tokenizer.h"
#include "util/status.h"

namespace trellis::server {

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c, bool null = false, jinja::ValueDict x = {})
      : role(std::move(r)), content(std::move(c)), content_null(null), extra(std::move(x)) {}
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;
  bool content_null = false;  // "content": null (an assistant turn holding only tool calls)
  // The rest of the message as the client sent it, in its key order, for the model's own
  // template (Hugging Face hands the message dict over whole): tool_calls (arguments as
  // objects), tool_call_id, name, reasoning_content, ... Strings are input.
  jinja::ValueDict extra;
};

// What a conversation gives the template besides its messages.
struct ChatVars {
  ChatVars() = default;
  ChatVars(jinja::ValueDict kw) : kwargs(std::move(kw)) {}  // NOLINT: implicit by design
  // chat_template_kwargs (enable_thinking, ...), as apply_chat_template(**kwargs) passes them.
  jinja::ValueDict kwargs;
  // The request's tools: a list of {"type": "function", "function": {...}} dicts in the
  // client's key order (strings are input); undefined or an empty list: none.
  jinja::Value tools;
};

// A piece of a rendered prompt: written by the template (special = true: markers, role
// headers, bos/eos, a template's default system prompt) or taken from a message's
// content (special = false). Adjacent segments differ in `special`; none is empty.
struct PromptSegment {
  std::string text;
  bool special = false;
};

enum class TemplateFamily { kLlama2, kLlama3, kLlama31, kMistral, kMistralNemo, kChatMl, kZephyr, kPhi3, kJinja };

// The special-token texts a template refers to (bos_token, eos_token).
struct TemplateTokens {
  std::string bos = "<s>";
  std::string eos = "</s>";
};

class ChatTemplate {
 public:
  // By name: llama2, llama3, llama3.1, mistral, mistral-nemo, chatml, zephyr, phi3.
  static Result<ChatTemplate> FromName(std::string_view name, TemplateTokens tokens);
  // Recognizes the family of a Jinja template's text. InvalidArgument for an unknown one.
  static Result<ChatTemplate> Detect(std::string_view jinja, TemplateTokens tokens);
  // Runs the template itself (jinja/jinja.h). InvalidArgument naming the line and the
  // construct when it does not parse, or when it fails on the probe conversation (user,
  // assistant, user; and with a system message first unless the template refuses system
  // messages).
  static Result<ChatTemplate> FromJinja(std::string_view source, TemplateTokens tokens);
  // The names FromName accepts, comma separated.
  static std::string KnownNames();

  // The prompt for `messages`. InvalidArgument for roles other than system, user,
  // assistant and tool, and where the template itself raises (mistral: roles must
  // alternate). vars.kwargs: more template variables; only the model's own (Jinja) template
  // takes them, the named families refuse non-empty ones. vars.tools and the messages'
  // tool calls and results: a template that renders them itself (it names `tools`,
  // `tool_calls`, the tool role) gets them as Hugging Face passes them; for one that does
  // not, and for the named families, they are written into the conversation as text
  // (PolyfillTools) in the generic tool-call syntax (tool_calls.h).
  Result<std::string> Render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                             const ChatVars& vars = {}) const;
  // The same prompt as segments: JoinSegments(RenderSegments(m, g)) == Render(m, g). Same
  // errors as Render.
  Result<std::vector<PromptSegment>> RenderSegments(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                                    const ChatVars& vars = {}) const;

  // Whether the template renders tool definitions / assistant tool calls / tool-role
  // results itself (false for the named families).
  bool renders_tools() const { return renders_tools_; }
  bool renders_tool_calls() const { return renders_tool_calls_; }
  bool renders_tool_role() const { return renders_tool_role_; }
  // Whether the template reads the tool definitions from the system message's own `tools`
  // field (a JSON string), not from the `tools` variable (Phi-4-mini's: <|system|>...
  // <|tool|>[...]<|/tool|>). Render puts them there: on the first system message, or on
  // an empty one added first; assistant tool calls it does not render are written in its
  // family's <|tool_call|>[...]<|/tool_call|> syntax.
  bool tools_on_system() const { return tools_on_system_; }
  // Whether the template takes a system message (Gemma's raises on one).
  bool takes_system() const { return takes_system_; }
  // Whether a null content (an assistant turn of only tool calls) is rendered as "":
  // true for templates that fail on null and render with "" (Qwen3's), probed at start.
  bool null_content_as_empty() const { return null_content_as_empty_; }
  // The template's source (empty for the named families).
  const std::string& source() const { return source_; }

  // Whether the template writes <think> ... </think> reasoning blocks (Qwen3, the R1
  // distills, SmolLM3): the answer's reasoning is then split off (docs/server.md).
  bool thinks() const { return thinks_; }

  TemplateFamily family() const { return family_; }
  std::string_view name() const;
  const TemplateTokens& tokens() const { return tokens_; }

 private:
  ChatTemplate(TemplateFamily f, TemplateTokens t) : family_(f), tokens_(std::move(t)) {}
  Result<std::vector<PromptSegment>> RenderJinja(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                                 const ChatVars& vars) const;

  TemplateFamily family_;
  TemplateTokens tokens_;
  std::shared_ptr<const jinja::Template> jinja_;  // kJinja
  std::string default_system_;  // chatml: rendered when messages[0] is not a system message
  bool thinks_ = false;
  bool renders_tools_ = false, renders_tool_calls_ = false, renders_tool_role_ = false, takes_system_ = true;
  bool tools_on_system_ = false;
  bool null_content_as_empty_ = false;  // null contents are rendered as "" (the template fails on null)
  std::string source_;
};

// For a template that cannot render tools: `messages` with the tool definitions written
// into the system message (one is added first if there is none), assistant tool calls
// written as the generic syntax's JSON in their content (Phi-4-mini's syntax for a
// tools_on_system template), and tool results as user messages holding
// {"tool_response": {...}} JSON. Each step only where the template lacks it
// (renders_tools / renders_tool_calls / renders_tool_role); for a tools_on_system
// template, the definitions go into the system message's `tools` field instead.
std::vector<ChatMessage> PolyfillTools(const ChatTemplate& tmpl, std::span<const ChatMessage> messages,
                                       const jinja::Value& tools);

// The texts of `segments`, concatenated.
std::string JoinSegments(std::span<const PromptSegment> segments);

// Token ids of the joined segments: control-token texts are recognized in special
// segments only; content is tokenized as with parse_special=false. The whole text is
// tokenized in one pass, so boundaries between segments add no split. add_bos as
// Tokenizer::Encode.
std::vector<int32_t> EncodeSegments(const Tokenizer& tok, std::span<const PromptSegment> segments, bool add_bos);

// The prompt ids for a chat request: RenderSegments, then EncodeSegments with BOS added
// when the tokenizer wants one and the template has not written bos_token itself.
// Errors as Render (InvalidArgument: roles the template cannot render).
// prompt_text (if not null) receives the rendered text.
Result<std::vector<int32_t>> EncodeChat(const ChatTemplate& tmpl, const Tokenizer& tok,
                                        std::span<const ChatMessage> messages, bool add_generation_prompt,
                                        const ChatVars& vars = {}, std::string* prompt_text = nullptr);

}  // namespace trellis::server

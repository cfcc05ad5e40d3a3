// Tool calls in a model's answer: the syntax each family was trained to write, detected
// from its chat template, parsed into OpenAI's tool_calls.
//
//   hermes   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Qwen 2.5 / 3,
//            Hermes, SmolLM3); several blocks for parallel calls
//   llama3   {"name": "f", "parameters": {...}} as the whole answer, optionally after
//            <|python_tag|>; several separated by ";" (Llama 3.1 / 3.2 JSON tool use)
//   mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]          (Mistral Nemo)
//   phi4     <|tool_call|>[{"name": "f", "arguments": {...}}]<|/tool_call|>  (Phi-4-mini)
//   generic  {"tool_calls": [{"name": "f", "arguments": {...}}]} as the whole answer, for
//            templates with no syntax of their own (what a forced call writes)
//
// A call is a JSON object with a string "name" and an object "arguments" ("parameters"
// in llama3), or arguments given as a string holding a JSON object. Text outside the calls
// is the answer's content. A block that does not parse as a call stays content: the
// client sees what the model wrote, never a call it did not make.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trellis::server {

// s without its leading and trailing spaces, tabs and line ends.
std::string_view TrimSpace(std::string_view s);

enum class ToolCallFormat { kGeneric, kHermes, kLlama3, kMistral, kPhi4 };

ToolCallFormat DetectToolCallFormat(std::string_view template_source);
const char* ToolCallFormatName(ToolCallFormat f);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // compact JSON text of an object
};

struct ParsedAnswer {
  std::string content;  // the text outside the calls, trimmed of surrounding whitespace
  std::vector<ParsedToolCall> calls;
};

// Parses a whole answer (not a stream).
ParsedAnswer ParseToolCalls(ToolCallFormat f, std::string_view text);

// The text that opens a call in this format ("<tool_call>", "[TOOL_CALLS]", ...): where a
// lazy grammar switches on. Empty for formats whose call is the whole answer.
std::string_view ToolCallTrigger(ToolCallFormat f);

// The marker texts of a format's calls ("[TOOL_CALLS]", "<|tool_call|>", ...). Where the
// vocabulary has them as control tokens, the server renders those tokens as their text
// (StreamDecoder) and lets grammars pick them, as the model was trained to write them.
std::vector<std::string_view> ToolCallMarkers(ToolCallFormat f);

// A streamed answer that may hold calls: content is passed on until a call may have
// begun (the format's trigger; for formats whose call is the whole answer, an answer
// opening with '{' or <|python_tag|>), and held from there; text that could still be the
// start of the trigger is held until it cannot. Finish() parses what was held: its calls,
// or, when it holds none, the held text as content after all.
class ToolCallStream {
 public:
  ToolCallStream() = default;  // disabled: everything is content
  explicit ToolCallStream(ToolCallFormat f) : enabled_(true), format_(f) {}

  // Content safe to send now.
  std::string Feed(std::string_view content);
  struct End {
    std::string content;  // held text that turned out not to be calls
    std::vector<ParsedToolCall> calls;
  };
  End Finish();
  bool enabled() const { return enabled_; }

  // Streamed calls, OpenAI's way: once a held call's name is complete, a piece with its
  // index and name (`first`), then pieces of its arguments text as the model writes them.
  // For answers a grammar holds to the call syntax (the server's; tool_choice auto's
  // grammar switches on at the trigger), where every call that begins is a call. A call
  // cut off by max_tokens has streamed what was written, as OpenAI's do.
  struct CallPiece {
    size_t index = 0;
    bool first = false;   // the call's first piece: carries the name
    std::string name;     // first pieces only
    std::string arguments;  // the next bytes of the arguments' JSON text
  };
  // The pieces that Feed's text completed. After Finish, the remaining ones (an answer whose
  // calls were streamed gets no End::calls: they were all sent as pieces).
  std::vector<CallPiece> TakeCallPieces();
  // Whether any call was streamed, and whether every streamed call's arguments closed (a
  // call cut by max_tokens did not: the answer's finish_reason is then "length").
  bool streamed_calls() const { return !calls_.empty(); }
  bool streamed_calls_complete() const;

 private:
  // Scans held_ for calls: their names and arguments spans (a JSON lexer over the held
  // text; text outside JSON, like "<tool_call>", is skipped). `final`: the text is all
  // there (a cut UTF-8 sequence is sent as it is, not held back).
  void Scan(bool final = false);

  bool enabled_ = false;
  ToolCallFormat format_ = ToolCallFormat::kGeneric;
  bool holding_ = false;  // a call may have begun: everything from held_ on is kept
  std::string held_;
  struct Call {
    std::string name;
    size_t args_begin = 0, args_end = 0;  // bytes of held_; args_end grows while open
    bool args_open = false, args_closed = false;
    size_t sent = 0;  // argument bytes streamed
    bool announced = false;
  };
  std::vector<Call> calls_;
  std::vector<CallPiece> pieces_;
};

}  // namespace trellis::server

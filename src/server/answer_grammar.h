// The grammar an answer is held to, composed from what the request asks: a tool call in
// the model's own syntax around each tool's argument schema, a constrained content answer
// (response_format, ...), free text that turns into a call when the model starts one,
// and a reasoning block first for thinking models.
//
//   tool_choice required / named   the answer is one call (or several with
//                                  parallel_tool_calls) of the tools offered, each
//                                  call's arguments valid for its tool's schema
//   tool_choice auto               free text, or, from the moment the text opens a call
//                                  (the format's trigger, tool_calls.h), valid calls;
//                                  with a content constraint: a call or that content
//   no tools (or none)             the content constraint alone (none: no grammar)
//
// Free text "until the trigger" is a small automaton over the trigger's characters (the
// Knuth-Morris-Pratt states written as right-recursive rules), so text that merely
// contains the trigger's first characters stays text, and the matcher runs it in constant
// stack depth. The same construction lets a thinking model reason freely up to </think>
// before the constrained answer starts: the grammar is what llama.cpp calls lazy, without
// a second mechanism in the engine.
//
// Thread safety: pure functions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "server/tool_calls.h"
#include "util/status.h"

namespace trellis::server {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// Whether the answer starts with reasoning: none (the template does not think), optional
// (the model may open a <think> block first), open (the prompt ended inside one).
enum class ReasoningPrefix { kNone, kOptional, kOpen };

struct ToolGrammar {
  std::string name;                                  // [A-Za-z0-9_.-]+ (checked by the API)
  std::shared_ptr<const grammar::Grammar> arguments;  // its parameters schema; null: any object
};

struct AnswerSpec {
  ToolCallFormat format = ToolCallFormat::kGeneric;
  std::vector<ToolGrammar> tools;  // the tools the answer may call (a named choice: that one)
  ToolChoice choice = ToolChoice::kNone;
  bool parallel = true;            // several calls in one answer
  std::shared_ptr<const grammar::Grammar> content;  // the content answer's constraint; null: free
  ReasoningPrefix reasoning = ReasoningPrefix::kNone;
};

// The composed grammar, or null when nothing constrains the answer. InvalidArgument when
// the composition exceeds the grammar limits.
Result<std::shared_ptr<const grammar::Grammar>> BuildAnswerGrammar(const AnswerSpec& spec,
                                                                    const grammar::GrammarLimits& limits = {});

}  // namespace trellis::server

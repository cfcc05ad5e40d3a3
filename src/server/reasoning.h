// ReasoningSplitter: a thinking model's reasoning apart from its answer, in streamed text.
//
// Models whose templates write <think> ... </think> (Qwen3, the DeepSeek-R1 distills,
// SmolLM3) answer with a reasoning block first. With --reasoning-format deepseek (the
// default, as llama-server's) the block goes to message.reasoning_content /
// delta.reasoning_content and the rest to content; with `none` everything stays in
// content. The block is recognized at the start of the answer (after whitespace), or is
// already open when the prompt ends with the opening marker (templates that start the
// reasoning for the model). The whitespace right after the closing marker is dropped;
// text that could still be the start of a marker is held back until it cannot.
//
// Thread safety: a value per answer; not shared.
#pragma once

#include <string>
#include <string_view>

namespace trellis::server {

class ReasoningSplitter {
 public:
  ReasoningSplitter() = default;  // disabled: everything is content
  // keep_reasoning false: the reasoning is split off and dropped (vLLM's include_reasoning).
  ReasoningSplitter(bool enabled, bool open_in_prompt, bool keep_reasoning = true);

  struct Parts {
    std::string reasoning, content;
  };
  Parts Feed(std::string_view text) { return Keep(Split(text)); }
  Parts Flush() { return Keep(SplitRest()); }  // at the end: what was held back (an unclosed block stays reasoning)

  // The opening marker ends the prompt (after whitespace): the answer starts inside it.
  static bool PromptOpensReasoning(std::string_view prompt);

 private:
  enum class State { kOff, kStart, kReasoning, kAfterClose, kContent };
  Parts Split(std::string_view text);
  Parts SplitRest();
  Parts Keep(Parts p) const {
    if (!keep_) p.reasoning.clear();
    return p;
  }
  State state_ = State::kOff;
  bool keep_ = true;
  std::string held_;
};

}  // namespace trellis::server

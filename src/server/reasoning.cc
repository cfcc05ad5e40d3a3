#include "server/reasoning.h"

namespace trellis::server {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool IsWs(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Length of the longest suffix of s that is a proper prefix of marker.
size_t PartialSuffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool enabled, bool open_in_prompt, bool keep_reasoning)
    : state_(!enabled ? State::kOff : open_in_prompt ? State::kReasoning : State::kStart), keep_(keep_reasoning) {}

bool ReasoningSplitter::PromptOpensReasoning(std::string_view prompt) {
  size_t e = prompt.size();
  while (e > 0 && IsWs(prompt[e - 1])) --e;
  return prompt.substr(0, e).ends_with(kOpen);
}

ReasoningSplitter::Parts ReasoningSplitter::Split(std::string_view text) {
  Parts out;
  held_ += text;
  while (!held_.empty()) {
    switch (state_) {
      case State::kOff:
      case State::kContent:
        out.content += held_;
        held_.clear();
        return out;
      case State::kStart: {
        size_t b = 0;
        while (b < held_.size() && IsWs(held_[b])) ++b;
        const std::string_view rest = std::string_view(held_).substr(b);
        if (rest.starts_with(kOpen)) {
          held_.erase(0, b + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (kOpen.starts_with(rest)) return out;  // maybe the marker, not complete yet
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t at = held_.find(kClose);
        if (at != std::string::npos) {
          out.reasoning += held_.substr(0, at);
          held_.erase(0, at + kClose.size());
          state_ = State::kAfterClose;
          continue;
        }
        const size_t keep = PartialSuffix(held_, kClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::kAfterClose: {
        size_t b = 0;
        while (b < held_.size() && IsWs(held_[b])) ++b;
        held_.erase(0, b);
        if (held_.empty()) return out;
        state_ = State::kContent;
        continue;
      }
    }
  }
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::SplitRest() {
  Parts out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(held_);
  } else if (state_ != State::kAfterClose) {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace trellis::server

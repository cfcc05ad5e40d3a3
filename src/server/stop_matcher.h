// StopMatcher: finds OpenAI `stop` strings in streamed text that arrives in arbitrary
// pieces (one token's text at a time), so a stop string split across tokens is still
// found, and the stop text itself is never emitted.
//
// Push(piece) returns the text that is now safe to send: everything except a held-back
// tail that could still be the start of a stop string. Once a stop string is complete,
// stopped() is true and Push returned the text before it; later pushes return "".
// Flush() returns the held tail at the end of generation (no stop matched).
//
// Works on bytes; with complete UTF-8 input (StreamDecoder output) the held tail starts
// at a character boundary, so emitted text stays well-formed.
//
// Thread safety: one owner thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace trellis::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  std::string Push(std::string_view piece);
  std::string Flush();
  bool stopped() const { return stopped_; }
  // The stop string that matched ("" until one did): Anthropic's stop_sequence.
  const std::string& matched() const { return matched_; }
  // Bytes currently held back.
  size_t held() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace trellis::server

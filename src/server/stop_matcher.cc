#include "server/stop_matcher.h"

#include <algorithm>

namespace trellis::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::Push(std::string_view piece) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(piece);
  held_.append(piece);
  // The stop string that completes first wins (earliest end; on a tie the longer one),
  // which is what checking after every byte would give, however the text is split.
  size_t first = std::string::npos, best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < first)) {
      best_end = end;
      first = pos;
      best = &s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    matched_ = *best;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace trellis::server

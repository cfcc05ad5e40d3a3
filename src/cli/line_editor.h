// LineEditor: reads one line at a time from a terminal with editing and history, or plain
// lines from a pipe.
//
// On a terminal it switches to raw mode for the duration of a Read (restoring the
// settings before it returns, so output between reads and Ctrl-C during generation
// behave normally) and handles: printable text (UTF-8), Left/Right, Home/End (also
// Ctrl-A / Ctrl-E), Backspace, Delete, Ctrl-U / Ctrl-K (kill before / after the cursor),
// Up/Down (history), Enter, Ctrl-C (discard the line), Ctrl-D (end, on an empty line).
// Elsewhere (a pipe, a file) it reads lines with no echo or prompt.
//
// Thread safety: one thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace trellis::cli {

class LineEditor {
 public:
  LineEditor();
  ~LineEditor();
  LineEditor(const LineEditor&) = delete;
  LineEditor& operator=(const LineEditor&) = delete;

  // The next line without its newline; nullopt at end of input (Ctrl-D on an empty line,
  // end of file). A line discarded with Ctrl-C comes back as "" (the caller asks again).
  std::optional<std::string> Read(const std::string& prompt);
  bool interactive() const { return tty_; }

  // Longest accepted line, bytes (the rest of a longer line is dropped).
  static constexpr size_t kMaxLine = 64 * 1024;

 private:
  std::optional<std::string> ReadPlain();
  void Redraw(const std::string& prompt, const std::string& line, size_t cursor) const;

  bool tty_ = false;
  std::vector<std::string> history_;
};

}  // namespace trellis::cli

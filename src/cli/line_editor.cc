#include "cli/line_editor.h"

#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace trellis::cli {
namespace {

// Raw mode for one Read; restored by the destructor whatever happens.
class RawMode {
 public:
  RawMode() {
    ok_ = tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (!ok_) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ECHO | ICANON | ISIG | IEXTEN);
    raw.c_iflag &= ~static_cast<tcflag_t>(IXON | ICRNL);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    ok_ = tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) == 0;
  }
  ~RawMode() {
    if (ok_) tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_);
  }
  bool ok() const { return ok_; }

 private:
  termios saved_{};
  bool ok_ = false;
};

bool ReadByte(unsigned char* c) {
  for (;;) {
    const ssize_t n = read(STDIN_FILENO, c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

void Write(const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(STDOUT_FILENO, s.data() + off, s.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

bool IsContinuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Codepoints in s[from, to).
size_t Codepoints(const std::string& s, size_t from, size_t to) {
  size_t n = 0;
  for (size_t i = from; i < to; ++i) n += !IsContinuation(s[i]);
  return n;
}

size_t PrevChar(const std::string& s, size_t i) {
  if (i == 0) return 0;
  --i;
  while (i > 0 && IsContinuation(s[i])) --i;
  return i;
}

size_t NextChar(const std::string& s, size_t i) {
  if (i >= s.size()) return s.size();
  ++i;
  while (i < s.size() && IsContinuation(s[i])) ++i;
  return i;
}

}  // namespace

LineEditor::LineEditor() : tty_(isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1) {}
LineEditor::~LineEditor() = default;

std::optional<std::string> LineEditor::ReadPlain() {
  std::string line;
  if (!std::getline(std::cin, line)) return std::nullopt;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.size() > kMaxLine) line.resize(kMaxLine);
  return line;
}

void LineEditor::Redraw(const std::string& prompt, const std::string& line, size_t cursor) const {
  std::string s = "\r" + prompt + line + "\x1b[K";
  const size_t back = Codepoints(line, cursor, line.size());
  if (back > 0) s += "\x1b[" + std::to_string(back) + "D";
  Write(s);
}

std::optional<std::string> LineEditor::Read(const std::string& prompt) {
  if (!tty_) return ReadPlain();
  std::fflush(stdout);
  RawMode raw;
  if (!raw.ok()) return ReadPlain();
  std::string line;
  size_t cursor = 0;              // byte offset, on a character boundary
  size_t hist = history_.size();  // history_.size(): the line being edited
  std::string edited;             // the line being edited while browsing history
  Write(prompt);
  for (;;) {
    unsigned char c;
    if (!ReadByte(&c)) {
      Write("\r\n");
      return std::nullopt;
    }
    if (c == '\r' || c == '\n') {
      Write("\r\n");
      if (!line.empty() && (history_.empty() || history_.back() != line)) history_.push_back(line);
      return line;
    }
    if (c == 3) {  // Ctrl-C: discard the line
      Write("^C\r\n");
      return std::string();
    }
    if (c == 4) {  // Ctrl-D: end on an empty line, else delete under the cursor
      if (line.empty()) {
        Write("\r\n");
        return std::nullopt;
      }
      if (cursor < line.size()) line.erase(cursor, NextChar(line, cursor) - cursor);
    } else if (c == 127 || c == 8) {  // Backspace
      if (cursor > 0) {
        const size_t p = PrevChar(line, cursor);
        line.erase(p, cursor - p);
        cursor = p;
      }
    } else if (c == 1) {
      cursor = 0;
    } else if (c == 5) {
      cursor = line.size();
    } else if (c == 21) {  // Ctrl-U
      line.erase(0, cursor);
      cursor = 0;
    } else if (c == 11) {  // Ctrl-K
      line.erase(cursor);
    } else if (c == 27) {  // escape sequences: ESC [ X, ESC [ n ~, ESC O X
      unsigned char a = 0, b = 0;
      if (!ReadByte(&a) || !ReadByte(&b)) continue;
      if (a == '[' && b >= '0' && b <= '9') {
        unsigned char t = 0;
        if (!ReadByte(&t)) continue;
        if (b == '3' && t == '~' && cursor < line.size()) line.erase(cursor, NextChar(line, cursor) - cursor);
        if ((b == '1' || b == '7') && t == '~') cursor = 0;
        if ((b == '4' || b == '8') && t == '~') cursor = line.size();
      } else if (a == '[' || a == 'O') {
        if (b == 'D') cursor = PrevChar(line, cursor);
        if (b == 'C') cursor = NextChar(line, cursor);
        if (b == 'H') cursor = 0;
        if (b == 'F') cursor = line.size();
        if ((b == 'A' && hist > 0) || (b == 'B' && hist < history_.size())) {
          if (hist == history_.size()) edited = line;
          hist += b == 'A' ? -1 : 1;
          line = hist == history_.size() ? edited : history_[hist];
          cursor = line.size();
        }
      }
    } else if (c >= 32 && line.size() < kMaxLine) {
      // A UTF-8 character: its lead byte and continuation bytes go in together.
      std::string ch(1, static_cast<char>(c));
      const int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
      for (int i = 0; i < more; ++i) {
        unsigned char x;
        if (!ReadByte(&x)) break;
        ch += static_cast<char>(x);
      }
      line.insert(cursor, ch);
      cursor += ch.size();
    }
    Redraw(prompt, line, cursor);
  }
}

}  // namespace trellis::cli

// Hand-written pre-tokenizer regexes for byte-level BPE (no regex engine handles \p{L}).
//
// GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//         | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// qwen2:  llama3's with \p{N} for \p{N}{1,3}: every digit is a word of its own.
//
// Both scan left to right trying the alternatives in order, as a backtracking regex engine
// would, and follow llama.cpp's unicode_regex_split_custom_{gpt2,llama3} decision for
// decision (including how a lone trailing space is grouped), since token ids must match.
// Each codepoint is examined a bounded number of times, so the split is linear.

#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace trellis::tokenizer_internal {
namespace {

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;
constexpr uint16_t kLNW = kUnicodeLetter | kUnicodeNumber | kUnicodeWhitespace;

// Cursor over one text run: codepoint / flags lookups that are "nothing" past the end,
// and the list of word lengths being built.
class Splitter {
 public:
  explicit Splitter(const std::vector<uint32_t>& cpts) : cpts_(cpts) {
    words_.reserve(cpts.size() / 3 + 1);
  }

  size_t size() const { return cpts_.size(); }
  uint32_t Cpt(size_t pos) const { return pos < cpts_.size() ? cpts_[pos] : kOutOfRange; }
  // 0 past the end; never 0 inside (every codepoint has a category).
  uint16_t Flags(size_t pos) const { return pos < cpts_.size() ? CodepointFlags(cpts_[pos]) : 0; }

  // Ends the current word at `end` (no-op if empty).
  void Emit(size_t end) {
    if (end > word_start_) words_.push_back(end - word_start_);
    word_start_ = end;
  }

  std::vector<size_t> Take() { return std::move(words_); }

 private:
  const std::vector<uint32_t>& cpts_;
  std::vector<size_t> words_;
  size_t word_start_ = 0;
};

uint32_t AsciiLower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// Length of an English contraction ('s 't 'm 'd = 2, 're 've 'll = 3) at pos, else 0.
// `fold`: case-insensitive (llama3). Only ASCII letters lower-case to these, so an ASCII
// fold is the full Unicode fold here.
size_t Contraction(const Splitter& s, size_t pos, bool fold) {
  if (s.Cpt(pos) != '\'' || pos + 1 >= s.size()) return 0;
  const uint32_t c1 = fold ? AsciiLower(s.Cpt(pos + 1)) : s.Cpt(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= s.size()) return 0;
  const uint32_t c2 = fold ? AsciiLower(s.Cpt(pos + 2)) : s.Cpt(pos + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

bool IsCrLf(uint32_t c) { return c == '\r' || c == '\n'; }

}  // namespace

std::vector<size_t> SplitGpt2(const std::vector<uint32_t>& cpts) {
  Splitter s(cpts);
  size_t pos = 0;
  while (pos < s.size()) {
    const uint32_t c = s.Cpt(pos);
    if (size_t len = Contraction(s, pos, /*fold=*/false)) {
      pos += len;
      s.Emit(pos);
      continue;
    }
    // " ?X+" for X in {letter, number, other}: an optional leading space joins the run.
    const bool space = c == ' ';
    const uint16_t f = s.Flags(pos + (space ? 1 : 0));
    uint16_t run_class = 0;  // which single-class run starts here, if any
    if (f & kUnicodeLetter) {
      run_class = kUnicodeLetter;
    } else if (f & kUnicodeNumber) {
      run_class = kUnicodeNumber;
    }
    if (run_class != 0) {
      pos += space ? 1 : 0;
      do ++pos;
      while (s.Flags(pos) & run_class);
      s.Emit(pos);
      continue;
    }
    if (f != 0 && !(f & kLNW)) {  // ?[^\s\p{L}\p{N}]+
      pos += space ? 1 : 0;
      uint16_t g;
      do g = s.Flags(++pos);
      while (g != 0 && !(g & kLNW));
      s.Emit(pos);
      continue;
    }
    size_t n_ws = 0;
    while (s.Flags(pos + n_ws) & kUnicodeWhitespace) ++n_ws;
    if (n_ws > 1 && pos + n_ws < s.size()) {  // \s+(?!\S): leave the last space to the next word
      pos += n_ws - 1;
    } else if (n_ws > 0) {  // \s+
      pos += n_ws;
    } else {
      ++pos;  // nothing matched (cannot happen for in-range codepoints); take one
    }
    s.Emit(pos);
  }
  return s.Take();
}

std::vector<size_t> SplitLlama3(const std::vector<uint32_t>& cpts, size_t max_digits) {
  Splitter s(cpts);
  size_t pos = 0;
  while (pos < s.size()) {
    const uint32_t c = s.Cpt(pos);
    const uint16_t f = s.Flags(pos);
    if (size_t len = Contraction(s, pos, /*fold=*/true)) {
      pos += len;
      s.Emit(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!IsCrLf(c) && !(f & kUnicodeNumber) &&
        ((f & kUnicodeLetter) || (s.Flags(pos + 1) & kUnicodeLetter))) {
      ++pos;
      while (s.Flags(pos) & kUnicodeLetter) ++pos;
      s.Emit(pos);
      continue;
    }
    // \p{N}{1,3} (llama3), \p{N} (qwen2)
    if (f & kUnicodeNumber) {
      size_t group_start = pos;
      while (s.Flags(pos) & kUnicodeNumber) {
        ++pos;
        if (pos - group_start >= max_digits) {
          s.Emit(pos);
          group_start = pos;
        }
      }
      s.Emit(pos);
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*   (a space at the very end also lands here, alone)
    const bool space = c == ' ';
    uint16_t g = space ? s.Flags(pos + 1) : f;
    if (!(g & kLNW)) {
      pos += space ? 1 : 0;
      while (g != 0 && !(g & kLNW)) g = s.Flags(++pos);
      while (IsCrLf(s.Cpt(pos))) ++pos;
      s.Emit(pos);
      continue;
    }
    size_t n_ws = 0;
    size_t after_last_crlf = 0;
    while (s.Flags(pos + n_ws) & kUnicodeWhitespace) {
      if (IsCrLf(s.Cpt(pos + n_ws))) after_last_crlf = pos + n_ws + 1;
      ++n_ws;
    }
    if (after_last_crlf > 0) {  // \s*[\r\n]+
      pos = after_last_crlf;
    } else if (n_ws > 1 && pos + n_ws < s.size()) {  // \s+(?!\S)
      pos += n_ws - 1;
    } else if (n_ws > 0) {  // \s+
      pos += n_ws;
    } else {
      ++pos;
    }
    s.Emit(pos);
  }
  return s.Take();
}

}  // namespace trellis::tokenizer_internal

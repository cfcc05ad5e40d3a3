// SentencePiece-style tokenization (llama.cpp's llm_tokenizer_spm).
//
// The run is escaped (' ' -> U+2581, optionally prefixed by one), cut into UTF-8
// characters (by lead-byte length, unvalidated, like llama.cpp), and every adjacent pair
// whose concatenation is a vocab token is queued by that token's score. The best pair
// (highest score, leftmost on ties) is merged and the new neighbours queued, until no pair
// is left. Each final symbol is its token, or byte-fallback tokens <0xXX> if it has none.
// Queue entries are validated lazily: a merged-away or grown symbol invalidates them.
// O(n log n) in the run length.

#include <algorithm>
#include <queue>

#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace trellis::tokenizer_internal {
namespace {

constexpr std::string_view kSpaceEscape = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

struct SpmSymbol {
  int32_t prev;
  int32_t next;  // -1 at the ends
  uint32_t offset;
  uint32_t len;  // bytes; 0 once merged into its left neighbour
};

struct SpmCandidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t len;  // left.len + right.len when queued
};

// std::priority_queue pops the "largest": highest score first, then the smallest left index.
struct SpmCandidateLess {
  bool operator()(const SpmCandidate& a, const SpmCandidate& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

std::string EscapeSpaces(std::string_view text, bool prefix_space) {
  std::string out;
  out.reserve(text.size() + text.size() / 4 + kSpaceEscape.size());
  if (prefix_space) out.append(kSpaceEscape);
  for (char ch : text) {
    if (ch == ' ') {
      out.append(kSpaceEscape);
    } else {
      out.push_back(ch);
    }
  }
  return out;
}

}  // namespace

void EncodeSpm(const Vocab& vocab, std::string_view raw, bool prefix_space,
               std::vector<int32_t>* out) {
  const std::string text = EscapeSpaces(raw, prefix_space);
  if (text.empty()) return;
  const std::string_view view(text);

  std::vector<SpmSymbol> symbols;
  symbols.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(Utf8LenFromLead(static_cast<uint8_t>(text[off])), text.size() - off);
    const int32_t index = static_cast<int32_t>(symbols.size());
    off += len;
    symbols.push_back(SpmSymbol{index - 1, off == text.size() ? -1 : index + 1,
                             static_cast<uint32_t>(off - len), static_cast<uint32_t>(len)});
  }

  std::vector<SpmCandidate> storage;
  storage.reserve(symbols.size());
  std::priority_queue<SpmCandidate, std::vector<SpmCandidate>, SpmCandidateLess> queue(SpmCandidateLess{},
                                                                              std::move(storage));
  const auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const SpmSymbol& l = symbols[left];
    const SpmSymbol& r = symbols[right];
    auto it = vocab.token_to_id.find(view.substr(l.offset, l.len + r.len));
    if (it == vocab.token_to_id.end()) return;
    queue.push(SpmCandidate{vocab.tokens[it->second].score, left, right, l.len + r.len});
  };

  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);

  while (!queue.empty()) {
    const SpmCandidate c = queue.top();
    queue.pop();
    SpmSymbol& l = symbols[c.left];
    SpmSymbol& r = symbols[c.right];
    // Stale if either side was merged away or has grown since it was queued (lengths only
    // grow, so an unchanged sum means both are unchanged).
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    try_pair(l.prev, c.left);
    try_pair(c.left, l.next);
  }

  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const SpmSymbol& sym = symbols[i];
    const std::string_view piece = view.substr(sym.offset, sym.len);
    // Every merged symbol is a vocab token by construction; single characters may not be.
    if (auto id = vocab.Find(piece)) {
      out->push_back(*id);
      continue;
    }
    for (char ch : piece) {
      const int32_t id = vocab.byte_tokens[static_cast<uint8_t>(ch)];
      if (id >= 0) {
        out->push_back(id);
      } else if (vocab.unk >= 0) {
        out->push_back(vocab.unk);  // vocab without byte fallback (llama.cpp would abort)
      }
    }
  }
}

}  // namespace trellis::tokenizer_internal
